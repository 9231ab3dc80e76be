"""The language names of a multilingual data directory: its pairs, its tags and its splits' names.

Why a module of its own: preprocessing writes this layout, training samples from it, and
generation, serving and every export read it; each of them asks here, so the names have one home.

The convention is Marian's and OPUS-MT's (Johnson et al. 2017): the target language is chosen by a
tag at the start of the source, `>>fr<<`. The tag is a dictionary symbol, inserted as an id after
segmentation, so the subword model never sees it (a literal ">>fr<<" typed by a user stays text).
The same source token works unchanged on every runtime (nmtkit's, CTranslate2, ONNX Runtime) and
is what MarianMT's tokenizer reads in a Hugging Face export. Targets carry no tag, so no output
does.

A multilingual data directory is a joined-dictionary data directory whose manifest has a
`multilingual` entry (docs/formats.md):

    "multilingual": {"pairs": ["de-en", "en-de", ...], "langs": ["cs", "de", "en", "fr"],
                     "tags": {"cs": ">>cs<<", ...}}

and one split per pair and kind: `train.de-en`, `valid.de-en`, `test.de-en`, each with the
shards of the pair's two languages (`train.de-en.de.000.bin`, ...). Source shards begin with the
target language's tag. A bilingual directory has no `multilingual` entry and is read as before.
"""

from __future__ import annotations

import re

from nmtkit.errors import UserError

LANG_RE = re.compile(r"[a-z][a-z0-9_]{0,15}\Z")  # a language suffix: de, en, pt_br, zh_hans


def tag_token(lang: str) -> str:
    """The dictionary symbol that asks for `lang` as the target: `>>lang<<`."""
    return f">>{lang}<<"


def is_tag(token: str) -> bool:
    """True for a language tag symbol (`>>xx<<`)."""
    return token.startswith(">>") and token.endswith("<<") and LANG_RE.match(token[2:-2]) is not None


def pair_name(src: str, tgt: str) -> str:
    return f"{src}-{tgt}"


def split_name(split: str, src: str, tgt: str) -> str:
    """A pair's split in a multilingual directory: `valid` of de-en is `valid.de-en`."""
    return f"{split}.{pair_name(src, tgt)}"


def parse_pairs(text: str, flag: str = "--pairs") -> list[tuple[str, str]]:
    """`de-en,en-de` -> [("de", "en"), ("en", "de")], each checked; the order is kept."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        src, sep, tgt = part.strip().partition("-")
        if not sep or not LANG_RE.match(src) or not LANG_RE.match(tgt):
            raise UserError(f"{flag}: {part.strip()!r} is not a pair SRC-TGT of language suffixes "
                            "(lower-case letters, digits and _, e.g. de-en)")
        if src == tgt:
            raise UserError(f"{flag}: {part.strip()!r} translates a language into itself")
        if (src, tgt) in pairs:
            raise UserError(f"{flag}: {part.strip()!r} is given twice")
        pairs.append((src, tgt))
    return pairs


def multilingual(manifest: dict) -> dict | None:
    """The manifest's `multilingual` entry, or None for a bilingual directory."""
    entry = manifest.get("multilingual")
    return entry if isinstance(entry, dict) else None


def pairs_of(manifest: dict) -> list[tuple[str, str]]:
    """The (source, target) pairs of a multilingual directory, in the manifest's order."""
    entry = multilingual(manifest)
    if entry is None:
        return []
    return [tuple(p.split("-", 1)) for p in entry["pairs"]]


def langs_of(manifest: dict) -> list[str]:
    entry = multilingual(manifest)
    return list(entry["langs"]) if entry is not None else []


def check_direction(manifest: dict, src: str | None, tgt: str | None, where: str) -> tuple[str | None, str]:
    """The direction asked for (--source-lang/--target-lang, `target_lang`), checked against the
    model's languages: a target is required and must be one of them; a source, when given, too.
    One line names the languages the model has."""
    langs = langs_of(manifest)
    have = ", ".join(langs)
    if tgt is None:
        raise UserError(f"{where}: the model is multilingual; give the target language ({have})")
    for what, lang in (("target", tgt), ("source", src)):
        if lang is not None and lang not in langs:
            raise UserError(f"{where}: {what} language {lang!r} is not one of the model's languages ({have})")
    targets = {t for _, t in pairs_of(manifest)}
    if tgt not in targets:
        raise UserError(f"{where}: the model was trained to translate into {', '.join(sorted(targets))}, not {tgt!r}")
    if src is not None and src == tgt:
        raise UserError(f"{where}: source and target language are both {src!r}")
    return src, tgt


def check_lang_flags(manifest: dict, source_lang: str | None, target_lang: str | None, split: bool) -> None:
    """--source-lang / --target-lang against the model's languages (its manifest): required on
    a multilingual model (the target always, the source too for a binarized `split`), else its
    own pair or nothing."""
    if multilingual(manifest) is not None:
        check_direction(manifest, None, target_lang, "--target-lang")
        if source_lang is not None:  # the target is valid: what is left is the source's fault
            check_direction(manifest, source_lang, target_lang, "--source-lang")
        if split and source_lang is None:
            raise UserError("--source-lang: a binarized split of a multilingual data directory is one direction; "
                            f"give --source-lang and --target-lang ({', '.join(manifest['multilingual']['langs'])})")
        return
    for flag, given, own in (("--source-lang", source_lang, manifest["source_lang"]),
                             ("--target-lang", target_lang, manifest["target_lang"])):
        if given is not None and given != own:
            raise UserError(f"{flag} {given}: the model translates {manifest['source_lang']} into "
                            f"{manifest['target_lang']} only")
