"""`nmtkit preprocess`: flag parsing for nmtkit.data.preprocess (docs/preprocess.md)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from nmtkit.cli.app import app
from nmtkit.errors import UserError
from nmtkit.io import text_stdout


class _RateColumn(ProgressColumn):
    """Items per second (lines, tokens or bytes, whatever the task counts)."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


def _prefixes(value: Optional[str], flag: str) -> list[str]:
    if value is None:
        return []
    parts = [p.strip() for p in value.split(",")]
    if any(not p for p in parts):
        raise UserError(f"{flag} has an empty prefix in {value!r} (separate several prefixes with commas)")
    return parts


@app.command("preprocess")
def preprocess_command(
    source_lang: Optional[str] = typer.Option(None, "--source-lang", "-s", help="Source language suffix, e.g. de (required for translation)."),
    target_lang: Optional[str] = typer.Option(None, "--target-lang", "-t", help="Target language suffix, e.g. en (required for translation)."),
    trainpref: Optional[str] = typer.Option(None, "--trainpref", help="Training files prefix P: reads P.SRC and P.TGT (or .gz); --task parsing: a treebank P, P.trees or P.mrg (or .gz, or a folder)."),
    validpref: Optional[str] = typer.Option(None, "--validpref", help="Validation prefix(es), comma-separated: splits valid, valid1, ..."),
    testpref: Optional[str] = typer.Option(None, "--testpref", help="Test prefix(es), comma-separated: splits test, test1, ..."),
    destdir: str = typer.Option(..., "--destdir", help="Output directory (created; replaced only with --force)."),
    bpe: str = typer.Option("sentencepiece", "--bpe", help="Subword model learned on the training text: sentencepiece, subword-nmt or none."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="sentencepiece vocabulary size [default: 8000]."),
    bpe_merges: Optional[int] = typer.Option(None, "--bpe-merges", help="subword-nmt merge operations [default: 10000]."),
    joint_bpe: bool = typer.Option(True, "--joint-bpe/--separate-bpe", help="One subword model for both languages, or one per language."),
    spm_max_lines: int = typer.Option(1_000_000, "--spm-max-lines", help="Lines sentencepiece learns from (a reproducible sample when the training text has more); 0 = all."),
    joined_dictionary: bool = typer.Option(False, "--joined-dictionary", help="One dictionary shared by both languages (needed to share embeddings)."),
    nwordssrc: int = typer.Option(-1, "--nwordssrc", help="Largest source (or joined) dictionary, specials included; -1 = no limit."),
    nwordstgt: int = typer.Option(-1, "--nwordstgt", help="Largest target dictionary, specials included; -1 = no limit."),
    thresholdsrc: int = typer.Option(0, "--thresholdsrc", help="Source (or joined) tokens seen fewer times become <unk>."),
    thresholdtgt: int = typer.Option(0, "--thresholdtgt", help="Target tokens seen fewer times become <unk>."),
    pad_to_multiple: int = typer.Option(8, "--pad-to-multiple", help="Pad dictionary sizes to a multiple of this (madeupwordNNNN entries)."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Train cleaning: drop pairs with a side longer than this many subword tokens; 0 = no limit [default: 250; 0 with --task parsing].", show_default=False),
    min_len: int = typer.Option(1, "--min-len", help="Train cleaning: drop pairs with a side shorter than this many subword tokens."),
    ratio: Optional[float] = typer.Option(None, "--ratio", help="Train cleaning: drop pairs whose length ratio exceeds this; 0 = no check [default: 9.0; 0 with --task parsing].", show_default=False),
    workers: int = typer.Option(1, "--workers", help="Encoding processes (output is identical for any number)."),
    shard_size: int = typer.Option(1_000_000, "--shard-size", help="Sentences per shard file."),
    force: bool = typer.Option(False, "--force", help="Replace a DESTDIR that holds something else (only once the new data is complete)."),
    task: str = typer.Option("translation", "--task", help="translation (parallel text) or parsing (treebank trees -> words and linearized trees; docs/parsing.md).", rich_help_panel="Parsing"),
    treebank: Optional[str] = typer.Option(None, "--treebank", help="--task parsing: a whole treebank (LDC parsed/mrg/wsj folder, NLTK treebank.zip, or a file), split by --split.", rich_help_panel="Parsing"),
    split: Optional[str] = typer.Option(None, "--split", help="--task parsing with --treebank: ptb (WSJ 02-21/22/23) or sample (NLTK sample wsj_0001-0179/0180-0189/0190-0199).", rich_help_panel="Parsing"),
    pos_tags: Optional[str] = typer.Option(None, "--pos-tags", help="--task parsing: keep (part-of-speech tags in the target, as the paper) or xx (one placeholder tag) [default: keep].", rich_help_panel="Parsing", show_default=False),
    extra_train: Optional[str] = typer.Option(None, "--extra-train", help="--task parsing: more training trees, comma-separated files or folders (e.g. a silver corpus: the semi-supervised setting).", rich_help_panel="Parsing"),
) -> None:
    """Learn a subword model and dictionaries on the training text and binarize every split.

    Writes to DESTDIR: the subword model, dict.SRC.txt and dict.TGT.txt, per split and language
    binary shards (.bin + .idx), and manifest.json with checksums. Rerunning with the same inputs
    and options finds DESTDIR up to date and does nothing.
    """
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    if task not in ("translation", "parsing"):
        raise UserError(f"--task must be translation or parsing, got {task!r}")
    parsing = task == "parsing"
    if parsing:
        from nmtkit.parsing import pipeline

        for flag, value in (("--source-lang", source_lang), ("--target-lang", target_lang)):
            if value is not None:
                raise UserError(f"{flag} does not apply to --task parsing (the sides are "
                                f"'{pipeline.SOURCE_LANG}' and '{pipeline.TARGET_LANG}')")
        source_lang, target_lang = pipeline.SOURCE_LANG, pipeline.TARGET_LANG
        if max_len is None:
            max_len = pipeline.PARSING_MAX_LEN
        if ratio is None:
            ratio = pipeline.PARSING_RATIO
    else:
        for flag, value in (("--treebank", treebank), ("--split", split), ("--pos-tags", pos_tags),
                            ("--extra-train", extra_train)):
            if value is not None:
                raise UserError(f"{flag} applies to --task parsing")
        for flag, value in (("--source-lang", source_lang), ("--target-lang", target_lang), ("--trainpref", trainpref)):
            if value is None:
                raise UserError(f"missing option {flag}")
        max_len = 250 if max_len is None else max_len
        ratio = 9.0 if ratio is None else ratio
    if bpe != "sentencepiece" and vocab_size is not None:
        raise UserError(f"--vocab-size applies to --bpe sentencepiece, not --bpe {bpe}")
    if bpe != "subword-nmt" and bpe_merges is not None:
        raise UserError(f"--bpe-merges applies to --bpe subword-nmt, not --bpe {bpe}")
    cfg = PreprocessConfig(
        source_lang=source_lang,
        target_lang=target_lang,
        trainpref=trainpref or "",
        destdir=destdir,
        validpref=[] if parsing else _prefixes(validpref, "--validpref"),
        testpref=[] if parsing else _prefixes(testpref, "--testpref"),
        bpe=bpe,
        vocab_size=8000 if vocab_size is None else vocab_size,
        bpe_merges=10000 if bpe_merges is None else bpe_merges,
        joint_bpe=joint_bpe,
        spm_max_lines=spm_max_lines,
        joined_dictionary=joined_dictionary,
        nwordssrc=nwordssrc,
        nwordstgt=nwordstgt,
        thresholdsrc=thresholdsrc,
        thresholdtgt=thresholdtgt,
        pad_to_multiple=pad_to_multiple,
        max_len=max_len,
        min_len=min_len,
        ratio=ratio,
        workers=workers,
        shard_size=shard_size,
        force=force,
    )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err,
        transient=True,  # bars vanish when done; the library logs one line per finished phase
    )
    if parsing:
        inputs = pipeline.TreebankInputs(
            treebank=treebank, split=split, trainpref=trainpref,
            validpref=_prefixes(validpref, "--validpref"), testpref=_prefixes(testpref, "--testpref"),
            extra_train=_prefixes(extra_train, "--extra-train"), pos=pos_tags or "keep",
        )
        inputs.validate()
    log = lambda msg: progress.console.print(msg, markup=False)  # noqa: E731
    with progress:
        if parsing:
            result = pipeline.preprocess_parsing(inputs, cfg, progress=progress, log=log).result
        else:
            result = preprocess(cfg, progress=progress, log=log)
    _print_summary(result)


def _print_summary(result) -> None:
    """The results: what DESTDIR holds (stdout)."""
    m = result.manifest
    out = text_stdout()
    src, tgt = m["source_lang"], m["target_lang"]
    sub = m["subword"]
    d = m["dictionaries"]
    state = "up to date" if result.up_to_date else "written"
    kinds = sub.get("kinds", {src: sub["kind"], tgt: sub["kind"]})
    if kinds[src] != kinds[tgt]:
        model = f"{src} {kinds[src]}, {tgt} {kinds[tgt]}"
    else:
        model = sub["kind"] if sub["kind"] == "none" else f"{sub['kind']} ({'joint' if sub['joint'] else 'separate'})"
    task = f"; task {m['task']}" if m.get("task") else ""
    if m.get("task") == "parsing":
        task += f" (--pos-tags {m['parsing']['pos_tags']}; gold trees: {', '.join(m['parsing']['gold'].values())})"
    out.write(f"{result.destdir}: {state}; subwords: {model}; dictionaries: {src} {d[src]['size']}, "
              f"{tgt} {d[tgt]['size']}{' (joined)' if d['joined'] else ''}{task}\n")
    rows = [("split", "lines", "pairs", f"{src} tokens", f"{tgt} tokens", f"{src} unk", f"{tgt} unk", "shards")]
    for name, s in m["splits"].items():
        rows.append((name, s["lines"], s["sentences"], s["tokens"][src], s["tokens"][tgt],
                     s["unk"][src], s["unk"][tgt], len(s["shards"])))
    widths = [max(len(f"{r[i]}") for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(f"{v}".ljust(w) if i == 0 else f"{v}".rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip() + "\n")
    clean = m["splits"]["train"].get("cleaning")
    if clean:
        dr = clean["dropped"]
        out.write(f"train cleaning dropped {clean['dropped_total']} pairs: empty {dr['empty']}, too long {dr['too_long']}, "
                  f"too short {dr['too_short']}, ratio {dr['ratio']}\n")
    if not result.up_to_date and result.timings:
        t = result.timings
        pairs = m["splits"]["train"]["lines"]
        enc = t.get("encode_train", 0) + t.get("write_train", 0)
        rate = f" ({pairs / enc:,.0f} pairs/s, {t.get('binarize_cpu', 0):.1f} CPU s)" if enc > 0 else ""
        out.write(f"time: check {t.get('check', 0):.1f}s, learn {t.get('learn', 0):.1f}s, "
                  f"binarize train {enc:.1f}s{rate}, valid/test {t.get('encode_eval', 0):.1f}s, "
                  f"total {t.get('total', 0):.1f}s\n")
    out.flush()
