"""`manifest.json`: what a preprocessed data directory holds, and the helpers to find its parts.

Why a manifest: training and generation must find the dictionaries, the subword model and the
shards of a data directory without guessing from file names, check that nothing was corrupted,
and refuse a directory that an interrupted run left behind. The manifest is written last, so its
presence (with `"complete": true`) is what marks a directory as complete. Schema: docs/formats.md.

Entry points for other modules:
    load_manifest(data_dir)                -> dict (UserError if absent/incomplete/unsupported)
    load_dictionaries(data_dir)            -> (src Dictionary, tgt Dictionary), checksums checked
    dictionary_path(data_dir, lang)        -> Path of dict.LANG.txt
    subword_model_path(data_dir, lang)     -> Path of the model file, or None for `--bpe none`
    verify_files(data_dir)                 -> check the sha256 of every file (UserError naming it),
                                              once per file and process
    check_entries(manifest, where)         -> the types of the entries above, and a multilingual
                                              directory's `multilingual` entry (load_manifest calls it;
                                              an export's nmtkit.json has a copy of them)
Every reader checks what it reads: load_dictionaries, nmtkit.data.shards.load_split and
nmtkit.data.subwords.load_subword_model verify their files against the manifest.

The file's name and format name (`MANIFEST_NAME`, `FORMAT_NAME`) come from nmtkit.data.install,
which recognises a dataset by them, and are importable from here too; the format version is
this module's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from nmtkit.data.install import FORMAT_NAME, MANIFEST_NAME, VERIFIED_NAME, interrupted_install_hint
from nmtkit.data.languages import LANG_RE, langs_of, tag_token
from nmtkit.errors import UserError
from nmtkit.io import read_json

FORMAT_VERSION = 1
NAME_MAX_BYTES = 255  # the longest file name of the usual file systems (ext4, xfs, btrfs, APFS, NTFS)


def load_manifest(data_dir: str | os.PathLike) -> dict:
    """Read and check `DATA_DIR/manifest.json`; a missing one means an incomplete directory."""
    d = Path(data_dir)
    if not d.is_dir():
        raise UserError(f"data directory not found: {d}{interrupted_install_hint(d)}")
    p = d / MANIFEST_NAME
    if not p.is_file():
        raise UserError(
            f"{d} is not a complete nmtkit data directory (no {MANIFEST_NAME}; "
            "an interrupted 'nmtkit preprocess' never writes one): rerun nmtkit preprocess"
        )
    m = read_json(p)
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise UserError(f"{p}: not an nmtkit data manifest (format is not {FORMAT_NAME!r})")
    if m.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{p}: format version {m.get('format_version')!r} is not supported by this nmtkit "
            f"(expects {FORMAT_VERSION}); rerun nmtkit preprocess"
        )
    if m.get("complete") is not True:
        raise UserError(f"{p}: the directory is marked incomplete; rerun nmtkit preprocess")
    check_entries(m, str(p))
    return m


def check_entries(m: dict, where: str, prefix: str = "") -> None:
    """UserError (one line naming `where` and the entry) unless the entries this module's readers
    use have their types: the two languages, `files` (file name -> sha256) and, where present,
    `dictionaries` and `subword`. Every file they name must be a plain name in the directory, so
    that no manifest makes nmtkit read (or record) a file outside it. `prefix`: where the entries
    sit in `where` ("data." in an export's nmtkit.json)."""
    for key in ("source_lang", "target_lang"):  # file names and messages hold them: printable, no space
        lang = m.get(key)
        _require(isinstance(lang, str) and lang.isprintable() and lang != "" and not any(c in lang for c in " /\\"),
                 where, prefix + key, "a language name", lang)
    files = m.get("files")
    _require(isinstance(files, dict), where, prefix + "files", "an object of file names and sha256s", files)
    for name, sha in files.items():
        _require(is_file_name(name), where, prefix + "files", "keyed by file names in the directory", name)
        _require(isinstance(sha, str), where, f"{prefix}files[{name[:60]!r}]", "a sha256 (hex)", sha)
    langs = (m["source_lang"], m["target_lang"])
    if "multilingual" in m:  # every language needs its dictionary and subword model
        langs = tuple(dict.fromkeys(langs + _check_multilingual(m, where, prefix)))
    if "dictionaries" in m:
        _check_dictionaries(m["dictionaries"], langs, where, prefix + "dictionaries")
    if "subword" in m:
        _check_subword(m["subword"], langs, where, prefix + "subword")


def _check_multilingual(m: dict, where: str, prefix: str) -> tuple[str, ...]:
    """The `multilingual` entry (nmtkit.data.languages): its pairs, languages and tags agree with
    each other, with `source_lang`/`target_lang` (the first pair's) and, where the manifest has
    splits, with every split's name (`KIND.SRC-TGT`) and shards; -> its languages."""
    field = prefix + "multilingual"
    entry = m["multilingual"]
    _require(isinstance(entry, dict), where, field, "an object", entry)
    pairs = entry.get("pairs")
    _require(isinstance(pairs, list) and len(pairs) > 0 and all(_is_pair(p) for p in pairs), where,
             f"{field}.pairs", "a list of pairs SRC-TGT", pairs)
    split = [tuple(p.split("-", 1)) for p in pairs]
    _require(len(set(pairs)) == len(pairs), where, f"{field}.pairs", "a list of distinct pairs", pairs)
    first = (m["source_lang"], m["target_lang"])
    _require(split[0] == first, where, f"{prefix}source_lang/target_lang", f"the first pair's languages ({pairs[0]})",
             "-".join(first))
    langs = sorted({lang for pair in split for lang in pair})
    _require(entry.get("langs") == langs, where, f"{field}.langs", f"the pairs' languages, sorted {langs}",
             entry.get("langs"))
    tags = entry.get("tags")
    _require(isinstance(tags, dict) and all(tags.get(lang) == tag_token(lang) for lang in langs), where,
             f"{field}.tags", "an object of each language's tag >>LANG<<", tags)
    if isinstance(m.get("splits"), dict):
        _check_multilingual_splits(m["splits"], {p: pair for p, pair in zip(pairs, split)}, where, prefix + "splits")
    return tuple(langs)


def _is_pair(value: object) -> bool:
    if not isinstance(value, str):
        return False
    src, sep, tgt = value.partition("-")
    return bool(sep) and src != tgt and all(LANG_RE.match(lang) for lang in (src, tgt))


def _check_multilingual_splits(splits: dict, pairs: dict[str, tuple], where: str, field: str) -> None:
    """Each split is one pair's (`KIND.SRC-TGT`, a pair of the entry) and its shards hold that
    pair's two languages."""
    for name, entry in splits.items():
        pair = name.partition(".")[2] if isinstance(name, str) else None
        _require(pair in pairs, where, field, "keyed by KIND.SRC-TGT of the multilingual pairs", name)
        shards = entry.get("shards") if isinstance(entry, dict) else None
        _require(isinstance(shards, list), where, f"{field}[{name[:60]!r}].shards", "a list of shards", shards)
        for shard in shards:
            langs = sorted(k for k in shard if k != "sentences") if isinstance(shard, dict) else None
            _require(langs == sorted(pairs[pair]), where, f"{field}[{name[:60]!r}].shards",
                     f"shards of the languages {' and '.join(pairs[pair])}", shard)


def _check_dictionaries(entry: object, langs: tuple[str, str], where: str, field: str) -> None:
    _require(isinstance(entry, dict), where, field, "an object", entry)
    for lang in langs:
        d = entry.get(lang)
        _require(isinstance(d, dict), where, f"{field}.{lang}", "an object with the dictionary's file", d)
        _require(is_file_name(d.get("file")), where, f"{field}.{lang}.file", "a file name in the directory",
                 d.get("file"))


def _check_subword(entry: object, langs: tuple[str, str], where: str, field: str) -> None:
    _require(isinstance(entry, dict), where, field, "an object", entry)
    _require(isinstance(entry.get("kind"), str), where, f"{field}.kind", "a subword model kind", entry.get("kind"))
    kinds = entry.get("kinds", {})
    _require(isinstance(kinds, dict), where, f"{field}.kinds", "an object of languages and kinds", kinds)
    files = entry.get("files")
    _require(isinstance(files, dict), where, f"{field}.files", "an object of languages and file names", files)
    for lang in langs:
        _require(isinstance(kinds.get(lang, ""), str), where, f"{field}.kinds.{lang}", "a subword model kind",
                 kinds.get(lang))
        _require(files.get(lang) is None or is_file_name(files[lang]), where, f"{field}.files.{lang}",
                 "a file name in the directory or null", files.get(lang))


def is_file_name(value: object) -> bool:
    """True for a plain file name (a directory's own file): a non-empty string that is no path,
    printable (messages name it on one line), of at most NAME_MAX_BYTES in UTF-8 (a longer name
    is no file: stat() fails with ENAMETOOLONG)."""
    return isinstance(value, str) and value.isprintable() and value not in ("", ".", "..") \
        and not any(c in value for c in "/\\") and len(value.encode("utf-8", "replace")) <= NAME_MAX_BYTES


def _require(ok: bool, where: str, field: str, what: str, value: object) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UserError(f"{where}: {field} must be {what}, got {shown}")


def _manifest(data_dir: str | os.PathLike, manifest: dict | None) -> dict:
    return load_manifest(data_dir) if manifest is None else manifest


def _check_lang(manifest: dict, lang: str) -> None:
    langs = (manifest["source_lang"], manifest["target_lang"])
    more = langs_of(manifest)  # a multilingual directory: every language has its dictionary and model
    if lang in more:
        return
    if lang not in langs:
        have = ", ".join(more) if more else f"{langs[0]} and {langs[1]}"
        raise UserError(f"language {lang!r} is not in this data directory (it has {have})")


def _section(data_dir: str | os.PathLike, m: dict, key: str) -> dict:
    """m[key], which a hand-made manifest may lack (`check_entries` checked it where present)."""
    if key not in m:
        raise UserError(f"{Path(data_dir) / MANIFEST_NAME}: no {key!r} entry; rerun nmtkit preprocess")
    return m[key]


def dictionary_path(data_dir: str | os.PathLike, lang: str, manifest: dict | None = None) -> Path:
    m = _manifest(data_dir, manifest)
    _check_lang(m, lang)
    return Path(data_dir) / _section(data_dir, m, "dictionaries")[lang]["file"]


def load_dictionaries(data_dir: str | os.PathLike, manifest: dict | None = None):
    """(source Dictionary, target Dictionary) of a data dir, each checked against its sha256.

    A joined dictionary (two files with the same checked bytes, or one file) is one Dictionary,
    returned twice."""
    from nmtkit.data.dictionary import Dictionary

    m = _manifest(data_dir, manifest)
    out = []
    source_sha = m["files"].get(dictionary_path(data_dir, m["source_lang"], m).name)
    for lang in (m["source_lang"], m["target_lang"]):
        p = dictionary_path(data_dir, lang, m)
        if p.name in m["files"]:  # bytes first: a flipped byte is "corrupt", not a parse error
            verify_files(data_dir, m, [p.name])
        expected = m["files"].get(p.name)
        if out and expected is not None and expected == source_sha:
            out.append(out[0])  # a joined dictionary: the same bytes, parsed once (start-up)
            continue
        d = Dictionary.load(p)
        if expected is not None and d.sha256 != expected:
            raise UserError(f"{p}: checksum mismatch with {MANIFEST_NAME} (corrupt or modified file)")
        out.append(d)
    return out[0], out[1]


def subword_model_path(data_dir: str | os.PathLike, lang: str, manifest: dict | None = None) -> Path | None:
    """Path of the subword model applied to `lang`, or None when the data used `--bpe none`."""
    m = _manifest(data_dir, manifest)
    _check_lang(m, lang)
    name = _section(data_dir, m, "subword")["files"].get(lang)
    return None if name is None else Path(data_dir) / name


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# Files whose sha256 matched in this process: (real path, size, mtime_ns, inode, sha256). A file is
# hashed once per run however many readers open it (train's splits, generate's Translator, ...);
# a file rewritten since (new mtime or inode) is hashed again.
_VERIFIED: set[tuple] = set()

# A file changed within this long before the record was written may have been changed again in the
# same clock tick without a new mtime ("racy" entries, as git calls them): it is hashed anyway.
RACY_NS = 2_000_000_000


def _stat(p: Path) -> list[int]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read_record(data_dir: Path) -> tuple[dict, int]:
    """The data directory's record as written (name -> [size, mtime_ns, inode, sha256]) and the
    time it was written; ({}, 0) when there is none or it cannot be read."""
    p = data_dir / VERIFIED_NAME
    try:
        written = p.stat().st_mtime_ns
        rec = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad UTF-8 or JSON, or a huge integer
        return {}, 0
    return (rec, written) if isinstance(rec, dict) else ({}, 0)


def _verified_record(data_dir: Path) -> dict:
    """The record's entries that can be trusted: those older than the record by RACY_NS."""
    rec, written = _read_record(data_dir)
    return {k: v for k, v in rec.items()
            if isinstance(v, list) and len(v) == 4 and isinstance(v[1], int) and v[1] + RACY_NS <= written}


def remember_verified(data_dir: str | os.PathLike, files: dict[str, str]) -> None:
    """Record that `files` (name -> sha256), as they are now (size, mtime, inode), have these
    sha256s, in the data directory's VERIFIED_NAME. Best effort: a read-only data directory keeps
    no record (its files are then hashed by each run, as before)."""
    from nmtkit.io import atomic_write

    d = Path(data_dir)
    if not (d / MANIFEST_NAME).is_file():
        return  # an export directory checks its copies against its own description: no record there
    before, written = _read_record(d)
    rec = dict(before)
    for name, sha in files.items():
        try:
            rec[name] = [*_stat(d / name), sha]
        except OSError:
            rec.pop(name, None)
    now = time.time_ns()
    if rec == before and not any(written < e[1] + RACY_NS <= now for e in (rec[n] for n in files if n in rec)):
        return  # nothing new, and a record written now would trust no entry it does not already trust
    try:
        with atomic_write(d / VERIFIED_NAME, "w") as fh:
            json.dump(rec, fh, sort_keys=True)
    except OSError:
        pass


def verify_files(data_dir: str | os.PathLike, manifest: dict | None = None, names: list[str] | None = None) -> None:
    """Check the sha256 of `names` (default: every file the manifest lists) against the manifest;
    UserError on the first missing or corrupt file, naming it.

    Why a record: hashing every shard at every start grew training's start-up with the corpus
    (4 s per GB) and read the token shards before they were used. A file is hashed unless the
    data directory's record (VERIFIED_NAME: written by `preprocess`, which computed the sha256 of
    what it wrote, and by earlier checks) holds it with its current size, mtime and inode, as
    git's index does; a file rewritten or replaced since is hashed again, and so is one changed
    within RACY_NS of the record. Deleting the record makes the next run hash every file. Within
    a process each file is checked once (`_VERIFIED`)."""
    m = _manifest(data_dir, manifest)
    files = m["files"]
    d = Path(data_dir)
    record = None  # read when a file is not yet checked in this process
    hashed: dict[str, str] = {}
    for name in files if names is None else names:
        p = d / name
        if name not in files:
            raise UserError(f"{p}: not listed in {MANIFEST_NAME}")
        if not p.is_file():
            raise UserError(f"{p}: missing (listed in {MANIFEST_NAME})")
        stat = _stat(p)
        key = (os.path.realpath(p), *stat, files[name])
        if key in _VERIFIED:
            continue
        if record is None:
            record = _verified_record(d)
        if record.get(name) != [*stat, files[name]]:
            if sha256_file(p) != files[name]:
                raise UserError(f"{p}: checksum mismatch with {MANIFEST_NAME} (corrupt or modified file)")
            hashed[name] = files[name]
        _VERIFIED.add(key)
    if hashed:
        remember_verified(d, hashed)


def write_manifest(data_dir: str | os.PathLike, manifest: dict) -> None:
    """Write the manifest atomically; callers write it last, as the completion marker."""
    from nmtkit.io import atomic_write

    with atomic_write(Path(data_dir) / MANIFEST_NAME, "w") as fh:
        json.dump(manifest, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
