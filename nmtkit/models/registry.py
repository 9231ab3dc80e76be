"""`ArchConfig` and the named architectures (Table 3, the parsing model, distillation students).

Why a registry of frozen dataclasses: every experiment of the paper is "base, with one thing
changed". A named, immutable config makes each of them one `--arch NAME`, is stored verbatim in
checkpoints (`dataclasses.asdict(cfg)`, rebuilt with `ArchConfig.from_dict`), and every change goes
through `replace()`, which validates, so a bad combination is refused before any work is done.

The config also carries the two *training* defaults that Table 3 / SPEC.md tie to an architecture:
`label_smoothing` (Table 3 row D varies it) and `warmup_steps` (16000 for the parsing model). The
trainer reads them as defaults; its own flags override them.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from nmtkit.errors import UserError
from nmtkit.settings import check_number

SHARE_MODES = ("all", "decoder", "none")
# the feed-forward network's activation: the paper's ReLU; swish (SiLU) and GELU for imported models
# (OPUS-MT's MarianMT models use swish)
ACTIVATIONS = ("relu", "swish", "gelu")
SINUSOID_FORMS = ("paper", "fairseq")
DECODER_STARTS = ("bos", "eos")

# ---- the largest values a config may hold ---------------------------------------------------------
# Why: a config is also read from files anyone can write (a checkpoint's `arch_config`, an export's
# nmtkit.json), and loading builds what it describes. The stored tensors are checked against the
# config (`nmtkit.models.loading.check_weights`), which bounds every size they back; but the
# sinusoid position tables are computed, not stored: without a limit, `max_source_positions = 2**22`
# in a checkpoint of 0.3 MB takes 4.4 GB and 22 s to load. Each limit is far above every named
# architecture (transformer_big: 6+6 layers, d_model 1024, d_ff 4096, 16 heads, 1024 positions;
# transformer_base_h1_dk512: one head of 512); within them, what loading allocates besides the
# file's own tensors stays small (a sinusoid table: 64 MiB at most). The same limits hold for the
# flags of `nmtkit train`, so a model that trains also loads.
MAX_LAYERS = 1024  # per stack: 170 times transformer_big's 6
MAX_D_MODEL = 16384  # 16 times transformer_big's 1024
MAX_D_FF = 65536  # 16 times transformer_big's 4096
MAX_HEADS = 256  # 16 times transformer_big's 16 (no tensor backs them: attention scores grow with them)
MAX_HEAD_DIM = 16384  # d_k, d_v: one head as wide as the widest model
MAX_POSITIONS = 65536  # per side: 64 times the 1024 of every named architecture
# values of one sinusoid table (max positions x d_model), computed at load: 64 MiB in float32 (256 MiB
# while computed in float64), which transformer_big reaches with 16384 positions, 16 times its 1024;
# learned tables are stored, so checked as tensors
MAX_SINUSOID_VALUES = 2**24

# string fields and the values each may take
FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    "share_embeddings": SHARE_MODES, "activation": ACTIVATIONS, "sinusoid": SINUSOID_FORMS,
    "decoder_start": DECODER_STARTS,
}

LIMITS: dict[str, int] = {
    "encoder_layers": MAX_LAYERS, "decoder_layers": MAX_LAYERS, "d_model": MAX_D_MODEL, "d_ff": MAX_D_FF,
    "heads": MAX_HEADS, "d_k": MAX_HEAD_DIM, "d_v": MAX_HEAD_DIM,
    "max_source_positions": MAX_POSITIONS, "max_target_positions": MAX_POSITIONS,
}

# Help text for every field: used by `nmtkit archs NAME`, by the train CLI's override flags
# (see `arch_field_specs`) and by docs/archs.md.
FIELD_HELP: dict[str, str] = {
    "encoder_layers": "number of encoder layers (N)",
    "decoder_layers": "number of decoder layers (N)",
    "d_model": "model (embedding and residual) width",
    "d_ff": "inner size of the position-wise feed-forward network",
    "heads": "number of attention heads (h)",
    "d_k": "per-head query/key size; unset = d_model / heads (Table 3 row B sets it alone)",
    "d_v": "per-head value size; unset = d_model / heads",
    "dropout": "residual dropout: on each sub-layer output and on embeddings + positions (P_drop)",
    "attention_dropout": "dropout on the attention weights",
    "activation_dropout": "dropout after the feed-forward ReLU",
    "normalize_before": "pre-norm (LayerNorm before each sub-layer, plus a final one); paper: post-norm",
    "learned_pos": "learned position embeddings instead of sinusoids (Table 3 row E)",
    "share_embeddings": "tie 'all' (source emb = target emb = output projection; needs a joint "
    "vocabulary, i.e. preprocess --joined-dictionary), 'decoder' (target emb = output "
    "projection) or 'none'",
    "max_source_positions": "longest source (in tokens, with </s>) the model accepts",
    "max_target_positions": "longest target (in tokens, with <s>) the model accepts",
    "encoder_no_residual_layer": "encoder layer (1 = the first) whose self-attention sub-layer has no "
    "residual connection, so that its outputs stop following the source's positions (Liu et al., 2021: "
    "better zero-shot translation in multilingual models); unset: none",
    "activation": "feed-forward activation: relu (the paper), swish (SiLU) or gelu",
    "attention_bias": "biases on the attention projections (imported models: MarianMT, fairseq); paper: none",
    "sinusoid": "sinusoid table: 'paper' (sin/cos interleaved, positions from 0) or 'fairseq' (sin|cos "
    "halves, frequencies over half_dim-1, positions from 2 = fairseq's padding_idx+1)",
    "decoder_start": "first decoder input: 'bos' (<s>, nmtkit) or 'eos' (</s>, as fairseq decodes)",
    "scale_embedding": "multiply token embeddings by sqrt(d_model) (the paper); off: by 1 (imported models: "
    "MarianConfig's scale_embedding false)",
    "label_smoothing": "training default: label smoothing eps_ls",
    "warmup_steps": "training default: learning-rate warmup steps",
}


@dataclass(frozen=True)
class ArchConfig:
    """The hyper-parameters of one Transformer encoder-decoder (defaults = the paper's base)."""

    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    normalize_before: bool = False
    learned_pos: bool = False
    share_embeddings: str = "all"
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    # for zero-shot directions of multilingual models (Liu et al., 2021); unset: every layer has both
    encoder_no_residual_layer: int | None = None
    # imported models where they differ from the paper's (import-hf, import-fairseq set them)
    activation: str = "relu"
    attention_bias: bool = False
    sinusoid: str = "paper"
    decoder_start: str = "bos"
    scale_embedding: bool = True
    label_smoothing: float = 0.1
    warmup_steps: int = 4000

    def __post_init__(self) -> None:
        # Store 0 as 0.0 in float fields so that configs compare and serialize identically.
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if _field_type(f) is float and isinstance(v, int) and not isinstance(v, bool):
                object.__setattr__(self, f.name, float(v))

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        """The per-head query/key size actually used (d_k, or d_model / heads)."""
        return self.d_k if self.d_k is not None else self.d_model // self.heads

    @property
    def head_dim_v(self) -> int:
        """The per-head value size actually used (d_v, or d_model / heads)."""
        return self.d_v if self.d_v is not None else self.d_model // self.heads

    # ---- validation and derivation -----------------------------------------------------------
    def validate(self) -> "ArchConfig":
        """Raise UserError naming the flag if the combination cannot build a model; return self."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and _field_optional(f):
                continue
            want = _field_type(f)
            if want is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            elif want is int:
                ok = isinstance(v, int) and not isinstance(v, bool)
            else:
                ok = isinstance(v, want)
            if not ok:
                raise UserError(f"{_flag(f.name)} must be {want.__name__}, got {v!r}")
            if want is float:
                check_number(_flag(f.name), float(v))  # finite and float32-sized
        for name in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads",
                     "max_source_positions", "max_target_positions"):
            if getattr(self, name) <= 0:
                raise UserError(f"{_flag(name)} must be a positive integer, got {getattr(self, name)}")
        for name in ("d_k", "d_v"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise UserError(f"{_flag(name)} must be a positive integer, got {v}")
        n = self.encoder_no_residual_layer
        if n is not None and not 1 <= n <= self.encoder_layers:
            raise UserError(f"--encoder-no-residual-layer must name one of the {self.encoder_layers} encoder "
                            f"layers (1 to {self.encoder_layers}), got {n}")
        self._check_limits()
        if (self.d_k is None or self.d_v is None) and self.d_model % self.heads != 0:
            raise UserError(
                f"--d-model {self.d_model} is not divisible by --heads {self.heads} "
                f"(d_k = d_v = d_model / heads unless --d-k and --d-v are given)"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise UserError(f"{_flag(name)} must be in [0, 1), got {v}")
        if self.warmup_steps < 0:
            raise UserError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if self.share_embeddings not in SHARE_MODES:
            raise UserError(
                f"--share-embeddings must be one of {', '.join(SHARE_MODES)}, got {self.share_embeddings!r}"
            )
        for name, choices in FIELD_CHOICES.items():
            if getattr(self, name) not in choices:
                raise UserError(f"{_flag(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        return self

    def _check_limits(self) -> None:
        """Refuse a value above its limit (`LIMITS`), and sinusoid tables over `MAX_SINUSOID_VALUES`."""
        for name, most in LIMITS.items():
            v = getattr(self, name)
            if v is not None and v > most:
                raise UserError(f"{_flag(name)} must be at most {most}, got {v}")
        if not self.learned_pos:
            for name in ("max_source_positions", "max_target_positions"):
                if getattr(self, name) * self.d_model > MAX_SINUSOID_VALUES:
                    raise UserError(
                        f"{_flag(name)} {getattr(self, name)} x --d-model {self.d_model}: its sinusoid table "
                        f"would hold more than {MAX_SINUSOID_VALUES} values (64 MiB); use fewer positions"
                    )

    def replace(self, **overrides: Any) -> "ArchConfig":
        """A validated copy with some fields changed; unknown field names are a UserError."""
        unknown = sorted(set(overrides) - set(field_names()))
        if unknown:
            raise UserError(f"unknown architecture field(s): {', '.join(unknown)} "
                            f"(fields: {', '.join(field_names())})")
        return dataclasses.replace(self, **overrides).validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for checkpoints and JSON (the inverse of `from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArchConfig":
        """Rebuild from `to_dict()` output (e.g. a checkpoint); unknown keys are refused.

        Keys missing from `d` take today's defaults, so checkpoints written before a field was
        added still load.
        """
        unknown = sorted(set(d) - set(field_names()))
        if unknown:
            raise UserError(f"architecture config has unknown field(s): {', '.join(unknown)}")
        return cls(**dict(d)).validate()


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(ArchConfig)]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_HINTS: dict[str, Any] | None = None


def _hints() -> dict[str, Any]:
    global _HINTS
    if _HINTS is None:
        _HINTS = typing.get_type_hints(ArchConfig)
    return _HINTS


def _field_optional(f: dataclasses.Field) -> bool:
    return type(None) in typing.get_args(_hints()[f.name])


def _field_type(f: dataclasses.Field) -> type:
    """The field's base type: `int | None` -> int."""
    t = _hints()[f.name]
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        t = args[0]
    return t


# ---- CLI override support for `nmtkit train` ----------------------------------------------------


@dataclass(frozen=True)
class ArchFieldSpec:
    """One ArchConfig field as a command-line flag (for the train command's override options)."""

    name: str  # dataclass field name, e.g. "d_model"
    flag: str  # "--d-model"
    type: type  # int, float, bool or str
    optional: bool  # the field may be None (d_k, d_v)
    choices: tuple[str, ...] | None
    help: str


def refuse_unhandled(cfg: ArchConfig, handled: frozenset[str], runtime: str) -> None:
    """One-line UserError for the first setting outside `handled` that differs from its default.
    For converters to other formats (`runtime` names the export): a field added to the model later
    is refused until the converter learns it, so that an export never silently drops a setting
    that changes outputs."""
    default = type(cfg)()  # (a later version of the config in tests)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in handled and value != getattr(default, f.name):
            raise UserError(f"{_flag(f.name)} {value}: the {runtime} export does not represent this setting "
                            "(only its default); translate with the checkpoint and its data directory")


def arch_field_specs() -> list[ArchFieldSpec]:
    """Every ArchConfig field as a flag spec, in declaration order (nothing repeated elsewhere)."""
    specs = []
    for f in dataclasses.fields(ArchConfig):
        specs.append(
            ArchFieldSpec(
                name=f.name,
                flag=_flag(f.name),
                type=_field_type(f),
                optional=_field_optional(f),
                choices=FIELD_CHOICES.get(f.name),
                help=FIELD_HELP[f.name],
            )
        )
    return specs


def apply_overrides(base: ArchConfig, values: Mapping[str, Any]) -> ArchConfig:
    """`base` with the flags the user gave (values that are None mean "not given"), validated.

    Keys are field names (`d_model`) or flags (`--d-model`). Strings are converted to the
    field's type, so this also serves a hand-rolled parser; a bad value is a UserError naming
    the flag.
    """
    specs = {s.name: s for s in arch_field_specs()}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        name = key[2:].replace("-", "_") if key.startswith("--") else key
        if name not in specs:
            close = difflib.get_close_matches(name, list(specs), n=3)
            hint = f" (did you mean {', '.join(_flag(c) for c in close)}?)" if close else ""
            raise UserError(f"unknown architecture flag {_flag(name)}{hint}")
        if value is None:
            continue
        changes[name] = _convert(specs[name], value)
    return base.replace(**changes)


def _convert(spec: ArchFieldSpec, value: Any) -> Any:
    if not isinstance(value, str):
        if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    try:
        if spec.type is bool:
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if spec.type is int:
            return int(value)
        if spec.type is float:
            return float(value)
        return value
    except ValueError:
        raise UserError(f"{spec.flag} expects {spec.type.__name__}, got {value!r}") from None


# ---- the named architectures ----------------------------------------------------------------

BASE = ArchConfig()
BIG = ArchConfig(d_model=1024, d_ff=4096, heads=16, dropout=0.3)


def _table3(row: str, change: str, bleu: str, params: str = "", **fields: Any) -> tuple[ArchConfig, str]:
    """A Table 3 variant of base: base with `fields` changed, and its note as the paper reports
    it (row, the change in the paper's words, dev BLEU, and the parameter count where the row
    changes it). Why one function: the rows differ only in these values."""
    note = f"Table 3 ({row}) {change}: dev BLEU {bleu}" + (f", {params} params" if params else "")
    return BASE.replace(**fields), note


# name -> (config, note). The note says where the entry comes from and what the paper reports
# (dev BLEU on newstest2013 for Table 3 rows; SPEC.md section 2).
_ENTRIES: dict[str, tuple[ArchConfig, str]] = {
    "transformer_tiny": (
        ArchConfig(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=128, heads=4),
        "not in the paper: a tiny model for tests and smoke runs",
    ),
    "transformer_base": (BASE, "Table 3 base: 65M params, dev BLEU 25.8 (PPL 4.92), 100K steps"),
    "transformer_big": (BIG, "Table 3 big: 213M params, dev BLEU 26.4 (PPL 4.33), 300K steps"),
    "transformer_big_en_fr": (
        BIG.replace(dropout=0.1),
        "big for WMT14 En-Fr (section 6.1: P_drop 0.1): test BLEU 41.8",
    ),
    "transformer_parse": (
        ArchConfig(
            encoder_layers=4, decoder_layers=4, d_model=1024, d_ff=2048, heads=8,
            dropout=0.2, attention_dropout=0.2, share_embeddings="none", warmup_steps=16000,
        ),
        "section 6.3 WSJ parsing (tensor2tensor settings): WSJ-only F1 91.3",
    ),
    # (A) number of heads, d_k = d_v = d_model / h (work kept constant)
    "transformer_base_h1_dk512": _table3("A", "h=1, d_k=d_v=512", "24.9", heads=1),
    "transformer_base_h4_dk128": _table3("A", "h=4, d_k=d_v=128", "25.5", heads=4),
    "transformer_base_h16_dk32": _table3("A", "h=16, d_k=d_v=32", "25.8", heads=16),
    "transformer_base_h32_dk16": _table3("A", "h=32, d_k=d_v=16", "25.4", heads=32),
    # (B) smaller key size only (d_v stays 64): 58M / 60M params in the paper
    "transformer_base_dk16": _table3("B", "d_k=16 (d_v=64)", "25.1", "58M", d_k=16),
    "transformer_base_dk32": _table3("B", "d_k=32 (d_v=64)", "25.4", "60M", d_k=32),
    # (C) model size
    "transformer_base_n2": _table3("C", "N=2", "23.7", "36M", encoder_layers=2, decoder_layers=2),
    "transformer_base_n4": _table3("C", "N=4", "25.3", "50M", encoder_layers=4, decoder_layers=4),
    "transformer_base_n8": _table3("C", "N=8", "25.5", "80M", encoder_layers=8, decoder_layers=8),
    "transformer_base_d256_dk32": _table3("C", "d_model=256, d_k=d_v=32", "24.5", "28M", d_model=256),
    "transformer_base_d1024_dk128": _table3("C", "d_model=1024, d_k=d_v=128", "26.0", "168M", d_model=1024),
    "transformer_base_ff1024": _table3("C", "d_ff=1024", "25.4", "53M", d_ff=1024),
    "transformer_base_ff4096": _table3("C", "d_ff=4096", "26.2", "90M", d_ff=4096),
    # (D) regularisation
    "transformer_base_drop0": _table3("D", "P_drop=0.0", "24.6", dropout=0.0),
    "transformer_base_drop0_2": _table3("D", "P_drop=0.2", "25.5", dropout=0.2),
    "transformer_base_ls0": _table3("D", "eps_ls=0.0", "25.3", label_smoothing=0.0),
    "transformer_base_ls0_2": _table3("D", "eps_ls=0.2", "25.7", label_smoothing=0.2),
    # (E) positions
    "transformer_base_learned_pos": _table3("E", "learned positional embedding", "25.7", learned_pos=True),
    # Students for distillation and CPU decoding: a decoder runs once per output token, an encoder
    # once per sentence, so layers moved from the decoder to the encoder cost little at decoding.
    "transformer_student_6_1": (
        BASE.replace(decoder_layers=1),
        "not in the paper: student, base with a 1-layer decoder (Kasai et al. 2021: 6-1)",
    ),
    "transformer_student_12_1": (
        BASE.replace(encoder_layers=12, decoder_layers=1),
        "not in the paper: student, base widths, 12+1 layers (Kasai et al. 2021: 12-1)",
    ),
    # Bergamot's student.tiny11 (browsermt/students): post-norm, ReLU, sinusoids, all embeddings
    # tied, trained without dropout or label smoothing, warmup 16000. Its decoder's SSRU is a
    # standard self-attention sub-layer here; its attention biases are left out, as in every entry.
    "transformer_student_tiny": (
        BASE.replace(encoder_layers=6, decoder_layers=2, d_model=256, d_ff=1536, heads=8,
                     dropout=0.0, label_smoothing=0.0, warmup_steps=16000),
        "not in the paper: student, Bergamot's tiny11 (its SSRU decoder as self-attention)",
    ),
    # The student measured against the quickstart's model (docs/archs.md): 6+1 at a quarter of
    # base's width. Pre-norm, because the post-norm 6+1 and 6+2 shapes at this width failed to
    # learn from that teacher's translations with the distillation recipe's schedule.
    "transformer_student_6_1_small": (
        BASE.replace(decoder_layers=1, d_model=128, d_ff=512, heads=4, normalize_before=True),
        "not in the paper: student of the quickstart's model, 6+1, d_model 128, pre-norm "
        "(measured with recipes/distill.sh's schedule: inverse_sqrt, lr 1e-3, 400 warmup updates)",
    ),
}

ARCHS: dict[str, ArchConfig] = {name: cfg for name, (cfg, _) in _ENTRIES.items()}
ARCH_NOTES: dict[str, str] = {name: note for name, (_, note) in _ENTRIES.items()}


def get_arch(name: str) -> ArchConfig:
    """The named architecture; a typo is a UserError that lists the closest names."""
    try:
        return ARCHS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(ARCHS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"unknown architecture {name!r}{hint} (see 'nmtkit archs')") from None
