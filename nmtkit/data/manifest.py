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
from pathlib import Path

from nmtkit.data.install import FORMAT_NAME, MANIFEST_NAME, interrupted_install_hint
from nmtkit.errors import UserError
from nmtkit.io import read_json

FORMAT_VERSION = 1


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
    return m


def _manifest(data_dir: str | os.PathLike, manifest: dict | None) -> dict:
    return load_manifest(data_dir) if manifest is None else manifest


def _check_lang(manifest: dict, lang: str) -> None:
    langs = (manifest["source_lang"], manifest["target_lang"])
    if lang not in langs:
        raise UserError(f"language {lang!r} is not in this data directory (it has {langs[0]} and {langs[1]})")


def dictionary_path(data_dir: str | os.PathLike, lang: str, manifest: dict | None = None) -> Path:
    m = _manifest(data_dir, manifest)
    _check_lang(m, lang)
    return Path(data_dir) / m["dictionaries"][lang]["file"]


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
    name = m["subword"]["files"].get(lang)
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


def verify_files(data_dir: str | os.PathLike, manifest: dict | None = None, names: list[str] | None = None) -> None:
    """Check the sha256 of `names` (default: every file the manifest lists) against the manifest,
    once per file and process; UserError on the first missing or corrupt file, naming it."""
    m = _manifest(data_dir, manifest)
    files = m["files"]
    for name in files if names is None else names:
        p = Path(data_dir) / name
        if name not in files:
            raise UserError(f"{p}: not listed in {MANIFEST_NAME}")
        if not p.is_file():
            raise UserError(f"{p}: missing (listed in {MANIFEST_NAME})")
        st = p.stat()
        key = (os.path.realpath(p), st.st_size, st.st_mtime_ns, st.st_ino, files[name])
        if key in _VERIFIED:
            continue
        if sha256_file(p) != files[name]:
            raise UserError(f"{p}: checksum mismatch with {MANIFEST_NAME} (corrupt or modified file)")
        _VERIFIED.add(key)


def write_manifest(data_dir: str | os.PathLike, manifest: dict) -> None:
    """Write the manifest atomically; callers write it last, as the completion marker."""
    from nmtkit.io import atomic_write

    with atomic_write(Path(data_dir) / MANIFEST_NAME, "w") as fh:
        json.dump(manifest, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
