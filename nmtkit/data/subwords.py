"""Learning and applying subword models: sentencepiece, subword-nmt, or plain whitespace tokens.

Why wrap them: preprocessing, generation (which must segment raw input and detokenize output) and
the parsing task all need the same `encode(line) -> tokens` / `decode(tokens) -> text` pair, and
the libraries differ in how they are trained, stored and undone. Training uses each library's own
algorithm (sentencepiece's BPE trainer; subword-nmt's `learn_bpe`), never a reimplementation.

- sentencepiece: model type BPE, character_coverage 1.0 (every character of the training text is
  kept: nothing becomes <unk> in the training data), the library's default normalization
  (nmt_nfkc). Files: `spm.model` (joint) or `spm.LANG.model`.
- subword-nmt: merges learned over whitespace tokens; units carry the "@@" continuation marker.
  Files: `bpe.codes` (joint) or `bpe.LANG.codes`.
- none: the line split on whitespace; decoding joins with single spaces.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator

import sentencepiece as spm

from nmtkit.errors import UserError

BPE_KINDS = ("sentencepiece", "subword-nmt", "none")
BPE_SEPARATOR = "@@"
_BPE_JOIN = re.compile(r"@@( |$)")


class SubwordModel:
    """Segments raw text into tokens and undoes it; one per language of a data directory."""

    kind = "none"

    def encode(self, line: str) -> list[str]:
        """Tokens of one line of raw text."""
        return line.split()

    def encode_batch(self, lines: list[str]) -> list[list[str]]:
        return [self.encode(line) for line in lines]

    def decode(self, tokens: Iterable[str]) -> str:
        """Detokenized text of `tokens` (the inverse of `encode` up to whitespace/normalization)."""
        return " ".join(tokens)


class WhitespaceModel(SubwordModel):
    """`--bpe none`: the input is taken as already tokenized; tokens are whitespace-separated."""

    kind = "none"


class SentencePieceModel(SubwordModel):
    kind = "sentencepiece"

    def __init__(self, model_file: str | os.PathLike | None = None, *, model_proto: bytes | None = None):
        try:
            if model_proto is not None:
                self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
            else:
                self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        except (OSError, RuntimeError) as e:
            raise UserError(f"{model_file or '<model>'}: cannot load sentencepiece model: {e}") from None

    def encode(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

    def encode_batch(self, lines: list[str]) -> list[list[str]]:
        return self.sp.encode(lines, out_type=str)

    def encode_ids(self, lines: list[str], num_threads: int = 1) -> list[list[int]]:
        """sentencepiece's own ids (not dictionary ids): the fast path preprocessing uses."""
        return self.sp.encode(lines, num_threads=num_threads)

    def pieces(self) -> list[str]:
        """Piece string of every sentencepiece id, in id order."""
        return [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]

    def decode(self, tokens: Iterable[str]) -> str:
        return self.sp.decode(list(tokens))


class SubwordNmtModel(SubwordModel):
    kind = "subword-nmt"

    def __init__(self, codes_file: str | os.PathLike | None = None, *, codes_text: str | None = None):
        from subword_nmt.apply_bpe import BPE

        err = io.StringIO()
        try:
            # apply_bpe reports a malformed line (or codes without any merge) on stderr and calls
            # sys.exit(1): caught, so that it becomes our one-line refusal, not an exit 1.
            with contextlib.redirect_stderr(err):
                if codes_text is not None:
                    self.bpe = BPE(io.StringIO(codes_text), separator=BPE_SEPARATOR)
                else:
                    with open(codes_file, encoding="utf-8") as fh:
                        self.bpe = BPE(fh, separator=BPE_SEPARATOR)
        except (OSError, ValueError, IndexError) as e:
            raise UserError(f"{codes_file or '<codes>'}: cannot load subword-nmt codes: {e}") from None
        except SystemExit:
            why = err.getvalue().strip().splitlines()
            why = why[0].removeprefix("Error: ").strip() if why else "subword-nmt refused them"
            raise UserError(f"{codes_file or '<codes>'}: cannot load subword-nmt codes: {why}") from None
        # apply_bpe reads any "#version: X.Y" but segments only these two (NotImplementedError at
        # the first word otherwise): refused here, where the file is named
        if self.bpe.version not in ((0, 1), (0, 2)):
            version = ".".join(map(str, self.bpe.version))[:40]
            raise UserError(f"{codes_file or '<codes>'}: cannot load subword-nmt codes: version {version} "
                            "(subword-nmt applies versions 0.1 and 0.2)")

    def encode(self, line: str) -> list[str]:
        return self.bpe.segment_tokens(line.split())

    def decode(self, tokens: Iterable[str]) -> str:
        # fairseq's "subword_nmt" post-processing: "a@@ b" -> "ab", and a dangling final "@@".
        return _BPE_JOIN.sub("", " ".join(tokens))


class MosesPretokenized(SubwordModel):
    """Moses tokenization (sacremoses) before a subword model and detokenization after it.

    Why: models trained on `tokenizer.perl` output (the published WMT models of fairseq, with
    fairseq's `--tokenizer moses`) expect tokenized text; with this, raw text goes in and
    detokenized text comes out, as with any other data directory. It is a data-directory setting
    (manifest `subword.pretokenizer`: `{"kind": "moses", "langs": {LANG: MOSES_LANG},
    "aggressive_dash_splits": bool, "escape": bool}`), the defaults being fairseq's (dash
    splitting, escaping of `& | < > ' " [ ]`).
    """

    def __init__(self, inner: SubwordModel, lang: str, *, aggressive_dash_splits: bool = True, escape: bool = True):
        from sacremoses import MosesDetokenizer, MosesTokenizer

        self.inner, self.kind = inner, inner.kind
        self.aggressive_dash_splits, self.escape = aggressive_dash_splits, escape
        self.tokenizer, self.detokenizer = MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)

    def tokenize(self, line: str) -> str:
        return self.tokenizer.tokenize(line, aggressive_dash_splits=self.aggressive_dash_splits,
                                       return_str=True, escape=self.escape)

    def encode(self, line: str) -> list[str]:
        return self.inner.encode(self.tokenize(line))

    def encode_ids(self, lines: list[str], num_threads: int = 1) -> list[list[int]]:
        """sentencepiece ids of the tokenized lines (preprocess's path for a sentencepiece model)."""
        return self.inner.encode_ids([self.tokenize(line) for line in lines], num_threads)

    def decode(self, tokens: Iterable[str]) -> str:
        return self.detokenizer.detokenize(self.inner.decode(tokens).split())


def check_pretokenizer(pre, lang: str, where: str = "the data directory's manifest") -> None:
    """UserError unless `pre` (a manifest's `subword.pretokenizer`) is Moses with a setting for `lang`."""
    if not isinstance(pre, dict) or pre.get("kind") != "moses" or not isinstance(pre.get("langs"), dict) \
            or lang not in pre["langs"]:
        raise UserError(f"unsupported pre-tokenizer in {where}: {pre!r} (this nmtkit knows Moses for each language)")


def pretokenized(model: SubwordModel, subword_entry: dict, lang: str) -> SubwordModel:
    """`model` behind the data directory's pre-tokenizer (`subword.pretokenizer`), if it has one."""
    pre = subword_entry.get("pretokenizer")
    if not pre:
        return model
    check_pretokenizer(pre, lang)
    return MosesPretokenized(model, pre["langs"][lang], aggressive_dash_splits=bool(pre.get("aggressive_dash_splits", True)),
                             escape=bool(pre.get("escape", True)))


def model_filename(kind: str, lang: str | None) -> str | None:
    """File name of the model inside a data dir; lang None for a joint model."""
    suffix = "" if lang is None else f".{lang}"
    if kind == "sentencepiece":
        return f"spm{suffix}.model"
    if kind == "subword-nmt":
        return f"bpe{suffix}.codes"
    return None


def load_model_file(kind: str, path: str | os.PathLike | None) -> SubwordModel:
    """Load a subword model of `kind` from `path` (None for kind 'none')."""
    if kind == "sentencepiece":
        return SentencePieceModel(path)
    if kind == "subword-nmt":
        return SubwordNmtModel(path)
    if kind == "none":
        return WhitespaceModel()
    raise UserError(f"unknown subword model kind {kind!r} (expected one of {', '.join(BPE_KINDS)})")


def learn_sentencepiece(lines: Iterator[str], vocab_size: int) -> bytes:
    """Train a sentencepiece BPE model on `lines`; return the serialized model.

    Deterministic for a given input (the model bytes do not depend on how many threads or workers
    preprocessing uses), which is what makes reruns byte-identical. Sampling of a huge corpus is
    done by the caller, reproducibly, because sentencepiece's own sampler is not seeded.
    """
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_writer=buf,
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            minloglevel=2,  # sentencepiece's INFO/WARNING chatter would drown the progress bars
        )
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        raise UserError(f"--vocab-size {vocab_size}: sentencepiece cannot train on this text: {msg}") from None
    return buf.getvalue()


def learn_subword_nmt(word_counts: Counter, merges: int) -> str:
    """Learn `merges` subword-nmt BPE merge operations from word counts; return the codes text.

    Codes without any merge are refused here (UserError): apply_bpe cannot load them, so they
    would only fail later, at the first segmentation.
    """
    from subword_nmt.learn_bpe import learn_bpe

    out = io.StringIO()
    # learn_bpe fails (max() of no pair statistics) on words that are all one character long
    if any(len(w) > 1 for w in word_counts):
        vocab = io.StringIO("".join(f"{w} {c}\n" for w, c in sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))))
        # learn_bpe reports "no pair has frequency >= 2. Stopping" on stderr: not an error for us.
        with contextlib.redirect_stderr(io.StringIO()):
            learn_bpe(vocab, out, merges, is_dict=True)
    codes = out.getvalue()
    if codes.count("\n") < 2:  # at most the "#version" line
        raise UserError(
            f"--bpe-merges {merges}: subword-nmt learned no merge operation from this text (a merge needs "
            "a pair of adjacent characters seen at least twice); use --bpe sentencepiece or none, or more text"
        )
    return codes


def count_words(lines: Iterable[str], counts: Counter | None = None) -> Counter:
    """Whitespace-token counts (what subword-nmt learns from)."""
    counts = Counter() if counts is None else counts
    for line in lines:
        counts.update(line.split())
    return counts


def load_subword_model(data_dir: str | os.PathLike, lang: str, manifest: dict | None = None) -> SubwordModel:
    """The subword model that `nmtkit preprocess` applied to language `lang` in `data_dir`.

    Generation uses it to segment raw input (`encode`) and detokenize output (`decode`). The file
    is checked against the manifest's sha256 first (once per process): a flipped byte in
    spm.model would otherwise change every translation silently. `manifest`: the directory's
    (or an export directory's copy of its entries) when the caller has read it already.
    """
    from nmtkit.data.manifest import load_manifest, subword_model_path, verify_files

    manifest = load_manifest(data_dir) if manifest is None else manifest
    path = subword_model_path(data_dir, lang, manifest)  # first: it names a missing "subword" entry
    sub = manifest["subword"]
    # "kinds" (per language) exists since a side may have no subword model (parsing's trees);
    # older data directories have one kind for both sides.
    kind = sub.get("kinds", {}).get(lang, sub["kind"])
    if path is None and kind in ("sentencepiece", "subword-nmt"):
        raise UserError(f"{data_dir}: its manifest gives {lang!r} a {kind} model but no file (subword.files.{lang})")
    if path is not None:
        verify_files(data_dir, manifest, [path.name])
    return pretokenized(load_model_file(kind, path), sub, lang)
