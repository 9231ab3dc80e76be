"""`preprocess --srcdict/--tgtdict`: binarize new text with an existing model's vocabulary.

Why: a trained model only understands the token ids of its own dictionaries, produced by its own
subword model. To fine-tune it on new text (or to translate new test sets with it through a data
directory) the new text must be segmented by the same subword model and mapped through the same
dictionaries, byte for byte: `nmtkit train --finetune-from-model` compares the dictionaries'
sha256 with the checkpoint's. Learning a new subword model or dictionary would give other ids.

`--srcdict PATH` takes either an nmtkit data directory (its dictionary of the source language is
used) or a dictionary file. A dictionary inside a data directory brings that directory's subword
model for its language along (copied into the new directory, checksum verified); a standalone
dictionary file has no known subword model, so it needs `--bpe none` (text already split into
the dictionary's tokens), as fairseq's `--srcdict` does. A data directory that Moses-tokenizes
its text before the subword model (an imported fairseq model: `subword.pretokenizer`) passes
that step on too, or the new text would reach the subword model untokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmtkit.data.dictionary import Dictionary
from nmtkit.data.manifest import MANIFEST_NAME, load_manifest, sha256_file, verify_files
from nmtkit.data.subwords import check_pretokenizer
from nmtkit.errors import UserError

DEFAULT_BPE = "sentencepiece"  # PreprocessConfig.bpe's default: --bpe not given (or given as the default)


@dataclass(frozen=True)
class ReusedSide:
    """The dictionary (and subword model) one language of the new data directory takes over."""

    flag: str  # "--srcdict" or "--tgtdict"
    dict_path: Path
    dictionary: Dictionary
    kind: str  # subword kind applied to this language: sentencepiece, subword-nmt or none
    model_path: Path | None  # the subword model file (None for kind "none")
    data_dir: Path | None  # the data directory it comes from (None: a standalone dictionary file)
    subword_entry: dict  # that directory's manifest "subword" settings carried over (vocab_size, merges)
    old_lang: str = ""  # the language whose dictionary this is in that directory
    pretokenizer: dict | None = None  # that directory's `subword.pretokenizer` (Moses), if any

    def moses_lang(self, lang: str) -> str:
        """The Moses language for `lang` of the new directory: the old directory's setting for a
        language of that name (a joined dictionary serving both sides), else for its own language."""
        langs = self.pretokenizer["langs"]
        return langs[lang] if lang in langs else langs[self.old_lang]

    def describe(self) -> dict:
        """What determines the output (content, not paths): for the build fingerprint."""
        out = {"dict_sha256": self.dictionary.sha256, "kind": self.kind,
               "model_sha256": sha256_file(self.model_path) if self.model_path else None}
        if self.pretokenizer is not None:  # (absent otherwise: earlier builds keep their fingerprint)
            out["pretokenizer"] = self.pretokenizer
        return out


def resolve_side(flag: str, value: str, lang: str, bpe: str) -> ReusedSide:
    """Find the dictionary and subword model `value` names for language `lang`; UserError otherwise."""
    p = Path(value)
    if p.is_dir():
        try:
            manifest = load_manifest(p)
        except UserError as e:
            raise UserError(f"{flag} {value}: not a dictionary file nor a complete nmtkit data directory ({e})") from None
        entry = manifest["dictionaries"].get(lang)
        if not isinstance(entry, dict):
            raise UserError(f"{flag} {value}: the data directory has no '{lang}' dictionary (its languages are "
                            f"{manifest['source_lang']} and {manifest['target_lang']}); give the dictionary file itself")
        return _from_data_dir(flag, p, manifest, lang, p / entry["file"], bpe)
    if not p.is_file():
        raise UserError(f"{flag} {value}: no such dictionary file or data directory")
    if (p.parent / MANIFEST_NAME).is_file():
        manifest = load_manifest(p.parent)
        owners = [lg for lg in (manifest["source_lang"], manifest["target_lang"])
                  if manifest["dictionaries"].get(lg, {}).get("file") == p.name]
        if owners:
            return _from_data_dir(flag, p.parent, manifest, owners[0], p, bpe)
    if bpe != "none":
        raise UserError(f"{flag} {value} is not in an nmtkit data directory, so the subword model that made its "
                        "tokens is unknown: give the data directory (or its dict.LANG.txt), or --bpe none for text "
                        "already split into the dictionary's tokens")
    return ReusedSide(flag, p, Dictionary.load(p), "none", None, None, {})


def _from_data_dir(flag: str, d: Path, manifest: dict, old_lang: str, dict_path: Path, bpe: str) -> ReusedSide:
    sub = manifest["subword"]
    kind = sub.get("kinds", {}).get(old_lang, sub["kind"])
    if bpe != DEFAULT_BPE and bpe != kind:
        raise UserError(f"--bpe {bpe} does not apply with {flag} {d}: the text is segmented by that data "
                        f"directory's own subword model ({kind})")
    name = sub["files"].get(old_lang)
    try:
        verify_files(d, manifest, [dict_path.name] + ([name] if name else []))
    except UserError as e:
        raise UserError(f"{flag}: {e}") from None
    pre = sub.get("pretokenizer")
    if pre is not None:
        check_pretokenizer(pre, old_lang, f"{flag} {d}'s manifest")
    return ReusedSide(flag, dict_path, Dictionary.load(dict_path), kind, d / name if name else None, d,
                      {k: v for k, v in sub.items() if k in ("vocab_size", "merges")}, old_lang, pre)


def resolve(srcdict: str | None, tgtdict: str | None, src: str, tgt: str, joined: bool,
            bpe: str) -> dict[str, ReusedSide] | None:
    """{lang: ReusedSide} for both languages, or None when neither flag is given.

    fairseq's rules: with --joined-dictionary, --srcdict alone serves both languages; otherwise
    both flags are needed (a model has two dictionaries, and half a match is no match).
    """
    if srcdict is None and tgtdict is None:
        return None
    if joined and tgtdict is None:
        side = resolve_side("--srcdict", srcdict, src, bpe)
        return {src: side, tgt: side}
    if srcdict is None or tgtdict is None:
        missing = "--srcdict" if srcdict is None else "--tgtdict"
        raise UserError(f"{missing} is needed too: a model has a source and a target dictionary, and both must be "
                        "reused (or --joined-dictionary with --srcdict alone)")
    out = {src: resolve_side("--srcdict", srcdict, src, bpe),
           tgt: resolve_side("--tgtdict", tgtdict, tgt, bpe)}
    if joined and out[src].dictionary.sha256 != out[tgt].dictionary.sha256:
        raise UserError(f"--joined-dictionary: --srcdict {srcdict} and --tgtdict {tgtdict} are different dictionaries")
    return out


def install_subwords(reused: dict[str, ReusedSide], src: str, tgt: str, tmp: Path) -> dict:
    """Copy the subword model file(s) into `tmp`; -> the manifest's "subword" entry.

    One file serving both languages (a joint model, possibly reached through both flags) is copied
    once; two different files of the same name are kept apart as NAME.LANG.
    """
    import shutil

    files: dict[str, str | None] = {}
    placed: dict[str, str] = {}  # name in tmp -> sha256 of the file put there
    for lang in (src, tgt):
        side = reused[lang]
        if side.model_path is None:
            files[lang] = None
            continue
        digest = sha256_file(side.model_path)
        name = side.model_path.name
        if name in placed and placed[name] != digest:
            stem, dot, ext = name.rpartition(".")
            name = f"{stem}.{lang}{dot}{ext}" if dot else f"{name}.{lang}"
        if name not in placed:
            shutil.copyfile(side.model_path, tmp / name)
            placed[name] = digest
        files[lang] = name
    kinds = {lang: reused[lang].kind for lang in (src, tgt)}
    learned = [lang for lang in (src, tgt) if files[lang]]
    entry: dict = {"kind": kinds[src], "kinds": kinds,
                   "joint": (files[src] == files[tgt]) if len(learned) == 2 else (None if not learned else False),
                   "files": files}
    for lang in (src, tgt):
        entry.update(reused[lang].subword_entry)
    pre = _pretokenizer_entry(reused, src, tgt)
    if pre is not None:
        entry["pretokenizer"] = pre
    entry["reused_from"] = {lang: str(reused[lang].data_dir or reused[lang].dict_path) for lang in (src, tgt)}
    return entry


def _pretokenizer_entry(reused: dict[str, ReusedSide], src: str, tgt: str) -> dict | None:
    """The new directory's `subword.pretokenizer`: the reused directories' Moses step under the
    new language names, or None when neither has one. A directory applies one rule to both
    languages' settings, so sides that disagree are refused."""
    a, b = reused[src], reused[tgt]
    if a.pretokenizer is None and b.pretokenizer is None:
        return None
    if a.pretokenizer is None or b.pretokenizer is None:
        moses, plain = (a, b) if a.pretokenizer is not None else (b, a)
        raise UserError(f"{moses.flag} {moses.data_dir} Moses-tokenizes text before its subword model and "
                        f"{plain.flag} {plain.data_dir or plain.dict_path} does not: one data directory cannot "
                        "mix the two; reuse dictionaries from directories that agree")
    keys = ("aggressive_dash_splits", "escape")
    opts = {k: bool(a.pretokenizer.get(k, True)) for k in keys}
    if opts != {k: bool(b.pretokenizer.get(k, True)) for k in keys}:
        raise UserError(f"{a.flag} {a.data_dir} and {b.flag} {b.data_dir} Moses-tokenize with different "
                        f"settings ({', '.join(keys)}): reuse dictionaries from directories that agree")
    return {"kind": "moses", "langs": {src: a.moses_lang(src), tgt: b.moses_lang(tgt)}, **opts}
