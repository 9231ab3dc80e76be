"""The search's settings and results, without torch: every engine and the `Translator` share them.

`SearchConfig` holds every knob of a search (its fields with `setting(...)` are the flags of
`nmtkit generate`, `serve` and `attention`), `Hypothesis` one output, `length_penalty` the two
length-normalizations. `apply_search_settings` applies a caller's overrides (the API's keyword
arguments, a server request's fields) with a one-line refusal for each impossible one. No torch
here: an engine that runs without torch reads its settings through this module alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from nmtkit.errors import UserError
from nmtkit.settings import SettingError, check_numbers, setting

# docs/internals.md: Dictionary reserves these ids in this order.
PAD, BOS, EOS, UNK = 0, 1, 2, 3

LENPEN_FORMS = ("gnmt", "fairseq")
# |alpha| above this overflows the length penalty in float32 on long outputs (fairseq form:
# 4096^10 = 1.3e36; ^20 would be inf) and is far from any useful value (the paper: 0.6).
LENPEN_LIMIT = 10.0
# the default --max-len-b of a parsing model (a manifest's "task": "parsing"): input + 300, the
# paper's section 6.3 (linearized trees are 2-4 tokens per word)
PARSING_MAX_LEN_B = 300
EARLY_STOP = ("bound", "beam", "none")
# --decoding: the length penalty and stopping rule in one word (docs/generate.md, "Decoding rules")
DECODING_PRESETS = {
    "paper": {"lenpen_form": "gnmt", "early_stop": "bound"},  # the paper's GNMT penalty, exact stopping
    "fairseq": {"lenpen_form": "fairseq", "early_stop": "beam"},  # fairseq's and CTranslate2's rules
}


@dataclass(frozen=True)
class SearchConfig:
    """Every knob of the search; the fields with `setting(...)` are `nmtkit generate`'s flags."""

    beam: int = setting(4, flag="--beam", help="Beam size; 1 = greedy search; with --sampling the number of samples.")
    lenpen: float = setting(0.6, flag="--lenpen", help="Length penalty exponent alpha (0 = none).")
    # "gnmt": ((5+|Y|)/6)^alpha (t2t, the paper); "fairseq": |Y|^alpha
    # not given on the command line: the engine's (fairseq on a CTranslate2 export; model_flags)
    lenpen_form: str = setting("gnmt", flag="--lenpen-form", unset=True, show_default=False, help="gnmt: ((5+|Y|)/6)^alpha (paper, tensor2tensor); fairseq: |Y|^alpha [default: gnmt; fairseq on a CTranslate2 export].")
    max_len_a: float = setting(1.0, flag="--max-len-a", help="Output limit a*src_len+b tokens (before </s>): a.")
    # not given on the command line: GenerateOptions.from_flags decides (300 for a parsing data dir)
    max_len_b: int = setting(50, flag="--max-len-b", unset=True, show_default=False, help="Output limit a*src_len+b tokens (before </s>): b [default: 50; 300 for a parsing data dir].")
    min_len: int = setting(0, flag="--min-len", help="Minimum output tokens before </s>.")
    no_repeat_ngram_size: int = setting(0, flag="--no-repeat-ngram-size", help="Never repeat an n-gram of this size in a hypothesis (0 = off).")
    unk_penalty: float = setting(0.0, flag="--unk-penalty", help="Subtracted from the log-prob of <unk> (negative: a reward).")
    nbest: int = setting(1, flag="--nbest", help="Hypotheses to output per sentence (<= --beam).")
    # When a sentence's beam search stops (docs/generate.md): "bound" (exact: no live hypothesis
    # can still beat the nbest finished ones; tensor2tensor's rule, per sentence), "beam"
    # (fairseq's: `beam` finished hypotheses, admitting only </s> extensions that rank among
    # the step's `beam` best candidates) or "none" (decode to the output limit).
    # not given on the command line: the engine's ("beam" on a CTranslate2 export; model_flags)
    early_stop: str = setting("bound", flag="--early-stop", unset=True, show_default=False, help="When a sentence stops: bound (exact: no live hypothesis can still win; tensor2tensor), beam (fairseq: once --beam hypotheses finished; faster, not exact) or none (at the output limit) [default: bound; beam on a CTranslate2 export].")
    # Sampling (a bonus): `beam` independent samples per sentence instead of a beam.
    sampling: bool = setting(False, flag="--sampling", help="Sample instead of searching (--beam samples per sentence).")
    topk: int = setting(0, flag="--topk", help="Sampling: only from the k most likely tokens (0 = off).")
    topp: float = setting(0.0, flag="--topp", help="Sampling: only from the smallest set with probability >= p (0 = off).")
    temperature: float = setting(1.0, flag="--temperature", help="Sampling: divide log-probs by this before sampling.")
    # Library-only fields (no flags of their own): `generate` sets them (seed from --seed).
    seed: int | None = None
    # Hard cap on generated tokens before </s> (the model's target position limit).
    max_len_cap: int | None = None
    pad: int = PAD
    bos: int = BOS
    eos: int = EOS
    unk: int = UNK
    # target ids no hypothesis may hold (a multilingual model's language tags: Translator.search_config)
    banned: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Refuse an impossible search with a SettingError (a UserError naming the flag, and the
        ValueError library callers catch)."""
        check_numbers(self)
        check_lenpen(self.lenpen, "--lenpen")
        if self.beam < 1:
            raise SettingError(f"--beam must be >= 1, got {self.beam}")
        if self.nbest < 1:
            raise SettingError(f"--nbest must be >= 1, got {self.nbest}")
        if self.nbest > self.beam:
            what = "samples (--beam) drawn with --sampling" if self.sampling else "--beam"
            raise SettingError(f"--nbest {self.nbest} exceeds the {what} {self.beam}; raise --beam")
        if self.lenpen_form not in LENPEN_FORMS:
            raise SettingError(f"--lenpen-form must be gnmt or fairseq, got {self.lenpen_form!r}")
        if self.early_stop not in EARLY_STOP:
            raise SettingError(f"--early-stop must be bound, beam or none, got {self.early_stop!r}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise SettingError(f"--max-len-a and --max-len-b must be >= 0, got {self.max_len_a} and {self.max_len_b}")
        if self.min_len < 0:
            raise SettingError(f"--min-len must be >= 0, got {self.min_len}")
        if self.no_repeat_ngram_size < 0:
            raise SettingError(f"--no-repeat-ngram-size must be >= 0, got {self.no_repeat_ngram_size}")
        if self.topk < 0:
            raise SettingError(f"--topk must be >= 0 (0 = off), got {self.topk}")
        if not 0.0 <= self.topp <= 1.0:
            raise SettingError(f"--topp must be in [0, 1] (0 = off), got {self.topp}")
        if self.temperature <= 0:
            raise SettingError(f"--temperature must be > 0, got {self.temperature}")


@dataclass
class Hypothesis:
    """One output sequence with its scores (natural-log probabilities)."""

    tokens: list[int]  # generated ids, without the final </s>
    score: float  # logprob / lp(len(tokens) + 1): what the search ranks by
    logprob: float  # sum of the token log-probs, </s> included
    positional_scores: list[float] = field(default_factory=list)  # len(tokens) + 1 entries


def check_lenpen(alpha: float, flag: str) -> None:
    """SettingError naming `flag` unless -LENPEN_LIMIT <= alpha <= LENPEN_LIMIT."""
    if not -LENPEN_LIMIT <= alpha <= LENPEN_LIMIT:
        raise SettingError(f"{flag} must be between {-LENPEN_LIMIT:g} and {LENPEN_LIMIT:g} (the paper: 0.6; "
                           f"larger values overflow the length penalty), got {alpha}")


def length_penalty(length, alpha: float, form: str):
    """lp(|Y|): `((5+|Y|)/6)^alpha` (GNMT/tensor2tensor) or `|Y|^alpha` (fairseq); `length` is a
    float or a tensor of lengths (the search's), the result of the same kind."""
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return length**alpha
    raise ValueError(f"unknown length penalty form {form!r}")


_IDS = ("pad", "bos", "eos", "unk", "banned")  # SearchConfig fields that come from the target dictionary
# The search settings a caller may give (SearchConfig's fields without the dictionary's ids).
SEARCH_SETTINGS = tuple(f.name for f in dataclasses.fields(SearchConfig) if f.name not in _IDS)


def default_search(manifest: dict) -> SearchConfig:
    """SearchConfig's defaults, with the output limit of a parsing data directory (input + 300,
    the paper's section 6.3) when the manifest says `"task": "parsing"`."""
    if manifest.get("task") == "parsing":
        return SearchConfig(max_len_b=PARSING_MAX_LEN_B)
    return SearchConfig()


def _check_type(name: str, value) -> None:
    """Search settings are checked against the type of SearchConfig's default (a str beam would
    otherwise fail deep inside the search with a comparison error)."""
    default = getattr(SearchConfig, name)
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "True or False"
    elif isinstance(default, int) or default is None:  # seed, max_len_cap: int or None
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (default is None and value is None)
        kind = "an int" + (" or None" if default is None else "")
    elif isinstance(default, float):
        ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, kind = isinstance(value, str), "a str"
    if not ok:
        raise UserError(f"search setting {name} must be {kind}, got {value!r}")


def apply_search_settings(base: SearchConfig, overrides: dict) -> SearchConfig:
    """`base` with `overrides` applied, every impossible setting refused as a one-line UserError."""
    for name, value in overrides.items():
        if name not in SEARCH_SETTINGS:
            raise UserError(f"unknown search setting {name!r} (known: {', '.join(SEARCH_SETTINGS)})")
        _check_type(name, value)
    try:
        cfg = dataclasses.replace(base, **overrides)
    except ValueError as e:  # SearchConfig's own checks
        raise UserError(f"search settings: {e}") from None
    if cfg.max_len_a < 0 or cfg.max_len_b < 0:
        raise UserError(f"search settings: max_len_a and max_len_b must be >= 0, got {cfg.max_len_a} and {cfg.max_len_b}")
    if cfg.max_len_cap is not None and cfg.max_len_cap < 0:
        raise UserError(f"search settings: max_len_cap must be >= 0, got {cfg.max_len_cap}")
    if not cfg.sampling and (cfg.topk or cfg.topp or cfg.temperature != 1.0):
        raise UserError("search settings: topk, topp and temperature apply only with sampling=True")
    return cfg


@dataclass(frozen=True)
class Avoided:
    """One avoided phrase as every id sequence that spells it: a graph over the positions
    0..`end` of its text, with an edge (i, j, id) when the piece `id` spells its characters i..j.
    An output contains the phrase when some run of its ids follows edges from 0 to `end`.

    Why a graph and not a list of sequences: a word of 11 letters has thousands of spellings in
    a vocabulary with every letter; its graph has a few dozen edges.
    """

    end: int
    edges: tuple[tuple[int, int, int], ...]

    @classmethod
    def sequence(cls, ids) -> Avoided:
        """The phrase spelt by `ids` alone (token k spans positions k..k+1)."""
        return cls(len(ids), tuple((k, k + 1, int(v)) for k, v in enumerate(ids)))

    def found_in(self, ids) -> bool:
        """Whether some run of `ids` spells the phrase."""
        reached: set[int] = set()
        for v in ids:
            reached = {j for i, j, e in self.edges if e == v and (i == 0 or i in reached)}
            if self.end in reached:
                return True
        return False


@dataclass(frozen=True)
class Terms:
    """One sentence's lexical rules, as target dictionary ids (docs/generate.md, "Terminology").

    `include`: phrases every output must contain (positive constraints), each a contiguous run
    of ids; `ordered`: they must appear in the given order, without overlapping (otherwise in any
    order, each at least once, overlaps allowed). `avoid`: phrases no output may contain, each an
    `Avoided` (every spelling of the phrase; a tuple of ids is taken as that one spelling).
    `prefix`: ids every output starts with. `where` names the sentence in errors (`in.de:3`); it
    takes no part in the search.
    """

    include: tuple[tuple[int, ...], ...] = ()
    ordered: bool = False
    avoid: tuple[Avoided, ...] = ()
    prefix: tuple[int, ...] = ()
    where: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        avoid = tuple(a if isinstance(a, Avoided) else Avoided.sequence(a) for a in self.avoid)
        object.__setattr__(self, "avoid", avoid)

    def __bool__(self) -> bool:
        return bool(self.include or self.avoid or self.prefix)

    @property
    def tokens_needed(self) -> int:
        """Output tokens the prefix and the positive phrases take when none overlap: at most the
        output limit (`check_terms`)."""
        return len(self.prefix) + sum(len(p) for p in self.include)


def check_terms(terms: Terms, cfg: SearchConfig, max_len: int) -> None:
    """UserError naming `terms.where` when the search could not honour `terms` under `cfg` for a
    sentence whose output limit is `max_len` tokens: with sampling, with more positive phrases
    than the beam has room for (a beam of K keeps a hypothesis for each count 0..K-1 of phrases
    met), or with phrases and prefix longer than the output limit."""
    where = terms.where or "sentence"
    if cfg.sampling:
        raise UserError(f"{where}: constraints, avoided phrases and prefixes need beam search; drop sampling")
    if len(terms.include) > cfg.beam - 1:
        raise UserError(f"{where}: {len(terms.include)} constraint(s) need a beam of at least "
                        f"{len(terms.include) + 1} (one hypothesis per count of phrases met); got beam {cfg.beam}")
    if terms.tokens_needed > max_len:
        raise UserError(f"{where}: the prefix and constraints take {terms.tokens_needed} target tokens; "
                        f"this sentence's output limit is {max_len} (--max-len-a/--max-len-b)")


def output_limit(n_src: int, cfg: SearchConfig) -> int:
    """The output limit of one sentence of `n_src` source tokens (tokens before </s>), as the
    searches compute it for a batch (nmtkit.search.beam.max_lengths, nmtkit.search.arrays)."""
    lim = max(math.floor(cfg.max_len_a * float(n_src) + cfg.max_len_b), 0)
    return lim if cfg.max_len_cap is None else min(lim, max(cfg.max_len_cap, 0))
