"""One `nmtkit preprocess` run: its settings (`PreprocessJob`), running it, and its summary.

Why apart from nmtkit.data.preprocess: the pipeline there turns parallel text into a data
directory and knows nothing of tasks. A job adds what the command line decides: `--task` (plain
translation, or parsing through nmtkit.parsing.pipeline, which prepares a treebank as parallel
text first), the defaults that depend on it (parsing: fixed languages, no train cleaning unless
asked), the flags that apply to one task only, and the summary printed at the end. The CLI
(nmtkit.cli.preprocess) only parses flags, shows progress bars and prints.

Why here, above nmtkit.data and nmtkit.parsing: a job runs either the data pipeline or the
parsing pipeline built on it, so it imports both, and the data layer imports nothing of parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from nmtkit.data import multilingual
from nmtkit.data.languages import multilingual as multilingual_entry
from nmtkit.data.languages import parse_pairs
from nmtkit.data.preprocess import PreprocessConfig, PreprocessResult, preprocess
from nmtkit.errors import UserError
from nmtkit.settings import construct, group, setting, split_prefixes

TASKS = ("translation", "parsing")
P_PARSING = "Parsing"
P_MULTILINGUAL = "Multilingual"
DEFAULT_POS_TAGS = "keep"
# --task parsing: flags that do not apply to translation (checked in this order)
PARSING_ONLY = (("--treebank", "treebank"), ("--split", "split"), ("--pos-tags", "pos_tags"),
                ("--extra-train", "extra_train"))


def _parse_pairs(value: str | None) -> list[tuple[str, str]]:
    """--pairs: None (not given) -> [], 'de-en,en-de' -> [('de', 'en'), ('en', 'de')], each checked."""
    return [] if value is None else parse_pairs(value)


@dataclass
class PreprocessJob:
    """`nmtkit preprocess`'s settings: the pipeline's (`config`) and the task's."""

    config: PreprocessConfig = group(PreprocessConfig, required=True)
    task: str = setting("translation", flag="--task", panel=P_PARSING, help="translation (parallel text) or parsing (treebank trees -> words and linearized trees; docs/parsing.md).")
    treebank: str | None = setting(None, flag="--treebank", panel=P_PARSING, help="--task parsing: a whole treebank (LDC parsed/mrg/wsj folder, NLTK treebank.zip, or a file), split by --split.")
    split: str | None = setting(None, flag="--split", panel=P_PARSING, help="--task parsing with --treebank: ptb (WSJ 02-21/22/23) or sample (NLTK sample wsj_0001-0179/0180-0189/0190-0199).")
    # None: DEFAULT_POS_TAGS (given at all only with --task parsing)
    pos_tags: str | None = setting(None, flag="--pos-tags", panel=P_PARSING, show_default=False, help="--task parsing: keep (part-of-speech tags in the target, as the paper) or xx (one placeholder tag) [default: keep].")
    extra_train: list[str] = setting(default_factory=list, flag="--extra-train", cli_type=Optional[str], cli_default=None, parse=split_prefixes("--extra-train"), panel=P_PARSING, help="--task parsing: more training trees, comma-separated files or folders (e.g. a silver corpus: the semi-supervised setting).")
    # [(src, tgt), ...] in the order given; [] = a bilingual directory (--source-lang/--target-lang)
    pairs: list[tuple[str, str]] = setting(default_factory=list, flag="--pairs", cli_type=Optional[str], cli_default=None, parse=_parse_pairs, panel=P_MULTILINGUAL, help="One multilingual data directory for these pairs, comma-separated SRC-TGT (de-en,en-de,fr-en): reads PREFIX.SRC-TGT.LANG, else PREFIX.LANG, for every prefix; one joint sentencepiece model and dictionary, the target's >>TGT<< tag before each source sentence (docs/preprocess.md). Replaces --source-lang/--target-lang.")
    # given at all only with --pairs
    spm_temperature: float = setting(multilingual.DEFAULT_TEMPERATURE, flag="--spm-temperature", unset=True, panel=P_MULTILINGUAL, help="--pairs: sentencepiece learns from a mix where a language with n training lines has a share proportional to n^(1/T): 1 keeps the corpus proportions, larger values move toward equal shares, so that a small language still gets pieces of its own instead of being cut into characters [default: 5.0].")

    @property
    def parsing(self) -> bool:
        return self.task == "parsing"

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> "PreprocessJob":
        """The job from the command line's values; `config` holds None for the flags not given.

        The rules that tie flags to `--task` and `--bpe` live here: which flags apply, which are
        required, and the defaults that depend on the task.
        """
        task, c = values["task"], dict(values["config"])
        if task not in TASKS:
            raise UserError(f"--task must be translation or parsing, got {task!r}")
        if values["pairs"]:
            _multilingual_flags(values, c)
        elif values["spm_temperature"] is not None:
            raise UserError("--spm-temperature applies to --pairs")
        if task == "parsing":
            from nmtkit.parsing import pipeline

            for flag, name in (("--source-lang", "source_lang"), ("--target-lang", "target_lang")):
                if c[name] is not None:
                    raise UserError(f"{flag} does not apply to --task parsing (the sides are "
                                    f"'{pipeline.SOURCE_LANG}' and '{pipeline.TARGET_LANG}')")
            c.update(source_lang=pipeline.SOURCE_LANG, target_lang=pipeline.TARGET_LANG, trainpref=c["trainpref"] or "")
            for name, default in (("max_len", pipeline.PARSING_MAX_LEN), ("ratio", pipeline.PARSING_RATIO)):
                if c[name] is None:
                    c[name] = default
        else:
            for flag, name in PARSING_ONLY:
                if values[name] not in (None, []):
                    raise UserError(f"{flag} applies to --task parsing")
            for flag, name in (("--source-lang", "source_lang"), ("--target-lang", "target_lang"), ("--trainpref", "trainpref")):
                if c[name] is None:
                    raise UserError(f"missing option {flag}")
        if c["bpe"] != "sentencepiece" and c["vocab_size"] is not None:
            raise UserError(f"--vocab-size applies to --bpe sentencepiece, not --bpe {c['bpe']}")
        if c["bpe"] != "subword-nmt" and c["bpe_merges"] is not None:
            raise UserError(f"--bpe-merges applies to --bpe subword-nmt, not --bpe {c['bpe']}")
        if c["srcdict"] is not None or c["tgtdict"] is not None:
            if task == "parsing":
                raise UserError("--srcdict/--tgtdict apply to --task translation")
            for flag, name in (("--vocab-size", "vocab_size"), ("--bpe-merges", "bpe_merges")):
                if c[name] is not None:
                    raise UserError(f"{flag} does not apply with --srcdict/--tgtdict: the subword model is reused, "
                                    "not learned")
        return construct(cls, {**values, "config": c})  # flags still None take the field defaults

    def validate(self) -> None:
        """UserError naming the flag for a bad treebank selection (before anything is read).

        The pipeline's own settings are checked by `preprocess` (PreprocessConfig.validate).
        """
        if self.parsing:
            self.treebank_inputs().validate()

    def treebank_inputs(self):
        """--task parsing: where each split's trees come from (nmtkit.parsing.pipeline.TreebankInputs)."""
        from nmtkit.parsing.pipeline import TreebankInputs

        c = self.config
        return TreebankInputs(treebank=self.treebank, split=self.split, trainpref=c.trainpref or None,
                              validpref=list(c.validpref), testpref=list(c.testpref),
                              extra_train=list(self.extra_train), pos=self.pos_tags or DEFAULT_POS_TAGS)


def _multilingual_flags(values: dict[str, Any], c: dict[str, Any]) -> None:
    """--pairs: the flags that do not apply are refused; the languages are the first pair's (as
    the manifest records them) and the dictionary is joined."""
    if values["task"] != "translation":
        raise UserError("--pairs applies to --task translation")
    for flag, name in (("--source-lang", "source_lang"), ("--target-lang", "target_lang")):
        if c[name] is not None:
            raise UserError(f"{flag} does not apply with --pairs (each pair names its languages)")
    if c["trainpref"] is None:
        raise UserError("missing option --trainpref")
    if c["nwordstgt"] != -1 or c["thresholdtgt"] != 0:
        raise UserError("--nwordstgt/--thresholdtgt do not apply with --pairs: its one joint dictionary takes "
                        "--nwordssrc/--thresholdsrc")
    if c["bpe"] != "sentencepiece":
        raise UserError(f"--bpe {c['bpe']} does not apply with --pairs: a multilingual directory has one joint "
                        "sentencepiece model (--bpe sentencepiece)")
    (src, tgt), *_ = values["pairs"]
    c.update(source_lang=src, target_lang=tgt, joined_dictionary=True)


def run_preprocess(job: PreprocessJob, *, progress=None, log: Callable[[str], None] | None = None) -> PreprocessResult:
    """Build `job.config.destdir` (or find it up to date); `progress` is a rich Progress or None.

    A full disk is reported as writing DESTDIR (the files are built in a temporary folder beside
    it, which is removed; an older DESTDIR is kept).
    """
    from nmtkit.io import reporting_disk_full

    with reporting_disk_full(job.config.destdir, rename_inner=True):
        if job.parsing:
            from nmtkit.parsing import pipeline

            return pipeline.preprocess_parsing(job.treebank_inputs(), job.config, progress=progress, log=log).result
        if job.pairs:
            return multilingual.preprocess_multilingual(job.config, job.pairs, job.spm_temperature,
                                                        progress=progress, log=log)
        return preprocess(job.config, progress=progress, log=log)


def format_summary(result: PreprocessResult) -> str:
    """What DESTDIR holds: the subword model, dictionaries, one table row per split, train
    cleaning and the time taken (`nmtkit preprocess` prints it on stdout)."""
    m = result.manifest
    if multilingual_entry(m) is not None:
        return _multilingual_summary(result)
    src, tgt = m["source_lang"], m["target_lang"]
    sub = m["subword"]
    d = m["dictionaries"]
    state = "up to date" if result.up_to_date else "written"
    kinds = sub.get("kinds", {src: sub["kind"], tgt: sub["kind"]})
    if kinds[src] != kinds[tgt]:
        model = f"{src} {kinds[src]}, {tgt} {kinds[tgt]}"
    else:
        model = sub["kind"] if sub["kind"] == "none" else f"{sub['kind']} ({'joint' if sub['joint'] else 'separate'})"
    if sub.get("reused_from"):
        model += f" and dictionaries reused from {', '.join(sorted(set(sub['reused_from'].values())))}"
    task = f"; task {m['task']}" if m.get("task") else ""
    if m.get("task") == "parsing":
        task += f" (--pos-tags {m['parsing']['pos_tags']}; gold trees: {', '.join(m['parsing']['gold'].values())})"
    lines = [f"{result.destdir}: {state}; subwords: {model}; dictionaries: {src} {d[src]['size']}, "
             f"{tgt} {d[tgt]['size']}{' (joined)' if d['joined'] else ''}{task}"]
    rows = [("split", "lines", "pairs", f"{src} tokens", f"{tgt} tokens", f"{src} unk", f"{tgt} unk", "shards")]
    for name, s in m["splits"].items():
        rows.append((name, s["lines"], s["sentences"], s["tokens"][src], s["tokens"][tgt],
                     s["unk"][src], s["unk"][tgt], len(s["shards"])))
    widths = [max(len(f"{r[i]}") for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(f"{v}".ljust(w) if i == 0 else f"{v}".rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    clean = m["splits"]["train"].get("cleaning")
    if clean:
        dr = clean["dropped"]
        lines.append(f"train cleaning dropped {clean['dropped_total']} pairs: empty {dr['empty']}, too long {dr['too_long']}, "
                     f"too short {dr['too_short']}, ratio {dr['ratio']}")
    if not result.up_to_date and result.timings:
        t = result.timings
        pairs = m["splits"]["train"]["lines"]
        enc = t.get("encode_train", 0) + t.get("write_train", 0)
        rate = f" ({pairs / enc:,.0f} pairs/s, {t.get('binarize_cpu', 0):.1f} CPU s)" if enc > 0 else ""
        lines.append(f"time: check {t.get('check', 0):.1f}s, learn {t.get('learn', 0):.1f}s, "
                     f"binarize train {enc:.1f}s{rate}, valid/test {t.get('encode_eval', 0):.1f}s, "
                     f"total {t.get('total', 0):.1f}s")
    return "".join(line + "\n" for line in lines)


def _table(rows: list[tuple]) -> list[str]:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(f"{r[i]}") for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(f"{v}".ljust(w) if i == 0 else f"{v}".rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _multilingual_summary(result: PreprocessResult) -> str:
    """format_summary of a multilingual directory: one row per pair and split (source tokens
    count the target's tag), train cleaning per pair, the time taken."""
    m = result.manifest
    ml = m["multilingual"]
    state = "up to date" if result.up_to_date else "written"
    size = m["dictionaries"][m["source_lang"]]["size"]
    lines = [f"{result.destdir}: {state}; {len(ml['pairs'])} pairs ({', '.join(ml['pairs'])}); subwords: "
             f"sentencepiece (joint, --spm-temperature {ml['spm_temperature']:g}); dictionary: {size} (joined, "
             f"tags {' '.join(ml['tags'][lang] for lang in ml['langs'])})"]
    rows = [("split", "lines", "pairs", "src tokens", "tgt tokens", "src unk", "tgt unk", "shards")]
    for name, s in m["splits"].items():
        src, tgt = name.split(".", 1)[1].split("-", 1)
        rows.append((name, s["lines"], s["sentences"], s["tokens"][src], s["tokens"][tgt],
                     s["unk"][src], s["unk"][tgt], len(s["shards"])))
    lines += _table(rows)
    cleaned = {name.split(".", 1)[1]: s["cleaning"] for name, s in m["splits"].items() if "cleaning" in s}
    if cleaned:
        dr = {r: sum(c["dropped"][r] for c in cleaned.values()) for r in ("empty", "too_long", "too_short", "ratio")}
        lines.append(f"train cleaning dropped {sum(c['dropped_total'] for c in cleaned.values())} pairs: "
                     + ", ".join(f"{pair} {c['dropped_total']}" for pair, c in cleaned.items())
                     + f" (empty {dr['empty']}, too long {dr['too_long']}, too short {dr['too_short']}, ratio {dr['ratio']})")
    if not result.up_to_date and result.timings:
        t = result.timings
        lines.append(f"time: check {t.get('check', 0):.1f}s, learn {t.get('learn', 0):.1f}s, binarize pairs "
                     f"{t.get('encode_train', 0) + t.get('write_train', 0) + t.get('encode_eval', 0):.1f}s, "
                     f"joint ids and tags {t.get('rewrite', 0):.1f}s, total {t.get('total', 0):.1f}s")
    return "".join(line + "\n" for line in lines)
