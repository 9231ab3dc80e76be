"""`nmtkit generate`: flag parsing for nmtkit.generation.generator (docs/generate.md)."""

from __future__ import annotations

from typing import List, Optional

import typer

from nmtkit.cli.app import app


@app.command("generate")
def generate_command(
    data_dir: str = typer.Argument(..., help="Preprocessed data directory (dictionaries, subword model, splits)."),
    path: List[str] = typer.Option(..., "--path", help="Checkpoint; give it several times for an ensemble."),
    gen_subset: Optional[str] = typer.Option(None, "--gen-subset", help="Binarized split to translate [default: test]."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Raw text to translate, one sentence per line (FILE, FILE.gz or - for stdin); segmented with the data dir's subword model."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write here (atomically) instead of stdout."),
    format: str = typer.Option("plain", "--format", help="plain: one detokenized hypothesis per line; fairseq: S-/T-/H-/D-/P- lines."),
    nbest: int = typer.Option(1, "--nbest", help="Hypotheses to output per sentence (<= --beam)."),
    print_scores: bool = typer.Option(False, "--print-scores", help="plain format: prefix each line with its score and a tab."),
    beam: int = typer.Option(4, "--beam", help="Beam size; 1 = greedy search; with --sampling the number of samples."),
    lenpen: float = typer.Option(0.6, "--lenpen", help="Length penalty exponent alpha (0 = none)."),
    lenpen_form: str = typer.Option("gnmt", "--lenpen-form", help="gnmt: ((5+|Y|)/6)^alpha (paper, tensor2tensor); fairseq: |Y|^alpha."),
    max_len_a: float = typer.Option(1.0, "--max-len-a", help="Output limit a*src_len+b tokens (before </s>): a."),
    max_len_b: Optional[int] = typer.Option(None, "--max-len-b", help="Output limit a*src_len+b tokens (before </s>): b [default: 50; 300 for a parsing data dir].", show_default=False),
    min_len: int = typer.Option(0, "--min-len", help="Minimum output tokens before </s>."),
    no_repeat_ngram_size: int = typer.Option(0, "--no-repeat-ngram-size", help="Never repeat an n-gram of this size in a hypothesis (0 = off)."),
    unk_penalty: float = typer.Option(0.0, "--unk-penalty", help="Subtracted from the log-prob of <unk> (negative: a reward)."),
    early_stop: str = typer.Option("bound", "--early-stop", help="When a sentence stops: bound (exact: no live hypothesis can still win; tensor2tensor), beam (fairseq: once --beam hypotheses finished; faster, not exact) or none (at the output limit)."),
    sampling: bool = typer.Option(False, "--sampling", help="Sample instead of searching (--beam samples per sentence)."),
    topk: int = typer.Option(0, "--topk", help="Sampling: only from the k most likely tokens (0 = off)."),
    topp: float = typer.Option(0.0, "--topp", help="Sampling: only from the smallest set with probability >= p (0 = off)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling: divide log-probs by this before sampling."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Batch limit in padded source tokens."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Batch limit in sentences [default: 128 unless --max-tokens]."),
    buffer_size: int = typer.Option(10000, "--buffer-size", help="Sentences read, sorted and translated at a time (1 for interactive use)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 or fp16 (weights and activations; scores in fp32)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads for torch (0 = torch's default)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (sampling)."),
    ema: bool = typer.Option(False, "--ema", help="Use the checkpoints' EMA weights instead of the raw weights."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary line on stderr."),
) -> None:
    """Translate a binarized split or raw text with beam search (the paper: beam 4, lenpen 0.6).

    Output: one detokenized hypothesis per input line, in input order, so that
    `nmtkit generate ... | nmtkit score --ref REF` works.
    """
    from rich.console import Console

    from nmtkit.generation.generator import GenerateOptions, check_search_flags, default_max_len_b, generate
    from nmtkit.generation.search import SearchConfig

    if max_len_b is None:
        max_len_b = default_max_len_b(data_dir)

    check_search_flags(
        beam=beam, nbest=nbest, lenpen_form=lenpen_form, early_stop=early_stop, max_len_a=max_len_a, max_len_b=max_len_b,
        min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, sampling=sampling, topk=topk,
        topp=topp, temperature=temperature,
    )
    search = SearchConfig(
        beam=beam, lenpen=lenpen, lenpen_form=lenpen_form, max_len_a=max_len_a, max_len_b=max_len_b,
        min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, unk_penalty=unk_penalty, nbest=nbest,
        early_stop=early_stop, sampling=sampling, topk=topk, topp=topp, temperature=temperature,
        seed=seed,
    )
    opts = GenerateOptions(
        data_dir=data_dir, paths=list(path), gen_subset=gen_subset, input=input, output=output, format=format,
        print_scores=print_scores, search=search, max_tokens=max_tokens, batch_size=batch_size,
        buffer_size=buffer_size, device=device, precision=precision, threads=threads, seed=seed, ema=ema,
        progress=not quiet,
    )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    stats = generate(opts, warn=lambda msg: err.print(f"nmtkit: warning: {msg}", style="yellow", markup=False))
    if not quiet:
        err.print(stats.line(), markup=False)
