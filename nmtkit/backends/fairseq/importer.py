"""`nmtkit import-fairseq`: a fairseq checkpoint and its dictionaries -> an nmtkit checkpoint and
a data directory that every nmtkit command accepts.

Steps: read the checkpoint without running it (`unpickle.load`), map its architecture and
weights (`convert`), read fairseq's dictionaries into nmtkit's symbol order, check that they fit
the embeddings, then write the data directory (dictionaries, the subword model, the Moses
setting; built beside DATA_DIR and swapped in, nmtkit.data.install) and the checkpoint (a
temporary file renamed into place). Options take fairseq's names where it has them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nmtkit import __version__
from nmtkit.data.dictionary import SPECIALS, Dictionary
from nmtkit.errors import UserError
from nmtkit.settings import setting

BPE_NAMES = {"sentencepiece": "sentencepiece", "subword_nmt": "subword-nmt", "subword-nmt": "subword-nmt"}
OVERWRITE_FLAG = "#fairseq:overwrite"


@dataclass
class ImportOptions:
    checkpoint: str = setting(flag="checkpoint", argument=True, help="The fairseq checkpoint (model.pt, checkpoint_best.pt).")
    output: str = setting(flag="--output", aliases=("-o",), help="The nmtkit checkpoint to write.")
    data_dir: str = setting(flag="--data-dir", help="The nmtkit data directory to write (dictionaries, subword model).")
    data: str | None = setting(default=None, flag="--data", help="fairseq's data directory holding dict.SRC.txt and "
                               "dict.TGT.txt (default: the checkpoint's folder).")
    source_lang: str | None = setting(default=None, flag="--source-lang", aliases=("-s",),
                                      help="Source language (default: the checkpoint's).")
    target_lang: str | None = setting(default=None, flag="--target-lang", aliases=("-t",),
                                      help="Target language (default: the checkpoint's).")
    srcdict: str | None = setting(default=None, flag="--srcdict", help="The source dictionary (default: DATA/dict.SRC.txt).")
    tgtdict: str | None = setting(default=None, flag="--tgtdict", help="The target dictionary (default: DATA/dict.TGT.txt).")
    bpe: str | None = setting(default=None, flag="--bpe", help="The subword model the checkpoint was trained with: "
                              "sentencepiece or subword_nmt (default: none, input given as the model's tokens).")
    sentencepiece_model: str | None = setting(default=None, flag="--sentencepiece-model",
                                              help="With --bpe sentencepiece: the model file.")
    bpe_codes: str | None = setting(default=None, flag="--bpe-codes", help="With --bpe subword_nmt: the codes file.")
    tokenizer: str | None = setting(default=None, flag="--tokenizer", help="moses: Moses tokenization (sacremoses) "
                                    "before the subword model, detokenization after it (WMT models).")
    moses_source_lang: str | None = setting(default=None, flag="--moses-source-lang",
                                            help="Moses' source language (default: --source-lang).")
    moses_target_lang: str | None = setting(default=None, flag="--moses-target-lang",
                                            help="Moses' target language (default: --target-lang).")
    moses_no_dash_splits: bool = setting(default=False, flag="--moses-no-dash-splits",
                                         help="Do not split hyphens (fairseq splits them: tokenizer.perl -a).")
    moses_no_escape: bool = setting(default=False, flag="--moses-no-escape",
                                    help="Do not escape special characters (fairseq escapes them).")
    force: bool = setting(default=False, flag="--force", help="Replace an existing nmtkit data directory DATA_DIR.")

    def validate(self) -> None:
        if self.bpe is not None and self.bpe not in BPE_NAMES:
            raise UserError(f"--bpe {self.bpe}: nmtkit imports sentencepiece or subword_nmt")
        kind = BPE_NAMES.get(self.bpe or "")
        if kind == "sentencepiece" and not self.sentencepiece_model:
            raise UserError("--bpe sentencepiece needs --sentencepiece-model FILE")
        if kind == "subword-nmt" and not self.bpe_codes:
            raise UserError("--bpe subword_nmt needs --bpe-codes FILE")
        for flag, value, need in (("--sentencepiece-model", self.sentencepiece_model, "sentencepiece"),
                                  ("--bpe-codes", self.bpe_codes, "subword-nmt")):
            if value and kind != need:
                raise UserError(f"{flag} is given but --bpe is {self.bpe or 'not given'}; add --bpe "
                                f"{'subword_nmt' if need == 'subword-nmt' else need}")
            if value and not Path(value).is_file():
                raise UserError(f"{flag} {value}: file not found")
        if self.tokenizer not in (None, "moses"):
            raise UserError(f"--tokenizer {self.tokenizer}: nmtkit imports moses (or none)")
        if self.tokenizer is None and (self.moses_source_lang or self.moses_target_lang):
            raise UserError("--moses-source-lang / --moses-target-lang need --tokenizer moses")


@dataclass
class ImportResult:
    arch: str
    config: dict
    src_lang: str
    tgt_lang: str
    src_size: int
    tgt_size: int
    params: int


def read_fairseq_dictionary(path: Path, flag: str) -> Dictionary:
    """fairseq's `dict.txt` (`token count [#fairseq:overwrite]` per line) in nmtkit's symbol order.

    fairseq puts its four specials first (`<s> <pad> </s> <unk>`) and the file's tokens after
    them, so token i of the file is id 4 + i in both; only the specials' order differs (the
    weights' rows are swapped to match, `convert.permute_rows`)."""
    if not path.is_file():
        raise UserError(f"{flag} {path}: dictionary not found")
    d = Dictionary()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    for lineno, line in enumerate(lines, start=1):
        overwrite = line.endswith(" " + OVERWRITE_FLAG)
        if overwrite:
            line = line[: -len(OVERWRITE_FLAG) - 1]
        tok, sep, cnt = line.rpartition(" ")
        if not sep or not tok or not cnt.lstrip("-").isdigit():
            raise UserError(f"{path}:{lineno}: malformed dictionary line {line[:60]!r} (expected 'token count')")
        if tok in SPECIALS or (tok in d and not overwrite):
            raise UserError(f"{path}:{lineno}: duplicate token {tok!r} (fairseq needs {OVERWRITE_FLAG} for it)")
        if tok in d:
            raise UserError(f"{path}:{lineno}: {tok!r} overwrites an earlier entry, which shifts the ids; "
                            "nmtkit cannot import such a dictionary")
        d.add_symbol(tok, max(int(cnt), 0))
    return d


def _check_outputs(opts: ImportOptions) -> None:
    """--data-dir's own checks (the command applies nmtkit.outputs' policy to --output first)."""
    if Path(opts.output).is_dir():
        raise UserError(f"--output {opts.output} is a directory; give a file name")
    dest = Path(opts.data_dir)
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--data-dir {dest} exists and is not a directory")
    if Path(opts.output).resolve().parent == dest.resolve():
        raise UserError(f"--output {opts.output} is inside --data-dir {dest}; write the checkpoint outside it")


def _languages(opts: ImportOptions, args: dict, where: str) -> tuple[str, str]:
    src = opts.source_lang or args.get("source_lang")
    tgt = opts.target_lang or args.get("target_lang")
    if not src or not tgt:
        raise UserError(f"{where} does not record its languages; give --source-lang and --target-lang")
    if src == tgt:
        raise UserError(f"--source-lang and --target-lang are both {src!r}")
    return str(src), str(tgt)


def _dictionaries(opts: ImportOptions, src: str, tgt: str) -> tuple[Dictionary, Dictionary]:
    data = Path(opts.data) if opts.data else Path(opts.checkpoint).parent
    src_path = Path(opts.srcdict) if opts.srcdict else data / f"dict.{src}.txt"
    tgt_path = Path(opts.tgtdict) if opts.tgtdict else data / f"dict.{tgt}.txt"
    src_dict = read_fairseq_dictionary(src_path, "--srcdict" if opts.srcdict else "source dictionary")
    tgt_dict = src_dict if tgt_path.resolve() == src_path.resolve() else read_fairseq_dictionary(
        tgt_path, "--tgtdict" if opts.tgtdict else "target dictionary")
    return src_dict, tgt_dict


def _check_sizes(sd: dict, cfg, src_dict: Dictionary, tgt_dict: Dictionary, where: str) -> None:
    for side, name, d in (("source", "encoder.embed_tokens.weight", src_dict),
                          ("target", "decoder.embed_tokens.weight", tgt_dict)):
        rows = sd[name].size(0) if name in sd else None
        if rows != len(d):
            raise UserError(f"{where}: the {side} dictionary has {len(d)} symbols (with fairseq's 4 specials) "
                            f"but {name} has {rows} rows: not this model's dictionary")
    if cfg.share_embeddings == "all" and src_dict.symbols != tgt_dict.symbols:
        raise UserError(f"{where} shares all embeddings (--share-all-embeddings) but the source and target "
                        "dictionaries differ; give the joined dictionary for both")


def import_fairseq(opts: ImportOptions, log: Callable[[str], None] = lambda m: None) -> ImportResult:
    """Run the import (module docstring); nothing is written unless every check passed."""
    import torch

    from nmtkit.backends.fairseq import convert, unpickle
    from nmtkit.checkpoints import FORMAT_VERSION, MAGIC, check_finite, save_checkpoint
    from nmtkit.models.loading import check_weights

    opts.validate()
    _check_outputs(opts)
    where = opts.checkpoint
    state = unpickle.load(opts.checkpoint)
    sd = state.get("model")
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{where}: no model weights (a dict of tensors under 'model')")
    args = convert.model_args({k: unpickle.plain(state.get(k)) for k in ("args", "cfg")})
    cfg = convert.arch_config(args, where)
    src, tgt = _languages(opts, args, where)
    src_dict, tgt_dict = _dictionaries(opts, src, tgt)
    _check_sizes(sd, cfg, src_dict, tgt_dict, where)
    weights = convert.weights(sd, cfg, where)
    check_weights(weights, cfg, len(src_dict), len(tgt_dict), where)
    check_finite(weights, "model", where, "it cannot be imported")
    log(f"{where}: fairseq arch {args['arch']}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
        f"{'pre' if cfg.normalize_before else 'post'}-norm, shared embeddings: {cfg.share_embeddings}")
    manifest = _write_data_dir(opts, src, tgt, src_dict, tgt_dict, log)
    progress = _progress(state)
    out = {
        MAGIC: FORMAT_VERSION, "arch": f"fairseq_{args['arch']}", "arch_config": cfg.to_dict(), "model": weights,
        "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256, "src_size": len(src_dict),
                         "tgt_size": len(tgt_dict), "src_lang": src, "tgt_lang": tgt},
        "data_manifest_id": hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest(),
        **progress,
        "imported_from": {"format": "fairseq", "file": Path(opts.checkpoint).name, "arch": str(args["arch"])},
    }
    save_checkpoint(out, opts.output)
    params = sum(t.numel() for t in {id(t): t for t in weights.values()}.values())
    return ImportResult(str(args["arch"]), cfg.to_dict(), src, tgt, len(src_dict), len(tgt_dict), params)


def _progress(state: dict) -> dict:
    """Updates and epoch of the fairseq run, when the checkpoint says (for `nmtkit` summaries)."""
    from nmtkit.backends.fairseq.unpickle import plain

    out = {}
    history = plain(state.get("optimizer_history"))
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        n = history[-1].get("num_updates")
        if isinstance(n, int) and not isinstance(n, bool):
            out["update"] = n
    extra = plain(state.get("extra_state"))
    if isinstance(extra, dict) and isinstance(extra.get("train_iterator"), dict):
        e = extra["train_iterator"].get("epoch")
        if isinstance(e, int) and not isinstance(e, bool):
            out["epoch"] = e
    return out


def _subword_entry(opts: ImportOptions, src: str, tgt: str) -> tuple[dict, dict[str, Path]]:
    """The manifest's `subword` entry and the files to copy (joint: one model for both sides)."""
    from nmtkit.data.subwords import model_filename

    kind = BPE_NAMES.get(opts.bpe or "", "none")
    source = opts.sentencepiece_model if kind == "sentencepiece" else opts.bpe_codes if kind == "subword-nmt" else None
    name = model_filename(kind, None)
    files = {name: Path(source)} if name else {}
    entry = {"kind": kind, "kinds": {src: kind, tgt: kind}, "joint": True,
             "files": {src: name, tgt: name} if name else {}}
    if opts.tokenizer == "moses":
        entry["pretokenizer"] = {"kind": "moses", "langs": {src: opts.moses_source_lang or src,
                                                            tgt: opts.moses_target_lang or tgt},
                                 "aggressive_dash_splits": not opts.moses_no_dash_splits,
                                 "escape": not opts.moses_no_escape}
    return entry, files


def _write_data_dir(opts: ImportOptions, src: str, tgt: str, src_dict: Dictionary, tgt_dict: Dictionary,
                    log: Callable[[str], None]) -> dict:
    """Build the data directory beside DATA_DIR and swap it in (nmtkit.data.install); its manifest last."""
    from nmtkit.data import install
    from nmtkit.data.manifest import FORMAT_VERSION, sha256_file, write_manifest
    from nmtkit.data.subwords import load_model_file

    dest = Path(opts.data_dir)
    install.recover(dest, log)
    owned: set[str] | None = set()
    if dest.is_dir() and any(dest.iterdir()):
        owned = install.dataset_files(dest)
        if not opts.force:
            raise UserError(f"--data-dir {dest} is not empty; pass --force to replace the nmtkit data directory there")
        install.check_replaceable(dest, owned)
    sub, copies = _subword_entry(opts, src, tgt)
    for name, path in copies.items():  # refuse a model its library cannot load before writing anything
        load_model_file(sub["kind"], path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = install.temp_dir(dest)
    try:
        for name, path in copies.items():
            shutil.copyfile(path, tmp / name)
        joined = src_dict.symbols == tgt_dict.symbols
        src_dict.save(tmp / f"dict.{src}.txt")
        (tgt_dict if not joined else src_dict).save(tmp / f"dict.{tgt}.txt")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        manifest = {
            "format": install.FORMAT_NAME, "format_version": FORMAT_VERSION, "complete": True,
            "nmtkit_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source_lang": src, "target_lang": tgt, "subword": sub,
            "dictionaries": {"joined": joined, src: {"file": f"dict.{src}.txt", "size": len(src_dict)},
                             tgt: {"file": f"dict.{tgt}.txt", "size": len(tgt_dict)}},
            "splits": {}, "files": files,
            "imported_from": {"format": "fairseq", "checkpoint": Path(opts.checkpoint).name},
        }
        write_manifest(tmp, manifest)
        install.install(tmp, dest, owned)
    except BaseException:
        install.remove_temp_dir(tmp)
        raise
    return manifest
