"""`nmtkit import-hf`: a MarianMT folder (an OPUS-MT download, or an nmtkit export) -> an nmtkit
checkpoint and a data directory, which every command then takes as it takes a trained model's.

What is read, and nothing is executed: `config.json`, the weights (`model.safetensors`, else
`pytorch_model.bin` through torch's weights-only loader), `vocab.json` (and `target_vocab.json`
when `tokenizer_config.json` says `separate_vocabs`), `source.spm` and `target.spm`.

The mapping: the weights through `mapping.from_marian` (the inverse permutation of the model
dimension), the vocabulary reordered to nmtkit's fixed special ids: nmtkit's <pad>, <s>, </s>,
<unk> (ids 0-3) take MarianMT's `pad_token_id`, `decoder_start_token_id` (OPUS-MT starts from
<pad>, so both rows are that one: the target softmax then counts it twice, which changes no
hypothesis, as both are banned, and log-probabilities by log(1 + p(<pad>)), nothing on a trained
model), `eos_token_id` and <unk>, and every other id follows in MarianMT's order. The data directory holds the two dictionaries (counts 0: the training counts
are unknown), the sentencepiece model(s) and a manifest without splits: `nmtkit preprocess
--srcdict DIR --tgtdict DIR` binarizes new text with them for scoring or fine-tuning.

Refused in one line naming the file and the setting: a folder that is not MarianMT, missing
files, pre-norm or extra layer norms (`normalize_before`, `normalize_embedding`,
`add_final_layer_norm`, or any weight the mapping does not know), position tables other than
MarianMT's sinusoids, an output bias, an activation nmtkit does not have, and
encoder and decoder of different widths.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from nmtkit.errors import UserError, first_line
from nmtkit.settings import setting

ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# MarianConfig flags that would add what nmtkit's model does not have (the value refused; a flag
# missing from config.json has MarianConfig's default)
_REFUSED_FLAGS = {
    "normalize_before": (True, "pre-norm (normalize_before)"),
    "encoder_normalize_before": (True, "pre-norm (encoder_normalize_before)"),
    "decoder_normalize_before": (True, "pre-norm (decoder_normalize_before)"),
    "normalize_embedding": (True, "a layer norm on the embeddings (normalize_embedding)"),
    "add_final_layer_norm": (True, "a final layer norm (add_final_layer_norm)"),
    "static_position_embeddings": (False, "learned positions (static_position_embeddings false)"),
}
LANG_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass
class ImportOptions:
    """Everything `nmtkit import-hf` needs; each field is one of its flags (docs/export.md)."""

    hf_dir: str = setting(flag="hf_dir", argument=True, help="A MarianMT folder (config.json, weights, vocab.json, source.spm, target.spm).")
    output: str = setting(flag="--output", aliases=("-o",), help="The checkpoint to write.")
    data_dir: str = setting(flag="--data-dir", help="The data directory to create: dictionaries and subword model(s).")
    source_lang: str | None = setting(None, flag="--source-lang", help="Source language code (default: tokenizer_config.json's).")
    target_lang: str | None = setting(None, flag="--target-lang", help="Target language code (default: tokenizer_config.json's).")
    force: bool = setting(False, flag="--force", help="Replace --output (an nmtkit checkpoint) and --data-dir (an nmtkit data directory).")


@dataclass
class Folder:
    """What a MarianMT folder holds, read and checked."""

    path: Path
    config: dict
    weights: dict[str, torch.Tensor]
    vocabs: tuple[list[str | None], list[str | None]]  # id -> token, source and target
    spm: tuple[Path, Path]
    langs: tuple[str, str]


def _shown(name: str) -> str:
    """A name from a file as one line of a message: quoted with escapes when it is empty or holds
    a line break or another character that is not printable."""
    return name if name and name.isprintable() else repr(name)


def _json(path: Path, what: str):
    if not path.is_file():
        raise UserError(f"{path}: missing; {path.parent} is not a MarianMT folder ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad UTF-8, bad JSON, 5000 digits
        raise UserError(f"{path}: not readable JSON ({first_line(e)})") from None


# the dtypes of weights the conversion computes with (float8 and the integer types it cannot)
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors, loaded without executing anything."""
    st, pt = d / "model.safetensors", d / "pytorch_model.bin"
    if st.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise UserError(f"{st}: reading it needs safetensors: pip install -e '.[hf]' in the nmtkit checkout") from None
    path = st if st.is_file() else pt
    if not path.is_file():
        raise UserError(f"{d}: no model.safetensors or pytorch_model.bin; not a MarianMT folder")
    try:
        weights = load_file(str(st)) if path == st else torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file: name it
        raise UserError(f"{path}: cannot read the weights ({type(e).__name__}: {first_line(e)})") from None
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                                for k, t in weights.items()):
        raise UserError(f"{path}: not a state dict (names -> tensors)")
    for name, t in weights.items():
        if t.dtype not in WEIGHT_DTYPES:
            raise UserError(f"{path}: weight {_shown(name)} is {t.dtype}; nmtkit imports float32, float16, bfloat16 "
                            "and float64 weights")
    return weights


def _vocab(path: Path, size: int) -> list[str | None]:
    """id -> token of a MarianTokenizer vocabulary file, `size` ids long (None: no token)."""
    data = _json(path, "MarianTokenizer's vocabulary")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object token -> id")
    out: list[str | None] = [None] * size
    for tok, i in data.items():
        if not isinstance(i, int) or not 0 <= i < size:
            raise UserError(f"{path}: id {i!r} of {tok!r} is outside the model's {size} embeddings")
        if not tok or any(c.isspace() for c in tok):
            raise UserError(f"{path}: token {tok!r} (id {i}) is empty or holds whitespace; nmtkit's dictionaries cannot hold it")
        if out[i] is not None:
            raise UserError(f"{path}: id {i} is given to both {out[i]!r} and {tok!r}")
        out[i] = tok
    return out


def _lang(flag_value: str | None, tok_cfg: dict, key: str, d: Path) -> str:
    value = flag_value if flag_value is not None else tok_cfg.get(key)
    flag = "--" + key.replace("_", "-")
    if not isinstance(value, str):
        raise UserError(f"{d / 'tokenizer_config.json'} names no {key}; give {flag}")
    if not LANG_RE.match(value):
        raise UserError(f"{flag} {value!r}: a language code is 1-32 letters, digits, '-' or '_'")
    return value


def read_folder(opts: ImportOptions) -> Folder:
    """Read and check a MarianMT folder (UserError, one line naming the file, for anything off)."""
    d = Path(opts.hf_dir)
    if not d.is_dir():
        raise UserError(f"{d}: not a directory (give a MarianMT folder)")
    config = _json(d / "config.json", "its model configuration")
    if not isinstance(config, dict) or config.get("model_type") != "marian":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise UserError(f"{d / 'config.json'}: model_type {kind!r}, not 'marian'; nmtkit import-hf reads MarianMT folders only")
    check_config(config, d / "config.json")
    spm = (d / "source.spm", d / "target.spm")
    for p in spm:
        if not p.is_file():
            raise UserError(f"{p}: missing; a MarianMT folder holds source.spm and target.spm (MarianTokenizer's models)")
    tok_cfg = _json(d / "tokenizer_config.json", "MarianTokenizer's settings") if (d / "tokenizer_config.json").is_file() else {}
    if not isinstance(tok_cfg, dict):
        raise UserError(f"{d / 'tokenizer_config.json'}: expected a JSON object of MarianTokenizer's settings")
    weights = _weights(d)
    check_vocab_sizes(config, weights, d / "config.json")
    src_size = int(config["vocab_size"])
    tgt_size = int(config.get("decoder_vocab_size") or src_size)
    src_vocab = _vocab(d / "vocab.json", src_size)
    separate = bool(tok_cfg.get("separate_vocabs"))
    tgt_vocab = _vocab(d / "target_vocab.json", tgt_size) if separate else _vocab(d / "vocab.json", tgt_size)
    langs = (_lang(opts.source_lang, tok_cfg, "source_lang", d), _lang(opts.target_lang, tok_cfg, "target_lang", d))
    if langs[0] == langs[1]:
        raise UserError(f"source and target language are both {langs[0]!r}; give --source-lang and --target-lang")
    return Folder(d, config, weights, (src_vocab, tgt_vocab), spm, langs)


def check_config(config: dict, where: Path) -> None:
    """Refuse a MarianConfig whose model nmtkit's Transformer cannot compute, naming the field."""
    for key, (bad, what) in _REFUSED_FLAGS.items():
        if config.get(key, not bad) == bad:
            raise UserError(f"{where}: {what} is not supported by nmtkit's post-norm Transformer")
    act = config.get("activation_function", "gelu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise UserError(f"{where}: activation_function {act!r} is not supported (nmtkit has {', '.join(ACTIVATIONS)})")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config.get(a) != config.get(b):
            raise UserError(f"{where}: {a} {config.get(a)!r} != {b} {config.get(b)!r}; nmtkit's encoder and decoder share these sizes")
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "vocab_size"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool) or config[key] <= 0:
            raise UserError(f"{where}: {key} must be a positive integer, got {config.get(key)!r}")
    dec = config.get("decoder_vocab_size")  # missing, null or 0: vocab_size's
    if dec is not None and (not isinstance(dec, int) or isinstance(dec, bool) or dec < 0):
        raise UserError(f"{where}: decoder_vocab_size must be a positive integer, got {dec!r}")


def check_vocab_sizes(config: dict, weights: dict[str, torch.Tensor], where: Path) -> None:
    """Refuse a vocabulary size larger than every weight matrix: the vocabularies are read into
    lists of one entry per id, which a config of a few bytes must not make as large as it says
    (the exact sizes are checked against the embeddings later)."""
    rows = max((t.shape[0] for t in weights.values() if t.dim() == 2), default=0)
    for key in ("vocab_size", "decoder_vocab_size"):
        size = config.get(key)
        if isinstance(size, int) and size > rows:
            raise UserError(f"{where}: {key} {size} is larger than every weight matrix of the model "
                            f"({rows} rows at most)")


# ---- the vocabulary: nmtkit's special ids first ---------------------------------------------------


def _special(config: dict, key: str, where: Path) -> int:
    v = config.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise UserError(f"{where}: {key} must be one token id, got {v!r}")
    return v


def vocabulary_order(vocab: list[str | None], config: dict, where: Path, source: bool) -> tuple[list[int], list[str]]:
    """(MarianMT id of each nmtkit id, nmtkit's tokens) for one side's vocabulary.

    The config's special ids are the target side's; a separate source vocabulary has its own
    <pad>, </s> and <s> (found by name); without a <s>, the <s> row, which no source holds, is
    its <pad> row."""
    from nmtkit.data.dictionary import MADEUP_FORMAT, SPECIALS

    pad = _special(config, "pad_token_id", where)
    eos = _special(config, "eos_token_id", where)
    start = pad if config.get("decoder_start_token_id") is None else _special(config, "decoder_start_token_id", where)
    if source:
        pad = vocab.index("<pad>") if "<pad>" in vocab else pad
        eos = vocab.index("</s>") if "</s>" in vocab else eos
        start = vocab.index("<s>") if "<s>" in vocab else pad
    if "<unk>" not in vocab:
        raise UserError(f"{where.parent}: the vocabulary has no <unk>")
    unk = vocab.index("<unk>")
    if any(i >= len(vocab) for i in (pad, eos, start)) or len({pad, eos, unk}) < 3 or start in (eos, unk):
        raise UserError(f"{where}: pad {pad}, eos {eos}, decoder start {start} and <unk> {unk} must be distinct "
                        f"ids (the start may be pad) below the vocabulary size {len(vocab)}")
    rest = [i for i in range(len(vocab)) if i not in (pad, start, eos, unk)]
    tokens, fill = list(SPECIALS), 0
    taken = set(t for t in vocab if t is not None)
    for i in rest:
        tok = vocab[i]
        if tok in SPECIALS:
            raise UserError(f"{where.parent}: token {tok} has id {i}, not one of the config's special ids; "
                            "nmtkit reserves it")
        while tok is None:  # an embedding row no token names: a filler, as fairseq's padding
            cand, fill = MADEUP_FORMAT.format(fill), fill + 1
            tok = None if cand in taken else cand
        tokens.append(tok)
    return [pad, start, eos, unk, *rest], tokens


# ---- the weights ---------------------------------------------------------------------------------


def sinusoids(n_pos: int, dim: int) -> torch.Tensor:
    """MarianMT's own table (`MarianSinusoidalPositionalEmbedding.create_weight`): [sin | cos]."""
    import numpy as np

    j = np.arange(dim)
    enc = np.arange(n_pos, dtype=np.float64)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
    out = torch.empty(n_pos, dim)
    half = dim // 2 + dim % 2
    out[:, :half] = torch.from_numpy(np.sin(enc[:, 0::2])).float()
    out[:, half:] = torch.from_numpy(np.cos(enc[:, 1::2])).float()
    return out


def _embeddings(f: Folder, orders) -> dict[str, torch.Tensor]:
    """The three vocabulary matrices in nmtkit's id order: src, tgt, out (equal ones stay equal)."""
    sd, where = f.weights, f.path / "model.safetensors"
    shared = sd.get("model.shared.weight")
    src = sd.get("model.encoder.embed_tokens.weight", shared)
    tgt = sd.get("model.decoder.embed_tokens.weight", shared)
    if f.config.get("share_encoder_decoder_embeddings", True) and shared is not None:
        src = tgt = shared
    if src is None or tgt is None:
        raise UserError(f"{where}: no token embeddings (model.shared.weight or model.*.embed_tokens.weight)")
    out = sd.get("lm_head.weight")
    if out is None or f.config.get("tie_word_embeddings", True):
        out = tgt
    bias = sd.get("final_logits_bias")
    if bias is not None and bool(bias.ne(0).any()):
        raise UserError(f"{where}: final_logits_bias is not zero; nmtkit's output projection has no bias")
    for name, t, order in (("source", src, orders[0]), ("target", tgt, orders[1]), ("output", out, orders[1])):
        if t.dim() != 2 or t.shape[0] != len(set(order)):
            raise UserError(f"{where}: the {name} embeddings have shape {tuple(t.shape)}, but the vocabulary "
                            f"{len(set(order))} ids")
        if t.shape[1] != f.config.get("d_model"):  # every weight is mapped through a d_model permutation
            raise UserError(f"{where}: the {name} embeddings have {t.shape[1]} columns, but config.json's d_model "
                            f"is {f.config.get('d_model')}")
    return {"src": src[orders[0]], "tgt": tgt[orders[1]], "out": out[orders[1]]}


def _share_mode(emb: dict[str, torch.Tensor], vocabs_equal: bool) -> str:
    """nmtkit's `share_embeddings` that holds these matrices exactly (copies where not tied)."""
    tied_out = torch.equal(emb["out"], emb["tgt"])
    if tied_out and vocabs_equal and torch.equal(emb["src"], emb["tgt"]):
        return "all"
    return "decoder" if tied_out else "none"


def _check_positions(f: Folder) -> None:
    """Stored position tables (older conversions save them) must be MarianMT's sinusoids."""
    for side in ("encoder", "decoder"):
        t = f.weights.get(f"model.{side}.embed_positions.weight")
        if t is None:
            continue
        if t.shape != (f.config.get("max_position_embeddings", 1024), f.config["d_model"]) or \
                not torch.allclose(t.float(), sinusoids(*t.shape), atol=1e-4):
            raise UserError(f"{f.path}: model.{side}.embed_positions.weight is not MarianMT's sinusoid table "
                            "(learned positions, or another layout); nmtkit cannot import it")


def arch_config(f: Folder, share: str, attention_bias: bool):
    """nmtkit's ArchConfig of the folder's model (a bad value: one line naming config.json)."""
    from nmtkit.models.registry import ArchConfig

    c, where = f.config, f.path / "config.json"
    positions = c.get("max_position_embeddings", 1024)
    try:
        return ArchConfig(
            encoder_layers=c["encoder_layers"], decoder_layers=c["decoder_layers"], d_model=c["d_model"],
            d_ff=c["encoder_ffn_dim"], heads=c["encoder_attention_heads"],
            dropout=_float(c, "dropout", 0.1, where), attention_dropout=_float(c, "attention_dropout", 0.0, where),
            activation_dropout=_float(c, "activation_dropout", 0.0, where), share_embeddings=share,
            max_source_positions=positions, max_target_positions=positions,
            activation=ACTIVATIONS[c.get("activation_function", "gelu")], attention_bias=attention_bias,
            scale_embedding=c.get("scale_embedding", False),  # MarianConfig's default: unscaled
        ).validate()
    except (TypeError, ValueError, UserError) as e:
        raise UserError(f"{where}: {e}") from None


def _float(config: dict, key: str, default: float, where: Path) -> float:
    """A rate of the config as a float (UserError naming the key for one that is no number)."""
    value = config.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {key} must be a number, got {value!r}") from None


def convert(f: Folder) -> tuple[object, dict[str, torch.Tensor], list[list[str]]]:
    """(ArchConfig, nmtkit state dict, [source tokens, target tokens]) of the folder's model."""
    from nmtkit.backends.huggingface.mapping import from_marian, to_marian
    from nmtkit.models.loading import check_weights
    from nmtkit.models.transformer import Transformer

    where = f.path / "config.json"
    src_order, src_tokens = vocabulary_order(f.vocabs[0], f.config, where, source=True)
    tgt_order, tgt_tokens = vocabulary_order(f.vocabs[1], f.config, where, source=False)
    _check_positions(f)
    emb = _embeddings(f, (src_order, tgt_order))
    share = _share_mode(emb, src_tokens == tgt_tokens)
    biases = [t for k, t in f.weights.items() if re.search(r"_attn\.(q|k|v|out)_proj\.bias$", k)]
    cfg = arch_config(f, share, any(bool(b.ne(0).any()) for b in biases))
    with torch.device("meta"):  # the MarianMT names this architecture has, to find foreign tensors
        known = set(to_marian(Transformer(cfg, len(src_tokens), len(tgt_tokens)).state_dict(), cfg, cfg.d_model))
    known |= {"model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
              "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    foreign = sorted(set(f.weights) - known)
    if foreign:
        raise UserError(f"{f.path}: weight {_shown(foreign[0])} has no place in nmtkit's post-norm Transformer "
                        f"(an extra layer norm or another variant){f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}")
    missing = sorted(k for k in known if k.startswith("model.") and ".layers." in k and k not in f.weights)
    if missing:
        raise UserError(f"{f.path}: weight {missing[0]} is missing")
    marian = {**f.weights, "model.shared.weight": emb["tgt"], "model.encoder.embed_tokens.weight": emb["src"],
              "model.decoder.embed_tokens.weight": emb["tgt"], "lm_head.weight": emb["out"]}
    sd = from_marian(marian, cfg, cfg.d_model)
    check_weights(sd, cfg, len(src_tokens), len(tgt_tokens), str(f.path))  # every name and shape, on the meta device
    return cfg, sd, [src_tokens, tgt_tokens]


# ---- the outputs ---------------------------------------------------------------------------------


def _check_outputs(opts: ImportOptions) -> None:
    """Refuse, before any work, a --data-dir that would overwrite what the user had (the command
    checks --output by nmtkit's output policy, `nmtkit.outputs.check_output_file`, first)."""
    from nmtkit.data.install import dataset_files

    dest = Path(opts.data_dir)
    hf = Path(opts.hf_dir).resolve()
    if dest.resolve() == hf or hf in dest.resolve().parents or dest.resolve() in hf.parents:
        raise UserError(f"--data-dir {dest} would overlap HF_DIR {opts.hf_dir}; choose another --data-dir")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        if not opts.force:
            raise UserError(f"--data-dir {dest} exists; pass --force to replace it (an nmtkit data directory only)")
        if not dest.is_dir() or dataset_files(dest) is None:
            raise UserError(f"--data-dir {dest} is not an nmtkit data directory; --force replaces only one: "
                            "choose another --data-dir")
    out = Path(opts.output).resolve()
    if dest.resolve() in out.parents:
        raise UserError(f"--output {opts.output} is inside --data-dir {dest}; write it outside")


def write_data_dir(f: Folder, tokens: list[list[str]], dest: Path, force: bool) -> dict:
    """The data directory (dictionaries, sentencepiece model(s), manifest), built beside `dest`
    and put in place at once; returns its manifest."""
    from nmtkit import __version__
    from nmtkit.data.dictionary import Dictionary
    from nmtkit.data.install import dataset_files, install, recover, remove_temp_dir, temp_dir
    from nmtkit.data.manifest import sha256_file, write_manifest

    src, tgt = f.langs
    joint = f.spm[0].read_bytes() == f.spm[1].read_bytes()
    dicts = []
    for toks in tokens:
        d = Dictionary()
        for t in toks[4:]:
            d.add_symbol(t, 0)
        dicts.append(d)
    spm_files = {src: "spm.model", tgt: "spm.model"} if joint else {src: f"spm.{src}.model", tgt: f"spm.{tgt}.model"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    recover(dest, lambda msg: None)
    tmp = temp_dir(dest)
    try:
        for lang, d in zip((src, tgt), dicts):
            d.save(tmp / f"dict.{lang}.txt")
        for lang, p in zip((src, tgt), f.spm):
            shutil.copyfile(p, tmp / spm_files[lang])
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        from nmtkit.data.subwords import SentencePieceModel

        manifest = {
            "format": "nmtkit-data", "format_version": 1, "complete": True, "nmtkit_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_lang": src, "target_lang": tgt,
            "subword": {"kind": "sentencepiece", "kinds": {src: "sentencepiece", tgt: "sentencepiece"},
                        "joint": joint, "files": spm_files,
                        "vocab_size": len(SentencePieceModel(tmp / spm_files[tgt]).pieces())},
            "dictionaries": {"joined": dicts[0] == dicts[1], src: {"file": f"dict.{src}.txt", "size": len(dicts[0])},
                             tgt: {"file": f"dict.{tgt}.txt", "size": len(dicts[1])}},
            "splits": {}, "files": files,
            "fingerprint": _sha(json.dumps(files, sort_keys=True)),
            "imported_from": {"path": str(f.path), "format": "marian",
                              "config_sha256": sha256_file(f.path / "config.json")},
        }
        write_manifest(tmp, manifest)
        install(tmp, dest, dataset_files(dest) if force and dest.exists() else None)
    except BaseException:
        remove_temp_dir(tmp)
        raise
    return manifest


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class ImportResult:
    cfg: object
    output: str
    data_dir: str
    langs: tuple[str, str]
    sizes: tuple[int, int]

    def line(self) -> str:
        c = self.cfg
        scale = "" if c.scale_embedding else "unscaled embeddings, "
        return (f"imported {c.encoder_layers}+{c.decoder_layers} layers, d_model {c.d_model}, {c.activation}, "
                f"{scale}share_embeddings {c.share_embeddings}, {self.langs[0]}->{self.langs[1]} "
                f"(vocabularies {self.sizes[0]} / {self.sizes[1]}) -> {self.output} and {self.data_dir}")


def import_hf(opts: ImportOptions, status=None) -> ImportResult:
    """Run `nmtkit import-hf`; `status(msg)` (optional) is told what is happening."""
    from nmtkit.checkpoints import save_checkpoint

    say = status or (lambda msg: None)
    if not opts.output or not opts.data_dir:
        raise UserError("--output (the checkpoint) and --data-dir (the data directory) are both required")
    _check_outputs(opts)
    say("reading the MarianMT folder")
    f = read_folder(opts)
    say("converting")
    cfg, sd, tokens = convert(f)
    say("writing the data directory and the checkpoint")
    manifest = write_data_dir(f, tokens, Path(opts.data_dir), opts.force)
    from nmtkit.data.manifest import load_dictionaries

    src_dict, tgt_dict = load_dictionaries(opts.data_dir)
    state = {
        "arch": "marian", "arch_config": cfg.to_dict(), "model": sd,
        "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256, "src_size": len(src_dict),
                         "tgt_size": len(tgt_dict), "src_lang": f.langs[0], "tgt_lang": f.langs[1]},
        "data_manifest_id": manifest["fingerprint"], "update": None, "epoch": None,
        "imported_from": manifest["imported_from"],
    }
    save_checkpoint(state, opts.output)
    return ImportResult(cfg, opts.output, opts.data_dir, f.langs, (len(src_dict), len(tgt_dict)))
