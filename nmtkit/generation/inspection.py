"""`nmtkit attention`: the attention of a model for a few sentences, as pictures or arrays.

What it does: each source sentence (raw text given with --source, or sentences of a binarized
split picked with --gen-subset/--index) is paired with a target (--target, the split's own
target with --split-target, or by default the model's beam translation), teacher-forced through
the model with the explicit softmax path (`Translator.attention`), optionally merged from
subwords into words (punctuation glued to a word split off, as in the paper's figures), and
the chosen kind / layer / heads are written as one PNG per sentence
(`nmtkit.figures.attention`), or as one JSON or NPZ file with the arrays and the token
strings. Everything is computed and checked before the first file is written, so a bad
sentence stops the run with nothing half-written.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmtkit.backends.registry import ModelSource, describe
from nmtkit.data.languages import check_direction, split_name
from nmtkit.device import PRECISION_NAMES
from nmtkit.errors import UserError
from nmtkit.forced import Attention, piece_text
from nmtkit.models.transformer import ATTENTION_KINDS
from nmtkit.search.config import SearchConfig
from nmtkit.settings import group, setting

FORMATS = ("png", "json", "npz")
STYLES = ("heatmap", "lines")
LEVELS = ("subword", "words")
AXES = {  # kind -> (row axis, column axis) names in the pictures
    "enc-self": ("source (queries)", "source (keys)"),
    "dec-self": ("target (the token predicted)", "decoder input (keys)"),
    "cross": ("target (the token predicted)", "source (keys)"),
}


def _query_number(value: str) -> int | None:
    """--query "11" -> 11 (a 0-based position, "-1" too, refused later as out of range); a word -> None."""
    return int(value) if re.fullmatch(r"\s*[+-]?\d+\s*", value) else None


def _query_position(value: str, rows: list[str], where: str, level: str) -> int:
    """The row (0-based) that --query names in one sentence: a position, or a token of the rows
    (as labelled, or without the subword markers "▁" and "@@"); UserError naming the positions
    when it is out of range, ambiguous or absent."""
    n = _query_number(value)
    span = f"{len(rows)} query tokens (0..{len(rows) - 1}) at the {level} level"
    if n is not None:
        if not 0 <= n < len(rows):
            raise UserError(f"--query {n}: {where} has {span}")
        return n
    found = [i for i, t in enumerate(rows) if t == value]
    if not found:
        found = [i for i, t in enumerate(rows) if piece_text(t) == value]
    if len(found) == 1:
        return found[0]
    if found:
        raise UserError(f"--query {value!r}: {where} has it {len(found)} times among its query tokens at the {level} "
                        f"level, at positions {', '.join(map(str, found))}: give the one you mean, e.g. "
                        f"--query {found[0]}")
    tokens = " ".join(f"{i}:{t}" for i, t in enumerate(rows))
    raise UserError(f"--query {value!r}: {where} has no such query token at the {level} level; its {len(rows)} "
                    f"query tokens are {tokens} (give a token or its position)")


def _heads(value: str | None) -> list[int] | None:
    """--heads "1,3,5" -> [1, 3, 5] (1-based, as given); None or "all" -> None (every head)."""
    if value is None or value.strip() == "all":
        return None
    try:
        heads = [int(x) for x in value.split(",")]
    except ValueError:
        raise UserError(f"--heads takes head numbers separated by commas (1-based) or 'all', got {value!r}") from None
    if len(set(heads)) != len(heads):
        raise UserError(f"--heads names a head twice: {value!r}")
    return heads


@dataclass
class AttentionOptions:
    """Everything `nmtkit attention` needs; each `setting` field is one of its flags."""

    data_dir: str = setting(flag="data_dir", argument=True, help="Preprocessed data directory (dictionaries, subword model, splits).")
    path: str = setting(flag="--path", help="Checkpoint (one model).")
    sources: list[str] = setting(default_factory=list, flag="--source", parse=list, metavar="TEXT", help="A raw source sentence; give it several times for several sentences.")
    targets: list[str] = setting(default_factory=list, flag="--target", parse=list, metavar="TEXT", help="Its translation to teacher-force (one per --source) [default: the model's own beam translation].")
    gen_subset: str | None = setting(None, flag="--gen-subset", help="Take the sentences from this binarized split instead (with --index).")
    indices: list[int] = setting(default_factory=list, flag="--index", parse=list, metavar="N", help="0-based sentence number in --gen-subset (as in S-/H- lines); give it several times.")
    split_target: bool = setting(False, flag="--split-target", help="With --gen-subset: teacher-force the split's own target sentences.")
    source_lang: str | None = setting(None, flag="--source-lang", aliases=("-s",), help="Multilingual model: the source language of --gen-subset (its split SPLIT.SRC-TGT).")
    target_lang: str | None = setting(None, flag="--target-lang", aliases=("-t",), help="Multilingual model: the language to translate into (required); its tag is the source's first token.")
    kind: str = setting("cross", flag="--kind", help="enc-self (encoder self-attention), dec-self (masked decoder self-attention) or cross (encoder-decoder).")
    layer: int | None = setting(None, flag="--layer", help="Layer, 1-based (the paper's 'layer 5 of 6') [default: the last].")
    heads: str | None = setting(None, flag="--heads", help="Heads to show, 1-based, comma-separated (e.g. 5,6), or all [default: all; with --style lines: 1, and --heads all overlays every head].")
    level: str = setting("subword", flag="--level", help="subword: the model's tokens; words: a word's pieces merged (sum over keys, mean over queries), punctuation glued to a word split off as a word of its own.")
    style: str = setting("heatmap", flag="--style", help="PNG style: heatmap (a grid of heads) or lines (the paper's Figures 3-5: queries on top, keys below, a line per weight; one head unless --heads names more, a color per head).")
    query: str | None = setting(None, flag="--query", metavar="N|WORD", help="--style lines: only this query token's lines: its 0-based position in the rows (as in alignment pairs) or the token itself, e.g. making (the paper's Figure 3).")
    format: str = setting("png", flag="--format", help="png: one picture per sentence (needs the plot extra); json or npz: one file of arrays and tokens.")
    output: str | None = setting(None, flag="--output", aliases=("-o",), help="File to write; with several sentences PNGs get -1, -2, ... before the suffix [default: attention.FORMAT].")
    search: SearchConfig = group(SearchConfig)
    device: str = setting("auto", flag="--device", help="auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting("fp32", flag="--precision", help="fp32, bf16 or fp16 (weights and activations; the weights are recorded in fp32).")
    threads: int = setting(0, flag="--threads", help="CPU threads for torch (0 = torch's default).")
    ema: bool = setting(False, flag="--ema", help="Use the checkpoint's EMA weights instead of the raw weights.")
    # what --path is, described once (`model_source`) and passed along from here
    source: ModelSource | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_flags(cls, values: dict) -> "AttentionOptions":
        """The options from the flags: the model described once, then --max-len-b not given
        from its data, as in generate."""
        from nmtkit.search.config import default_search
        from nmtkit.settings import construct

        opts = cls(data_dir=values["data_dir"], path=values["path"], ema=bool(values.get("ema")))
        search = dict(values["search"])
        if search["max_len_b"] is None:
            search["max_len_b"] = default_search(opts.model_source().manifest).max_len_b
        return construct(cls, {**values, "search": search, "source": opts.model_source()})

    def model_source(self) -> ModelSource:
        """What --path is, decided and read once (kept on the options). An export is refused
        first: the pictures read the model's own attention weights."""
        if self.source is None:
            self.source = describe([self.path], self.data_dir, ema=self.ema, forced=f"--path {self.path}: attention")
        return self.source

    def validate(self) -> None:
        """UserError naming the flag for every impossible combination."""
        for flag, v, allowed in (("--kind", self.kind, ATTENTION_KINDS), ("--level", self.level, LEVELS),
                                 ("--format", self.format, FORMATS), ("--style", self.style, STYLES),
                                 ("--precision", self.precision, PRECISION_NAMES)):
            if v not in allowed:
                raise UserError(f"{flag} must be one of {', '.join(allowed)}, got {v!r}")
        if self.gen_subset is None:
            if self.indices or self.split_target:
                raise UserError("--index and --split-target apply to --gen-subset")
            if not self.sources:
                raise UserError("give a sentence: --source TEXT (raw text), or --gen-subset SPLIT --index N")
            if self.targets and len(self.targets) != len(self.sources):
                raise UserError(f"--target: {len(self.targets)} given for {len(self.sources)} --source sentences "
                                "(one target per source, or none for the model's own translations)")
        else:
            if self.sources:
                raise UserError("--source and --gen-subset exclude each other (raw text or a binarized split)")
            if not self.indices:
                raise UserError("--gen-subset needs --index N (the 0-based sentence number; give it several times)")
            if self.targets and self.split_target:
                raise UserError("--target and --split-target exclude each other")
            if self.targets and len(self.targets) != len(self.indices):
                raise UserError(f"--target: {len(self.targets)} given for {len(self.indices)} --index sentences")
            bad = [i for i in self.indices if i < 0]
            if bad:
                raise UserError(f"--index is a 0-based sentence number, got {bad[0]}")
        if self.query is not None:
            if self.style != "lines" or self.format != "png":
                raise UserError("--query applies to --style lines (PNG)")
            if not str(self.query).strip():
                raise UserError("--query takes a 0-based query token position or the token itself, got ''")
            n = _query_number(str(self.query))
            if n is not None and n < 0:
                raise UserError(f"--query is a 0-based token position, got {n}")
        # what can be refused before the model is loaded is; the upper limits are the model's (collect)
        if self.layer is not None and self.layer < 1:
            raise UserError(f"--layer is 1-based (1 = the lowest layer), got {self.layer}")
        heads = _heads(self.heads)
        if heads is not None and min(heads) < 1:
            raise UserError(f"--heads are 1-based (1 = the first head), got {min(heads)}")
        if self.threads < 0:
            raise UserError(f"--threads must be >= 0 (0 = torch's default), got {self.threads}")
        if self.search.sampling:
            raise UserError("--sampling: the model's own translation here is its beam (or greedy) search result")

    def draws_lines(self) -> bool:
        return self.format == "png" and self.style == "lines"

    def output_path(self) -> Path:
        return Path(self.output if self.output else f"attention.{self.format}")

    def sentence_count(self) -> int:
        return len(self.sources) if self.gen_subset is None else len(self.indices)

    def output_paths(self) -> list[Path]:
        """Every file the run writes: one JSON or NPZ file, or one PNG per sentence (-1, -2, ...
        before the suffix when there are several)."""
        out = self.output_path()
        n = self.sentence_count()
        if self.format != "png" or n == 1:
            return [out]
        return [out.with_name(f"{out.stem}-{i + 1}{out.suffix or '.png'}") for i in range(n)]

    def check_outputs(self) -> None:
        """Refuse, before the model is loaded, an output that is a directory, the checkpoint, any
        other checkpoint or a file of a data or export directory (`nmtkit.outputs`)."""
        from nmtkit.outputs import check_output_files

        check_output_files(self.output_paths(), "--output", [("--path", self.path)])


@dataclass
class Selected:
    """One sentence's chosen weights: (heads, rows, cols) with labels, and its whole Attention."""

    attention: Attention
    weights: np.ndarray
    rows: list[str]
    cols: list[str]
    query: int | None = None  # --query's row (--style lines)


def _items(opts: AttentionOptions, tr) -> list[tuple[str, object, str | None]]:
    """(name, Item, raw target or None) per sentence, in the order given."""
    targets = opts.targets or [None] * max(len(opts.sources), len(opts.indices))
    if opts.gen_subset is None:
        trunc = tr.truncations(lambda i: f"--source {i + 1}", "--source")
        items = list(tr.items(opts.sources, trunc))
        return [(f"--source {it.index + 1}", it, t) for it, t in zip(items, targets)]
    from nmtkit.data.shards import load_split
    from nmtkit.generation.items import Item

    split, src_lang, tgt_lang, lead = opts.gen_subset, tr.src_lang, tr.tgt_lang, 0
    if tr.langs:  # a multilingual directory: the direction's split, its sources tagged
        if opts.source_lang is None:
            raise UserError("--gen-subset on a multilingual model is one direction: give --source-lang and --target-lang")
        src_lang, tgt_lang, lead = opts.source_lang, opts.target_lang, 1
        split = split_name(split, src_lang, tgt_lang)
    src = load_split(tr.data_dir, split, src_lang, manifest=tr.manifest)
    tgt = load_split(tr.data_dir, split, tgt_lang, manifest=tr.manifest) if opts.split_target else None
    trunc = tr.truncations(lambda i: f"--index {i}", "--index")
    out = []
    for i, target in zip(opts.indices, targets):
        if i >= len(src):
            raise UserError(f"--index {i}: split {opts.gen_subset!r} has {len(src)} sentences (0..{len(src) - 1})")
        item = Item(i, trunc(i, np.asarray(src[i])), None if tgt is None else np.asarray(tgt[i]), lead=lead)
        out.append((f"--index {i}", item, target))
    return out


def collect(opts: AttentionOptions, tr) -> tuple[list[Selected], int, list[int]]:
    """The attention of every sentence; (selected per sentence, the layer, the heads), 1-based."""
    layer, heads = _layer_and_heads(opts, tr.engine.layers(opts.kind), tr.engine.heads(opts.kind))
    out = []
    for k, (name, item, target) in enumerate(_items(opts, tr)):
        a = tr.attention_of_item(item, target, where=name, target_where=f"--target {k + 1}")
        if opts.level == "words":
            a = a.words(split_punctuation=True)
        rows, cols = a.labels(opts.kind)
        query = None if opts.query is None else _query_position(opts.query, rows, name, opts.level)
        w = a.weights(opts.kind)[layer - 1][[h - 1 for h in heads]]  # (heads, rows, cols)
        out.append(Selected(a, w, rows, cols, query))
    return out, layer, heads


def _layer_and_heads(opts: AttentionOptions, n_layers: int, n_heads: int) -> tuple[int, list[int]]:
    """The layer and heads to show (1-based), checked against the model's: a UserError naming
    every number out of range and the range. --heads not given: every head, but only the first
    with --style lines (a picture of one head's lines; --heads all overlays them all)."""
    side = "encoder" if opts.kind == "enc-self" else "decoder"
    layer = n_layers if opts.layer is None else opts.layer
    if not 1 <= layer <= n_layers:
        raise UserError(f"--layer {layer} is out of range: the model has {n_layers} {side} layers (1..{n_layers}, "
                        "1 = the lowest)")
    heads = _heads(opts.heads)
    if heads is None:
        heads = [1] if opts.heads is None and opts.draws_lines() else list(range(1, n_heads + 1))
    bad = [h for h in heads if not 1 <= h <= n_heads]
    if bad:
        verb = "is" if len(bad) == 1 else "are"
        raise UserError(f"--heads {','.join(map(str, bad))} {verb} out of range: the model has {n_heads} heads "
                        f"in each {side} layer (1..{n_heads})")
    return layer, heads


def write_attention(opts: AttentionOptions, warn=None) -> list[Path]:
    """Run `nmtkit attention`: compute everything, then write the file(s); returns their paths."""
    from nmtkit.generation.items import warn_stderr
    from nmtkit.generation.model_flags import runtime_options
    from nmtkit.generation.translator import Translator

    opts.validate()
    warn = warn or warn_stderr
    if opts.format == "png":  # before the model is loaded: a missing extra is reported at once
        from nmtkit.figures.attention import import_pyplot

        import_pyplot()
    opts.check_outputs()
    tr = Translator.open(opts.model_source(), runtime_options(opts), warn=warn, search=opts.search)
    tr.set_target_lang(opts.target_lang, "--target-lang")
    if tr.langs and opts.source_lang is not None:
        check_direction(tr.manifest, opts.source_lang, opts.target_lang, "--source-lang")
    elif not tr.langs and opts.source_lang not in (None, tr.src_lang):
        raise UserError(f"--source-lang {opts.source_lang}: the model translates {tr.src_lang} into {tr.tgt_lang} only")
    sentences, layer, heads = collect(opts, tr)
    n_layers = tr.engine.layers(opts.kind)
    out = opts.output_path()
    meta = {"kind": opts.kind, "layer": layer, "layers": n_layers, "heads": heads, "level": opts.level}
    if opts.format == "json":
        doc = {**meta, "sentences": [_sentence_json(s) for s in sentences]}
        from nmtkit.io import atomic_write

        with atomic_write(out, "w") as fh:
            json.dump(doc, fh, ensure_ascii=False)
            fh.write("\n")
        return [out]
    if opts.format == "npz":
        return [_write_npz(out, meta, sentences)]
    from nmtkit.figures.attention import draw_heads, draw_lines

    paths = opts.output_paths()
    row_axis, col_axis = AXES[opts.kind]
    for s, p in zip(sentences, paths):
        title = figure_title(opts.kind, layer, n_layers, opts.level, s.attention)
        if opts.style == "lines":
            draw_lines(s.weights, s.rows, s.cols, heads, title, p, query=s.query)
        else:
            draw_heads(s.weights, s.rows, s.cols, heads, title, p, row_axis, col_axis)
    return paths


def figure_title(kind: str, layer: int, n_layers: int, level: str, a: Attention) -> str:
    """A picture's title: what it shows. Encoder self-attention shows the source alone, so its
    title names no target; decoder attention's names the target (given or the model's own) and
    its log-probability."""
    side = "encoder" if kind == "enc-self" else "decoder"
    head = f"{kind} attention, {side} layer {layer} of {n_layers}"
    if kind == "enc-self":
        return f"{head}\n({level} level)"
    what = "given target" if a.target_given else "the model's translation"
    return f"{head}\n({level} level; target: {what}, log-prob {a.score.logprob:.2f})"


def _sentence_json(s: Selected) -> dict:
    a = s.attention
    return {"source_tokens": a.source_tokens, "target_tokens": a.target_tokens, "decoder_inputs": a.decoder_inputs,
            "rows": s.rows, "columns": s.cols, "target_given": a.target_given, "logprob": a.score.logprob,
            "score": a.score.score, "weights": np.round(s.weights.astype(np.float64), 6).tolist()}


def _write_npz(out: Path, meta: dict, sentences: list[Selected]) -> Path:
    """One .npz: per sentence i `weights_i` (heads, rows, cols) float32, `rows_i`, `columns_i`,
    `source_tokens_i`, `target_tokens_i` (str arrays), `logprob_i`; and the selection."""
    from nmtkit.io import atomic_write

    arrays: dict[str, np.ndarray] = {"kind": np.array(meta["kind"]), "layer": np.array(meta["layer"]),
                                     "heads": np.array(meta["heads"]), "level": np.array(meta["level"])}
    for i, s in enumerate(sentences):
        arrays[f"weights_{i}"] = s.weights.astype(np.float32)
        arrays[f"rows_{i}"] = np.array(s.rows, dtype=str)
        arrays[f"columns_{i}"] = np.array(s.cols, dtype=str)
        arrays[f"source_tokens_{i}"] = np.array(s.attention.source_tokens, dtype=str)
        arrays[f"target_tokens_{i}"] = np.array(s.attention.target_tokens, dtype=str)
        arrays[f"logprob_{i}"] = np.array(s.attention.score.logprob)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with atomic_write(out, "wb", encoding=None) as fh:
        fh.write(buf.getvalue())
    return out
