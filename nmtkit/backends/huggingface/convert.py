"""`nmtkit export --format huggingface`: a folder that `transformers` loads as a MarianMTModel.

What the folder holds (docs/export.md, "Hugging Face"):

    model.safetensors, config.json       the weights (`mapping.to_marian`) and MarianConfig
    generation_config.json               nmtkit's search defaults in transformers' terms
    source.spm, target.spm, vocab.json   MarianTokenizer's files (target_vocab.json as well when
    (target_vocab.json)                  the two sides' vocabularies or subword models differ)
    tokenizer_config.json, special_tokens_map.json
    README.md                            the model card (`nmtkit.backends.huggingface.card`)
    nmtkit.json, dict.*.txt, spm*.model  nmtkit's description and the data directory's files

Token ids are nmtkit's own (<pad> 0, <s> 1, </s> 2, <unk> 3, then the dictionary): the config
names them (`pad_token_id`, `decoder_start_token_id` = <s>, `eos_token_id`), so no row moves.
The search: nmtkit bans <pad> and <s> at every step (`suppress_tokens`), and ends a hypothesis
that reaches the output limit with </s> (`forced_eos_token_id`). transformers has only the
fairseq length penalty |Y|^alpha and fairseq's stopping rule (`early_stopping=True`), which is
`nmtkit generate --decoding fairseq`; the beam and alpha are nmtkit's defaults.

Refused in one line: what MarianMT cannot represent (pre-norm, learned positions, d_k or d_v
other than d_model / heads, different encoder and decoder... sizes) and vocabularies that
MarianTokenizer cannot read (subword-nmt, or no subword model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from nmtkit.data.languages import is_tag
from nmtkit.errors import UserError

INSTALL_HINT = "pip install -e '.[hf]' in the nmtkit checkout"
# the weight type of model.safetensors (transformers casts on load with dtype=...)
QUANTIZATIONS = ("float32", "float16", "bfloat16")
TAKES_SCORE_FILE = True  # `--score-file`: the model card reports that BLEU and its signature


def import_runtime():
    """The transformers module, or a one-line UserError saying how to install it."""
    try:
        import safetensors  # noqa: F401
        import sentencepiece  # noqa: F401
        import transformers
    except ImportError as e:
        raise UserError(f"the Hugging Face export needs transformers, safetensors and sentencepiece "
                        f"({e.name} is missing): {INSTALL_HINT}") from None
    return transformers


# ArchConfig fields the export writes (those with MarianMT's limits are checked below); a field
# added later is refused unless it has its default value, until the export learns it
HANDLED_FIELDS = frozenset({
    "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v", "normalize_before",
    "learned_pos", "share_embeddings", "max_source_positions", "max_target_positions",
    "activation", "attention_bias", "sinusoid", "decoder_start", "scale_embedding",
    "dropout", "attention_dropout", "activation_dropout", "label_smoothing", "warmup_steps",
})


def check_representable(cfg) -> None:
    """Refuse, in one line naming the setting, an architecture that MarianMT cannot express."""
    from nmtkit.models.registry import refuse_unhandled

    refuse_unhandled(cfg, HANDLED_FIELDS, "Hugging Face")
    why = None
    if cfg.normalize_before:
        why = "--normalize-before: MarianMT is post-norm only"
    elif cfg.learned_pos:
        why = "--learned-pos: MarianMT has sinusoidal positions only"
    elif cfg.sinusoid != "paper":
        why = f"--sinusoid {cfg.sinusoid}: MarianMT's position table has the paper's frequencies, from position 0"
    elif cfg.decoder_start != "bos":
        why = f"--decoder-start {cfg.decoder_start}: the export starts decoding from <s>"
    elif cfg.head_dim_k * cfg.heads != cfg.d_model or cfg.head_dim_v * cfg.heads != cfg.d_model:
        why = f"--d-k/--d-v {cfg.head_dim_k}/{cfg.head_dim_v}: MarianMT's heads are d_model / heads wide"
    if why is not None:
        raise UserError(f"{why}; export to ctranslate2 instead, or translate with the checkpoint")


def check_data(manifest: dict) -> None:
    """Refuse a data directory whose segmentation MarianTokenizer cannot reproduce (it reads
    sentencepiece models only)."""
    for lang in (manifest["source_lang"], manifest["target_lang"]):
        kind = manifest["subword"].get("kinds", {}).get(lang, manifest["subword"].get("kind"))
        if kind != "sentencepiece" or manifest["subword"]["files"].get(lang) is None:
            what = "no subword model (--bpe none)" if kind in (None, "none") else kind
            raise UserError(f"the {lang} side uses {what}: MarianTokenizer (the Hugging Face export) reads "
                            "sentencepiece models only; preprocess with --bpe sentencepiece")


def marian_config(cfg, src_size: int, tgt_size: int) -> dict:
    """MarianConfig's fields for nmtkit's `cfg` (ids: nmtkit's <pad> 0, <s> 1, </s> 2)."""
    shared = cfg.share_embeddings == "all"
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": src_size, "decoder_vocab_size": tgt_size,
        "share_encoder_decoder_embeddings": shared, "tie_word_embeddings": cfg.share_embeddings != "none",
        "d_model": cfg.d_model, "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "activation_function": cfg.activation,
        "max_position_embeddings": max(cfg.max_source_positions, cfg.max_target_positions),
        "scale_embedding": cfg.scale_embedding, "normalize_embedding": False, "static_position_embeddings": True,
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "pad_token_id": 0, "bos_token_id": 1, "decoder_start_token_id": 1, "eos_token_id": 2,
        "forced_eos_token_id": 2, "is_encoder_decoder": True,
    }


def generation_config(positions: int, beam: int = 4, lenpen: float = 0.6, banned: tuple[int, ...] = ()) -> dict:
    """nmtkit's search defaults as transformers' GenerationConfig fields (`--decoding fairseq`).
    `max_new_tokens`: what the model's `positions` allow after the start token (nmtkit's
    per-sentence limit, source length + 50, has no equivalent in a config: callers pass their
    own `max_new_tokens`, which then replaces this one without a warning). `banned`: a
    multilingual model's language tags, which no output holds (nmtkit bans them too)."""
    return {"decoder_start_token_id": 1, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "forced_eos_token_id": 2, "suppress_tokens": [0, 1, *banned], "num_beams": beam,
            "length_penalty": lenpen, "early_stopping": True, "max_new_tokens": positions - 1, "renormalize_logits": False}


def prepare(model, src_tokens: list[str], tgt_tokens: list[str]):
    """(MarianConfig fields, MarianMT state dict, vocabularies): the format's copy of `model`."""
    from nmtkit.backends.huggingface.mapping import to_marian

    cfg = model.cfg
    check_representable(cfg)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    return marian_config(cfg, len(src_tokens), len(tgt_tokens)), to_marian(sd, cfg, cfg.d_model), \
        (list(src_tokens), list(tgt_tokens))


def write(prepared, folder, quantization: str) -> dict:
    """Write model.safetensors, config.json and generation_config.json through transformers'
    own `save_pretrained` (its tensor names, ties and metadata); returns nmtkit.json's runtime."""
    import torch
    import transformers
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    config, sd, vocabs = prepared
    with torch.device("meta"):
        model = MarianMTModel(MarianConfig(**config))
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    left = [k for k in missing if "embed_positions" not in k and not _tied(k, config)]
    if left or unexpected:  # a bug of the mapping, never the user's input
        raise RuntimeError(f"MarianMT weights do not match: missing {left}, unexpected {unexpected}")
    model.tie_weights()
    for pos in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
        pos.weight = torch.nn.Parameter(pos.create_weight(), requires_grad=False)
    model = model.to(getattr(torch, quantization))
    tags = tuple(i for i, tok in enumerate(vocabs[1]) if is_tag(tok))  # a multilingual model's (>>xx<<)
    model.generation_config = GenerationConfig(**generation_config(config["max_position_embeddings"], banned=tags))
    transformers.utils.logging.disable_progress_bar()  # the export's spinner says what happens
    model.save_pretrained(str(folder))
    # MarianTokenizer's vocabularies: token -> nmtkit's id (a second file only when they differ)
    _json(Path(folder) / "vocab.json", {tok: i for i, tok in enumerate(vocabs[0])})
    if vocabs[1] != vocabs[0]:
        _json(Path(folder) / "target_vocab.json", {tok: i for i, tok in enumerate(vocabs[1])})
    return {"version": transformers.__version__, "model_type": "marian"}


def _tied(key: str, config: dict) -> bool:
    """Names that MarianMT ties to another (restored by `tie_weights`)."""
    if config["share_encoder_decoder_embeddings"] and key in (
            "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        return True
    return config["tie_word_embeddings"] and key == "lm_head.weight"


def write_extras(folder: Path, ctx) -> None:
    """MarianTokenizer's files and the model card, from the data directory (`ctx`: ExportContext)."""
    from nmtkit.backends.huggingface.card import model_card

    folder = Path(folder)
    m = ctx.manifest
    src_spm, tgt_spm = (Path(ctx.data_dir) / m["subword"]["files"][lang] for lang in (m["source_lang"], m["target_lang"]))
    shutil.copyfile(src_spm, folder / "source.spm")
    shutil.copyfile(tgt_spm, folder / "target.spm")
    # one vocabulary and one subword model: MarianTokenizer's shared mode; else its separate one
    # (which also decodes with target.spm)
    separate = (folder / "target_vocab.json").exists() or src_spm.read_bytes() != tgt_spm.read_bytes()
    if separate and not (folder / "target_vocab.json").exists():
        shutil.copyfile(folder / "vocab.json", folder / "target_vocab.json")
    _json(folder / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "source_lang": m["source_lang"], "target_lang": m["target_lang"],
        "separate_vocabs": separate, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
        "bos_token": "<s>", "model_max_length": ctx.cfg.max_source_positions,
        "clean_up_tokenization_spaces": False, "sp_model_kwargs": {}})
    _json(folder / "special_tokens_map.json",
          {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    (folder / "README.md").write_text(model_card(ctx), encoding="utf-8")


def _json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
