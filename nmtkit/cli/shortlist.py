"""`nmtkit shortlist`: a lexical shortlist built from a data directory's training split
(nmtkit.data.shortlist; docs/generate.md, "Lexical shortlists")."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from nmtkit.cli.app import app
from nmtkit.console import stderr_console, text_column
from nmtkit.data.shortlist import BEST, DEFAULT_NAME, FREQUENT, ITERATIONS
from nmtkit.errors import UserError
from nmtkit.io import text_stdout


@app.command("shortlist")
def shortlist_cmd(
    data_dir: Path = typer.Argument(..., metavar="DATA_DIR", help="A data directory written by nmtkit preprocess."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help=f"Where to write the shortlist [default: DATA_DIR/{DEFAULT_NAME}].",
        show_default=False),
    best: int = typer.Option(BEST, "--best", help="Target pieces per source piece, the most likely by IBM Model 1."),
    frequent: int = typer.Option(FREQUENT, "--frequent",
                                 help="The most frequent target pieces, candidates for every sentence."),
    identity: bool = typer.Option(True, "--identity/--no-identity",
                                  help="Also list a source piece as its own candidate when it is a target piece."),
    iterations: int = typer.Option(ITERATIONS, "--iterations", help="EM rounds of IBM Model 1."),
    split: str = typer.Option("train", "--split", help="The split to learn from (each pair's, in a multilingual "
                              "data directory)."),
    language: Optional[str] = typer.Option(
        None, "--language", metavar="LANG", show_default=False,
        help="Instead: the vocabulary of LANG, every piece the split's targets in LANG use, as always-candidates "
             "(no source keys; --best, --frequent, --identity and --iterations do not apply): decoding into LANG "
             "with it cannot use another language's own pieces [default name: DATA_DIR/shortlist.LANG.txt]."),
    min_count: int = typer.Option(1, "--min-count", help="--language: a piece must occur this often in LANG's "
                                  "targets (strays of other languages occur rarely)."),
    min_ratio: float = typer.Option(0.0, "--min-ratio", help="--language: a piece's share of LANG's target tokens "
                                    "must be at least this times its share of any other target language's (0: off)."),
) -> None:
    """Build a lexical shortlist (CTranslate2's vocabulary map) from a data directory's training split.

    Per source piece: its most likely target pieces under IBM Model 1 (EM on the split, no model
    needed) and itself when it is a target piece too; plus the most frequent target pieces, which
    are candidates for every sentence. Writes DATA_DIR/shortlist.txt (or --output), one
    `SOURCE<TAB>TARGET ...` line per source piece, the always-candidates first with an empty SOURCE.
    With --language LANG: a target language's vocabulary instead, for a multilingual model's
    directions into LANG (zero-shot ones above all), in DATA_DIR/shortlist.LANG.txt.
    """
    from nmtkit.data import shortlist as sl
    from nmtkit.data.manifest import load_dictionaries, load_manifest

    for flag, value, least in (("--best", best, 0), ("--frequent", frequent, 0), ("--iterations", iterations, 1),
                               ("--min-count", min_count, 1), ("--min-ratio", min_ratio, 0)):
        if not least <= value < float("inf"):  # NaN and infinity too
            raise UserError(f"{flag} must be >= {least}, got {value}")
    name = _output_name(language)  # checks --language's code, with -o too
    out = output if output is not None else data_dir / name
    manifest = load_manifest(data_dir)
    check_output(out)
    src_dict, tgt_dict = load_dictionaries(data_dir, manifest)
    if language is not None:
        return _language_vocabulary(data_dir, manifest, tgt_dict, language, split, (min_count, min_ratio), out)
    src_rows, tgt_rows = sl.training_rows(data_dir, manifest, split)
    console = stderr_console()
    console.print(f"{data_dir}: IBM Model 1 on the {len(src_rows):,} sentence pairs of {split!r}, "
                  f"{iterations} EM rounds")
    with _Bars(console) as report:
        rules = sl.build(src_rows, tgt_rows, src_dict, tgt_dict, best=best, frequent=frequent,
                         iterations=iterations, identity=identity, progress=report)
    if not rules:
        raise UserError(f"{data_dir}: no rules for a shortlist: no target piece for any source piece of {split!r} "
                        f"(--best {best}, --frequent {frequent}{'' if identity else ', --no-identity'})")
    sl.write(out, rules)
    stdout = text_stdout()
    stdout.write(summary(rules, out) + "\n")
    stdout.flush()


def _output_name(language: str | None) -> str:
    """The default file name: shortlist.txt, or shortlist.LANG.txt for --language LANG, whose
    value is refused unless it is a language code (it names a file)."""
    from nmtkit.data.languages import LANG_RE

    if language is None:
        return DEFAULT_NAME
    if not LANG_RE.match(language):
        raise UserError(f"--language must be a language code such as de or pt_br, got {language!r}")
    return DEFAULT_NAME.replace(".txt", f".{language}.txt")


def _language_vocabulary(data_dir: Path, manifest: dict, tgt_dict, language: str, split: str,
                         limits: tuple[int, float], out: Path) -> None:
    """--language: write LANG's vocabulary to `out` (limits: --min-count, --min-ratio), one
    summary line on stdout."""
    from nmtkit.data import shortlist as sl

    counts = sl.language_counts(data_dir, manifest, len(tgt_dict), split)
    if language not in counts:
        raise UserError(f"--language {language}: no pair of {data_dir} translates into it (its target languages: "
                        f"{', '.join(sorted(counts))})")
    rules = sl.language_vocabulary(counts, language, tgt_dict, *limits)
    if not rules:
        raise UserError(f"{data_dir}: no target piece of {language} in {split!r} passes --min-count {limits[0]} "
                        f"and --min-ratio {limits[1]:g}")
    sl.write(out, rules)
    stdout = text_stdout()
    stdout.write(f"{out}: the {language} vocabulary, {len(rules['']):,} pieces of the {counts[language][0]:,} "
                 f"{split!r} targets in {language}, always candidates\n")
    stdout.flush()


def check_output(out: Path) -> None:
    """A shortlist sits beside the model's vocabulary, in the data directory, where no other
    command writes: there, anything but the dataset's own files (manifest, dictionaries, subword
    models, shards) may be written; elsewhere the output policy of every command applies."""
    from nmtkit.data.install import dataset_files
    from nmtkit.outputs import check_output_file

    if out.is_dir():
        raise UserError(f"--output {out} is a directory; give a file name")
    real = out.resolve()
    places = [(out.parent, out.name), (real.parent, real.name)]
    owners = [(folder, name, dataset_files(folder)) for folder, name in places]
    if all(owned is None for _, _, owned in owners):
        check_output_file(out, "--output")
        return
    for folder, name, owned in owners:
        if owned is not None and name in owned:
            raise UserError(f"--output {out} is {name}, a file of the data directory {folder}; "
                            f"choose another name (the default is {DEFAULT_NAME})")


class _Bars:
    """A bar per phase on stderr (the pass over the pairs, each EM round), as a `build` progress
    callback; no bars when stderr is no terminal (a log would keep only blank lines)."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.bars = Progress(text_column("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bars.__enter__()
        return self.report

    def __exit__(self, *exc) -> None:
        self.bars.__exit__(*exc)

    def report(self, what: str, done: int, total: int) -> None:
        if what not in self.tasks:
            self.tasks[what] = self.bars.add_task(what, total=total)
        self.bars.update(self.tasks[what], completed=done)


def summary(rules: dict[str, list[str]], out: Path) -> str:
    """The one line on stdout: keys, their mean number of targets, the always-list's size, the file."""
    keys = [k for k in rules if k]
    mean = sum(len(rules[k]) for k in keys) / len(keys) if keys else 0.0
    return (f"{out}: {len(keys):,} source keys, {mean:.1f} target pieces per key on average, "
            f"{len(rules.get('', [])):,} always-candidates")
