"""The model card (README.md) of a Hugging Face export: what the data directory and the checkpoint
know, with the Hub's front matter (languages, metrics) so that the Hub can index it.

Why built from the export's inputs only: a card must not claim what nobody measured. The BLEU
line appears only when the user passes the output of `nmtkit score` (`--score-file`), and it is
copied with its sacreBLEU signature, which says how it was computed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from nmtkit.errors import UserError

_BLEU_LINE = re.compile(r"^BLEU = (?P<score>[0-9.]+)\b.*?\| (?P<sig>nrefs:[^ ]+)")


def read_score(path: str) -> tuple[float, str, int | None]:
    """(BLEU, sacreBLEU signature, lines) from `nmtkit score`'s output (text, or --json);
    UserError naming the file when it holds no BLEU line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--score-file {path}: cannot read it ({e})") from None
    for line in text.splitlines():
        m = _BLEU_LINE.match(line)
        if m:
            lines = re.search(r"\| lines: (\d+)", line)
            return float(m.group("score")), m.group("sig"), int(lines.group(1)) if lines else None
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            for s in obj.get("scores", []) if isinstance(obj, dict) else []:
                if isinstance(s, dict) and s.get("metric") == "bleu":
                    return float(s["score"]), str(s["signature"]), s.get("lines")
    raise UserError(f"--score-file {path}: no BLEU line (give the output of nmtkit score, with the bleu metric)")


def _data_lines(m: dict) -> tuple[str, str]:
    """(a name for the training data, its size) from the manifest."""
    train = m.get("splits", {}).get("train", {})
    prefix = (m.get("options") or {}).get("trainpref")
    name = Path(prefix).name if prefix else "unknown"
    parent = Path(prefix).parent.name if prefix else ""
    size = f"{train.get('sentences', '?')} sentence pairs"
    tokens = train.get("tokens") or {}
    if tokens:
        size += " (" + ", ".join(f"{tokens[k]} {k} tokens" for k in tokens) + ")"
    return (f"{parent}/{name}" if parent else name), size


def file_name(path: str) -> str:
    """A path as the card shows it: its last component only (a card is published, and the
    folders of the exporting machine are nobody's business); `.` is the folder's own name."""
    return Path(os.path.abspath(path)).name


def export_command(opts) -> str:
    """The `nmtkit export` command line of `opts` (the flags that shape the result), each path
    by its name alone (`file_name`)."""
    args = ["nmtkit", "export", file_name(opts.data_dir), "--path", file_name(opts.path), "--format", opts.format,
            "--output", file_name(opts.output)]
    if opts.quantization != "float32":
        args += ["--quantization", opts.quantization]
    if opts.ema:
        args.append("--ema")
    if opts.score_file:
        args += ["--score-file", file_name(opts.score_file)]
    return " ".join(shlex.quote(str(a)) for a in args)


def _front_matter(ctx, bleu) -> list[str]:
    src, tgt = ctx.manifest["source_lang"], ctx.manifest["target_lang"]
    out = ["---", "language:", f"- {src}", f"- {tgt}", "library_name: transformers", "pipeline_tag: translation",
           "tags:", "- translation", "- marian", "- nmtkit"]
    if bleu is not None:
        out += ["model-index:", f"- name: {file_name(ctx.opts.output)}", "  results:",
                "  - task:", "      type: translation", f"      name: Translation {src}-{tgt}",
                "    metrics:", "    - type: bleu", f"      value: {bleu[0]}", "      name: BLEU",
                f"      args: {json.dumps(bleu[1])}"]
    return out + ["---", ""]


def model_card(ctx) -> str:
    """README.md's text (`ctx`: nmtkit.backends.export.ExportContext)."""
    from nmtkit import __version__

    m, meta, cfg = ctx.manifest, ctx.meta, ctx.cfg
    src, tgt = m["source_lang"], m["target_lang"]
    bleu = read_score(ctx.opts.score_file) if ctx.opts.score_file else None
    data_name, data_size = _data_lines(m)
    command = export_command(ctx.opts) if ctx.command is None else ctx.command
    lines = _front_matter(ctx, bleu) + [
        f"# {src} -> {tgt} Transformer (nmtkit, MarianMT format)", "",
        f"A post-norm Transformer ({cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
        f"d_ff {cfg.d_ff}, {cfg.heads} heads, {cfg.activation}) trained with nmtkit {m.get('nmtkit_version', '?')}, "
        f"exported with nmtkit {__version__}.", "",
        f"- training data: {data_name}, {data_size}",
        f"- updates: {meta.get('update') if meta.get('update') is not None else 'not recorded (an imported model)'}" + (f" (average of {len(meta['averaged_from'])} checkpoints)"
                                              if meta.get("averaged_from") else "")
        + (", EMA weights" if ctx.opts.ema else ""),
        f"- subword model: sentencepiece ({m['subword'].get('vocab_size', '?')} pieces"
        + (", joint" if m["subword"].get("joint") else "") + ")",
        f"- checkpoint: {file_name(ctx.opts.path)} (sha256 {meta['sha256']})",
        f"- exported by: `{command}`",
    ]
    if bleu is not None:
        lines.append(f"- BLEU: {bleu[0]:.2f} (sacreBLEU {bleu[1]}" + (f", {bleu[2]} lines" if bleu[2] else "") + ")")
    lines += ["", "## Use", "", "```python", "from transformers import MarianMTModel, MarianTokenizer", "",
              'tok = MarianTokenizer.from_pretrained("PATH")', 'model = MarianMTModel.from_pretrained("PATH")', "",
              "def translate(line):", '    ids = tok(line, return_tensors="pt").input_ids',
              "    out = model.generate(ids, max_new_tokens=ids.shape[1] - 1 + 50 + 1)  # source tokens + 50, then </s>",
              "    return tok.decode(out[0], skip_special_tokens=True)", "```", "",
              "generation_config.json holds nmtkit's search defaults (beam 4, length penalty 0.6) with fairseq's "
              "length penalty and stopping rule: this gives the lines of `nmtkit generate --decoding fairseq`, "
              "except where a hypothesis reaches the output limit (docs/export.md of nmtkit).", ""]
    return "\n".join(lines)
