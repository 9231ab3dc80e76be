"""Every command's refusals of impossible flags, each with its exact one-line message, and
`nmtkit.cli.main`'s turning of errors into one `nmtkit: error:` line and an exit status.

The configs are checked directly (fast: no data directory, no model); test_flags.py and
test_generate.py check that the CLI reaches the same checks. A message is the user's only help,
so it is asserted in full: which flag, which value, what to do.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nmtkit.errors import UserError
from nmtkit.search.beam import SearchConfig
from nmtkit.settings import SettingError


def refused(make, message: str, kind: type = UserError) -> None:
    with pytest.raises(kind) as e:
        make()
    assert str(e.value) == message


# ---------------------------------------------------------------------------------------------
# the search (generate, serve, attention, train's --eval-bleu): SearchConfig's own refusals and
# accepted limits are in tests/test_search_rules.py (also run by the cli-refusals mutation module)

TOO_SMALL = "magnitudes from 1.2e-38 to 3.4e+38"


# ---------------------------------------------------------------------------------------------
# numbers of every command (settings.check_number)


def test_check_number_messages_and_bounds():
    from nmtkit.settings import FLOAT32_MAX, FLOAT32_TINY, check_number

    range_msg = ("--lr {} is out of range: models compute in float32, which holds 0 and "
                 "magnitudes from 1.2e-38 to 3.4e+38")
    refused(lambda: check_number("--lr", float("inf")), "--lr must be a finite number, got inf", SettingError)
    refused(lambda: check_number("--lr", (0.9, float("-inf"))), "--lr must be a finite number, got -inf", SettingError)
    refused(lambda: check_number("--lr", [0.5, float("nan")]), "--lr must be a finite number, got nan", SettingError)
    refused(lambda: check_number("--lr", [1, float("nan")]), "--lr must be a finite number, got nan", SettingError)
    refused(lambda: check_number("--lr", 1e39), range_msg.format("1e+39"), SettingError)
    refused(lambda: check_number("--lr", -1e39), range_msg.format("-1e+39"), SettingError)
    refused(lambda: check_number("--lr", 1e-39), range_msg.format("1e-39"), SettingError)
    refused(lambda: check_number("--lr", -1e-39), range_msg.format("-1e-39"), SettingError)
    for ok in (0.0, -0.0, FLOAT32_MAX, -FLOAT32_MAX, FLOAT32_TINY, -FLOAT32_TINY, 1.0, (0.9, 0.98), [1.5], 10**40, "x", None):
        check_number("--lr", ok)  # ints, strings and None are not checked here


def test_check_numbers_covers_every_flagged_field_but_not_groups():
    from nmtkit.generation.generator import GenerateOptions
    from nmtkit.settings import check_numbers
    from nmtkit.training.config import TrainConfig

    refused(lambda: check_numbers(TrainConfig(data_dir="d", save_dir="s", clip_norm=float("inf"))),
            "--clip-norm must be a finite number, got inf", SettingError)
    refused(lambda: check_numbers(TrainConfig(data_dir="d", save_dir="s", adam_betas=(0.9, float("nan")))),
            "--adam-betas must be a finite number, got nan", SettingError)
    opts = GenerateOptions(paths=["a"], data_dir="d")
    check_numbers(opts)  # the search group is a SearchConfig, which checks itself
    object.__setattr__(opts, "search", "not a config")  # not a float: left alone
    check_numbers(opts)


# ---------------------------------------------------------------------------------------------
# train


def train(**kw):
    from nmtkit.training.config import TrainConfig

    return TrainConfig(data_dir="d", save_dir="s", **kw).validate()


@pytest.mark.parametrize("bad,message", [
    ({"max_tokens": None}, "give --max-tokens or --batch-size (or both)"),
    ({"max_tokens": 0}, "--max-tokens must be > 0, got 0"),
    ({"batch_size": 0}, "--batch-size must be > 0, got 0"),
    ({"batch_size": -2}, "--batch-size must be > 0, got -2"),
    ({"update_freq": 0}, "--update-freq must be > 0, got 0"),
    ({"lr_scheduler": "cosine"}, "--lr-scheduler must be one of noam, inverse_sqrt, got 'cosine'"),
    ({"lr_scale": 0.0}, "--lr-scale must be > 0, got 0.0"),
    ({"lr": -1.0}, "--lr must be > 0, got -1.0"),
    ({"warmup_updates": 0}, "--warmup-updates must be >= 1, got 0"),
    ({"warmup_init_lr": -1e-3}, "--warmup-init-lr must be >= 0, got -0.001"),
    ({"adam_betas": (1.0, 0.98)}, "--adam-betas must both be in [0, 1), got 1.0,0.98"),
    ({"adam_betas": (0.9, 1.0)}, "--adam-betas must both be in [0, 1), got 0.9,1.0"),
    ({"adam_betas": (-0.1, 0.98)}, "--adam-betas must both be in [0, 1), got -0.1,0.98"),
    ({"adam_betas": (0.9, -0.5)}, "--adam-betas must both be in [0, 1), got 0.9,-0.5"),
    ({"adam_eps": 0.0}, "--adam-eps must be > 0, got 0.0"),
    ({"weight_decay": -0.1}, "--weight-decay must be >= 0, got -0.1"),
    ({"clip_norm": -1.0}, "--clip-norm must be >= 0, got -1.0"),
    ({"precision": "fp8"}, "--precision must be one of fp32, bf16, fp16, got 'fp8'"),
    ({"threads": 0}, "--threads must be > 0, got 0"),
    ({"max_update": -1}, "--max-update must be >= 0, got -1"),
    ({"max_epoch": -1}, "--max-epoch must be >= 0, got -1"),
    ({"max_time": -1.0}, "--max-time must be >= 0, got -1.0"),
    ({"validate_interval_updates": -1}, "--validate-interval-updates must be >= 0, got -1"),
    ({"patience": -1}, "--patience must be >= 0, got -1"),
    ({"save_interval_updates": -1}, "--save-interval-updates must be >= 0, got -1"),
    ({"save_interval_minutes": -0.5}, "--save-interval-minutes must be >= 0, got -0.5"),
    ({"keep_last_updates": -1}, "--keep-last-updates must be >= 0, got -1"),
    ({"keep_last_epochs": -1}, "--keep-last-epochs must be >= 0, got -1"),
    ({"eval_bleu_beam": 0}, "--eval-bleu-beam must be > 0, got 0"),
    ({"eval_bleu_max_len_a": -1.0}, "--eval-bleu-max-len-a must be >= 0, got -1.0"),
    ({"eval_bleu_lenpen": 11.0}, "--eval-bleu-lenpen must be between -10 and 10 (the paper: 0.6; larger values "
                                 "overflow the length penalty), got 11.0"),
    ({"eval_bleu_max_len_b": -1}, "--eval-bleu-max-len-b must be >= 0, got -1"),
    ({"best_checkpoint_metric": "ppl"}, "--best-checkpoint-metric must be one of loss, bleu, got 'ppl'"),
    ({"best_checkpoint_metric": "bleu"}, "--best-checkpoint-metric bleu needs --eval-bleu"),
    ({"no_validate": True, "patience": 3}, "--no-validate cannot be combined with --patience, --eval-bleu or "
                                          "--validate-interval-updates"),
    ({"no_validate": True, "eval_bleu": True}, "--no-validate cannot be combined with --patience, --eval-bleu or "
                                              "--validate-interval-updates"),
    ({"no_validate": True, "validate_interval_updates": 5}, "--no-validate cannot be combined with --patience, "
                                                            "--eval-bleu or --validate-interval-updates"),
    ({"ema_decay": 1.0}, "--ema-decay must be in [0, 1), got 1.0"),
    ({"ema_decay": -0.1}, "--ema-decay must be in [0, 1), got -0.1"),
    ({"max_nan_skips": 0}, "--max-nan-skips must be > 0, got 0"),
    ({"log_interval": 0}, "--log-interval must be > 0, got 0"),
    ({"ema": True}, "--ema applies with --finetune-from-model (it picks that checkpoint's EMA weights to start from)"),
    ({"valid_subset": "train"}, "--valid-subset must differ from --train-subset ('train')"),
    ({"lr": float("inf")}, "--lr must be a finite number, got inf"),
    ({"update_freq": None}, "--update-freq must be > 0, got None"),  # library callers may pass None
    ({"lr": None}, "--lr must be > 0, got None"),
    ({"lang_pairs": "de-en,de"}, "--lang-pairs: 'de' is not a pair SRC-TGT of language suffixes (lower-case letters, "
                                 "digits and _, e.g. de-en)"),
])
def test_train_refusals(bad, message):
    refused(lambda: train(**bad), message)


def test_train_boundaries_are_accepted():
    for ok in ({"max_tokens": None, "batch_size": 1}, {"batch_size": None}, {"warmup_updates": 1},
               {"warmup_init_lr": 0.0}, {"adam_betas": (0.0, 0.0)}, {"weight_decay": 0.0}, {"threads": 1},
               {"eval_bleu_max_len_b": 0}, {"ema_decay": 0.0}, {"ema_decay": 0.999}, {"lang_pairs": "de-en,fr-en"},
               {"best_checkpoint_metric": "bleu", "eval_bleu": True}, {"no_validate": True},
               {"ema": True, "finetune_from_model": "m.pt"}, {"lr_scheduler": "inverse_sqrt"},
               {"precision": "bf16"}, {"max_update": 0, "patience": 0}):
        cfg = train(**ok)
        assert all(getattr(cfg, k) == v for k, v in ok.items())
    with pytest.raises(UserError):  # nan is no number >= 0 (non_negative checks floats for it)
        train(max_time=float("nan"))


# ---------------------------------------------------------------------------------------------
# generate (and what serve shares with it: check_model_options)


@pytest.fixture
def export_dir(tmp_path) -> str:
    d = tmp_path / "exported"
    d.mkdir()
    (d / "nmtkit.json").write_text('{"format": "nmtkit-export", "format_version": 1, "runtime": {"name": "ctranslate2"}, '
                                   '"arch_config": {}, "data": {}}', encoding="utf-8")
    return str(d)


def _model_options(cls, **kw):
    """generate's or serve's options with a model path and data dir (never read: flags only)."""
    kw.setdefault("paths", ["m.pt"])
    kw.setdefault("data_dir", "d")
    if isinstance(kw.get("search"), dict):
        kw["search"] = SearchConfig(**kw["search"])
    return cls(**kw)


def gen(**kw):
    from nmtkit.generation.generator import GenerateOptions

    return _model_options(GenerateOptions, **kw)


EXPORT = "{e}"  # replaced by the export directory


@pytest.mark.parametrize("bad,message", [
    ({"paths": []}, "--path is required (give it several times for an ensemble)"),
    ({"data_dir": None}, "missing DATA_DIR: the data directory the checkpoint was trained with (only an export "
                         "directory as --path needs none)"),
    ({"search": {"topk": 5}}, "--topk, --topp and --temperature apply only with --sampling"),
    ({"search": {"topp": 0.5}}, "--topk, --topp and --temperature apply only with --sampling"),
    ({"search": {"temperature": 0.5}}, "--topk, --topp and --temperature apply only with --sampling"),
    ({"precision": "fp8"}, "--precision must be one of fp32, bf16, fp16, got 'fp8'"),
    ({"threads": -1}, "--threads must be >= 0 (0 = torch's default), got -1"),
    ({"quantize": "int4"}, "--quantize must be one of none, int8, got 'int4'"),
    ({"quantize": "int8", "precision": "bf16"}, "--quantize int8 works from fp32 weights; drop --precision bf16"),
    ({"format": "xml"}, "--format must be one of plain, fairseq, got 'xml'"),
    ({"input": "in.txt", "gen_subset": "test"}, "--input and --gen-subset exclude each other (raw text or a binarized split)"),
    ({"max_tokens": 0}, "--max-tokens must be >= 1, got 0"),
    ({"batch_size": 0}, "--batch-size must be >= 1, got 0"),
    ({"buffer_size": 0}, "--buffer-size must be >= 1, got 0"),
    ({"decoding": "marian"}, "--decoding must be one of paper, fairseq, got 'marian'"),
    ({"print_alignment": "chars"}, "--print-alignment must be subword (the default when given alone) or words, got 'chars'"),
    ({"alignment_layer": 1}, "--alignment-layer applies to --print-alignment"),
    ({"alignment_layer": 0, "print_alignment": "subword"}, "--alignment-layer is 1-based (1 = the lowest decoder layer), got 0"),
    ({"reference": "ref.txt"}, "--reference applies to --score-reference (the translations to score)"),
    ({"reference": "ref.txt", "score_reference": True}, "--reference pairs with --input (raw source text); a binarized "
                                                        "split is scored against its own target side"),
    ({"reference": "-", "score_reference": True, "input": "in.txt"}, "--reference must be a file (--input may be - for stdin)"),
    ({"score_reference": True, "input": "in.txt"}, "--score-reference with --input needs --reference FILE: the translations to score"),
    ({"score_reference": True, "search": {"nbest": 2}}, "--nbest applies to the search; --score-reference scores one given "
                                                        "translation per input"),
    ({"score_reference": True, "search": {"sampling": True}}, "--sampling applies to the search, not to --score-reference"),
    ({"paths": [EXPORT, "m.pt"], "data_dir": None}, "--path {e} is an export directory; ensembles need checkpoints and their data directory"),
    ({"paths": [EXPORT]}, "--path {e} is an export directory: it carries its own dictionaries and subword models; drop DATA_DIR (d)"),
    ({"paths": [EXPORT], "data_dir": None, "ema": True}, "--ema: {e} holds the weights chosen when it was exported "
                                                         "(nmtkit export --ema); drop --ema"),
    ({"paths": [EXPORT], "data_dir": None, "quantize": "int8", "input": "-"},
     "--quantize: {e} runs with the weight type chosen when it was exported; export with nmtkit export --quantization "
     "int8 (or int8_float32) instead, and drop --quantize"),
    ({"paths": [EXPORT], "data_dir": None}, "--path {e} is an export directory, which translates raw text: give --input FILE "
                                            "(or - for stdin); a binarized split needs the checkpoint and its data directory"),
    ({"paths": [EXPORT], "data_dir": None, "gen_subset": "valid"},
     "--path {e} is an export directory, which translates raw text: give --input FILE (or - for stdin); --gen-subset valid "
     "needs the checkpoint and its data directory"),
    ({"paths": [EXPORT], "data_dir": None, "input": "-", "print_alignment": "subword"},
     "--print-alignment: {e} is run by CTranslate2, which nmtkit does not read attention or forced scores from; use the "
     "checkpoint and its data directory"),
    ({"paths": [EXPORT], "data_dir": None, "input": "-", "score_reference": True},
     "--score-reference: {e} is run by CTranslate2, which nmtkit does not read attention or forced scores from; use the "
     "checkpoint and its data directory"),
])
def test_generate_refusals(export_dir, bad, message):
    if "paths" in bad:
        bad = {**bad, "paths": [export_dir if p == EXPORT else p for p in bad["paths"]]}
    refused(lambda: gen(**bad).validate(), message.format(e=export_dir))


def test_generate_valid_combinations_are_accepted(export_dir):
    for ok in ({}, {"max_tokens": 1, "batch_size": 1, "buffer_size": 1}, {"threads": 0}, {"quantize": "int8"},
               {"precision": "bf16"}, {"precision": "fp16", "threads": 2},
               {"format": "fairseq"}, {"input": "-"}, {"gen_subset": "valid"},
               {"print_alignment": "words", "alignment_layer": 1}, {"print_alignment": "subword"},
               {"score_reference": True}, {"score_reference": True, "input": "in.txt", "reference": "ref.txt"},
               {"search": {"sampling": True, "topk": 5, "topp": 0.5, "temperature": 0.5}},
               {"paths": [export_dir], "data_dir": None, "input": "-"}):
        gen(**ok).validate()


def test_generate_rule_files_exist(tmp_path):
    """--avoid, --prefix and --shortlist: a missing path and a folder each named by their flag;
    stdin (-) is left to the rule that --input alone may be stdin."""
    rules = tmp_path / "rules.txt"
    rules.write_text("x\n", encoding="utf-8")
    for flag in ("avoid", "prefix", "shortlist"):
        extra = {} if flag == "shortlist" else {"input": "in.txt"}
        refused(lambda: gen(**{flag: str(tmp_path / "none")}, **extra).validate(),
                f"--{flag} {tmp_path / 'none'}: not found")
        refused(lambda: gen(**{flag: str(tmp_path)}, **extra).validate(), f"--{flag} {tmp_path}: not a file")
        gen(**{flag: str(rules)}, **extra).validate()
    gen(shortlist="-").validate()  # not a file name to look for (the reader says what it is)
    for flag in ("avoid", "prefix"):
        refused(lambda: gen(**{flag: "-"}, input="in.txt").validate(), f"--{flag} must be a file (--input may be - for stdin)")


def test_describe_phrases_each_refusal_for_the_api(export_dir):
    """Translator.load's arguments are named where the command line names flags."""
    from nmtkit.backends.registry import check_quantize, describe

    refused(lambda: describe([], None, api=True),
            "Translator.load: no checkpoint given (a path, or a list of paths for an ensemble)")
    refused(lambda: describe(["m.pt"], None, api=True),
            "Translator.load: data_dir is required: the data directory the checkpoint was trained with (its "
            "dictionaries and subword models), unless path is a directory made by nmtkit export")
    alone = (f"{export_dir} is an export directory: it carries its own dictionaries and subword models; load it "
             "alone, without data_dir (no ensembles of exports)")
    refused(lambda: describe([export_dir], "d", api=True), alone)
    refused(lambda: describe([export_dir, export_dir], None, api=True), alone)
    source = describe([export_dir], None, api=True)
    assert (source.format, source.paths, source.folder, source.export) == ("ctranslate2", (export_dir,), export_dir, export_dir)
    assert source.manifest == {}  # the export's own copy of the data directory's entries, not read from disk
    refused(lambda: check_quantize(source, "int8", api=True),
            f"quantize: {export_dir} runs with the weight type chosen when it was exported (nmtkit export "
            "--quantization int8)")
    check_quantize(source, "none", api=True)
    check_quantize(describe(["m.pt"], "d"), "int8")  # a checkpoint quantizes as it loads
    refused(lambda: describe([export_dir], None, forced="nmtkit attention"),
            "nmtkit attention needs nmtkit's own model: load the checkpoint and its data directory (an export "
            "directory is run by CTranslate2, which exposes no attention or forced scores)")
    assert describe(["a.pt", "b.pt"], "d", forced="nmtkit attention").paths == ("a.pt", "b.pt")


def test_check_model_options_returns_the_export(export_dir):
    from nmtkit.backends.registry import CHECKPOINT, describe
    from nmtkit.generation.model_flags import check_model_options

    assert describe(["m.pt"], "d", ema=True).format == CHECKPOINT
    assert describe([export_dir], None).format == "ctranslate2"
    assert check_model_options(gen(paths=[export_dir], data_dir=None)) == export_dir
    assert check_model_options(gen()) is None


def test_check_lang_flags():
    """--source-lang / --target-lang against a bilingual and a multilingual manifest, word for word."""
    from nmtkit.data.languages import check_lang_flags

    bi = {"source_lang": "de", "target_lang": "en"}
    for src, tgt, split in ((None, None, True), ("de", "en", True), (None, "en", False), ("de", None, False)):
        check_lang_flags(bi, src, tgt, split=split)  # its own pair, or nothing
    refused(lambda: check_lang_flags(bi, "fr", None, split=False),
            "--source-lang fr: the model translates de into en only")
    refused(lambda: check_lang_flags(bi, None, "fr", split=False),
            "--target-lang fr: the model translates de into en only")
    multi = {"source_lang": "src", "target_lang": "tgt",
             "multilingual": {"pairs": ["de-en", "en-de", "fr-en"], "langs": ["de", "en", "fr"]}}
    check_lang_flags(multi, None, "en", split=False)  # raw text: the target is enough
    check_lang_flags(multi, "fr", "en", split=True)
    refused(lambda: check_lang_flags(multi, None, "en", split=True),
            "--source-lang: a binarized split of a multilingual data directory is one direction; "
            "give --source-lang and --target-lang (de, en, fr)")
    refused(lambda: check_lang_flags(multi, None, None, split=False),
            "--target-lang: the model is multilingual; give the target language (de, en, fr)")
    refused(lambda: check_lang_flags(multi, None, "cs", split=False),
            "--target-lang: target language 'cs' is not one of the model's languages (de, en, fr)")
    refused(lambda: check_lang_flags(multi, None, "fr", split=False),
            "--target-lang: the model was trained to translate into de, en, not 'fr'")
    # the target checked first; a fault of the source names --source-lang
    refused(lambda: check_lang_flags(multi, "cs", "en", split=False),
            "--source-lang: source language 'cs' is not one of the model's languages (de, en, fr)")
    refused(lambda: check_lang_flags(multi, "en", "en", split=True),
            "--source-lang: source and target language are both 'en'")
    refused(lambda: check_lang_flags(multi, "cs", "fr", split=False),
            "--target-lang: the model was trained to translate into de, en, not 'fr'")


def test_check_files_before_the_model_is_loaded(tmp_path):
    """generate's files, each refused in one line naming its flag before any load, and the note for
    an empty --input."""
    from nmtkit.generation.generator import _check_files

    class Source:
        manifest = {"source_lang": "de", "target_lang": "en"}

    src, ref, empty = tmp_path / "in.de", tmp_path / "ref.en", tmp_path / "empty.de"
    src.write_text("x\n", encoding="utf-8")
    ref.write_text("y\n", encoding="utf-8")
    empty.write_bytes(b"")

    def opts(**kw):
        o = gen(**kw)
        o.source = Source()
        return o

    assert _check_files(opts(input=str(src))) is None
    assert _check_files(opts(input="-")) is None and _check_files(opts()) is None
    assert _check_files(opts(input=str(empty))) == (f"--input {empty} is empty: 0 sentences to translate "
                                                   "(the model is still loaded and checked)")
    refused(lambda: _check_files(opts(input=str(tmp_path / "none.de"))), f"--input {tmp_path / 'none.de'}: not found")
    refused(lambda: _check_files(opts(input=str(tmp_path))), f"--input {tmp_path}: not a file")
    refused(lambda: _check_files(opts(input=str(src), reference=str(tmp_path / "r"), score_reference=True)),
            f"--reference {tmp_path / 'r'}: not found")
    refused(lambda: _check_files(opts(input=str(src), output=str(src))),
            f"--output {src} is the same file as --input {src}; choose another output")
    refused(lambda: _check_files(opts(input=str(src), target_lang="fr")),
            "--target-lang fr: the model translates de into en only")
    refused(lambda: _check_files(opts(input=str(src), source_lang="fr")),
            "--source-lang fr: the model translates de into en only")
    multi = {"source_lang": "src", "target_lang": "tgt",
             "multilingual": {"pairs": ["de-en", "fr-en"], "langs": ["de", "en", "fr"]}}

    def multi_opts(**kw):
        o = opts(**kw)
        o.source = type("Multi", (), {"manifest": multi})()
        return o

    assert _check_files(multi_opts(input=str(src), target_lang="en")) is None  # raw text: the target is enough
    refused(lambda: _check_files(multi_opts(gen_subset="test", target_lang="en")),
            "--source-lang: a binarized split of a multilingual data directory is one direction; give --source-lang "
            "and --target-lang (de, en, fr)")


def test_check_output_path(tmp_path, monkeypatch):
    from nmtkit.generation.generator import _check_output_path

    src, ckpt, ref = tmp_path / "in.de", tmp_path / "m.pt", tmp_path / "ref.en"
    for p in (src, ckpt, ref):
        p.write_text("x\n", encoding="utf-8")
    (tmp_path / "link.pt").symlink_to(ckpt)
    refused(lambda: _check_output_path(gen(output=str(tmp_path))), f"--output {tmp_path} is a directory; give a file name")
    refused(lambda: _check_output_path(gen(output=str(src), input=str(src))),
            f"--output {src} is the same file as --input {src}; choose another output")
    refused(lambda: _check_output_path(gen(output=str(ref), input=str(src), reference=str(ref), score_reference=True)),
            f"--output {ref} is the same file as --reference {ref}; choose another output")
    for flag in ("avoid", "prefix"):  # the rule files are inputs too
        refused(lambda: _check_output_path(gen(output=str(ref), input=str(src), **{flag: str(ref)})),
                f"--output {ref} is the same file as --{flag} {ref}; choose another output")
    refused(lambda: _check_output_path(gen(output=str(tmp_path / "link.pt"), paths=["other.pt", str(ckpt)])),
            f"--output {tmp_path / 'link.pt'} is the same file as --path {ckpt}; choose another output")
    # accepted: stdout, a new file, an existing file that is none of the inputs, stdin as input
    for out in (None, "-", str(tmp_path / "new.txt")):
        _check_output_path(gen(output=out, input=str(src)))
    # "-" is stdout as --output and stdin as --input, even beside a file or a folder named "-"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").mkdir()
    _check_output_path(gen(output="-", input=str(src)))
    (tmp_path / "-").rmdir()
    (tmp_path / "-").write_text("", encoding="utf-8")
    _check_output_path(gen(output="-", input="./-"))
    _check_output_path(gen(output=str(tmp_path / "-"), input="-"))
    other = tmp_path / "old.txt"
    other.write_text("", encoding="utf-8")
    _check_output_path(gen(output=str(other), input="-", paths=[str(ckpt), str(tmp_path / "missing.pt")]))
    assert other.read_text(encoding="utf-8") == ""


# ---------------------------------------------------------------------------------------------
# serve


def serve(**kw):
    from nmtkit.serving.options import ServeOptions

    return _model_options(ServeOptions, **kw)


@pytest.mark.parametrize("bad,message", [
    ({"paths": []}, "--path is required (give it several times for an ensemble)"),
    ({"port": -1}, "--port must be in 0..65535, got -1"),
    ({"port": 65536}, "--port must be in 0..65535, got 65536"),
    ({"max_batch_sentences": 0}, "--max-batch-sentences must be >= 1, got 0"),
    ({"max_queue": 0}, "--max-queue must be >= 1, got 0"),
    ({"max_request_sentences": 0}, "--max-request-sentences must be >= 1, got 0"),
    ({"max_sentence_chars": 0}, "--max-sentence-chars must be >= 1, got 0"),
    ({"max_beam": 0}, "--max-beam must be >= 1, got 0"),
    ({"max_batch_tokens": 0}, "--max-batch-tokens must be >= 1, got 0"),
    ({"max_wait_ms": -1.0}, "--max-wait-ms must be in 0..60000, got -1.0"),
    ({"max_wait_ms": 60001.0}, "--max-wait-ms must be in 0..60000, got 60001.0"),
    ({"max_request_sentences": 11, "max_queue": 10}, "--max-request-sentences 11 exceeds --max-queue 10: such a request "
                                                     "could never be queued"),
    ({"search": {"beam": 17}}, "--beam 17 exceeds --max-beam 16"),
    ({"max_connections": 0}, "--max-connections must be >= 1, got 0"),
    ({"header_timeout": 0.0}, "--header-timeout must be in (0, 3600] seconds, got 0.0"),
    ({"header_timeout": 3600.5}, "--header-timeout must be in (0, 3600] seconds, got 3600.5"),
    ({"body_timeout": 0.0}, "--body-timeout must be in (0, 3600] seconds, got 0.0"),
    ({"body_timeout": 3600.5}, "--body-timeout must be in (0, 3600] seconds, got 3600.5"),
    ({"graceful_timeout": -0.5}, "--graceful-timeout must be in [0, 3600] seconds, got -0.5"),
    ({"graceful_timeout": 3600.5}, "--graceful-timeout must be in [0, 3600] seconds, got 3600.5"),
])
def test_serve_refusals(bad, message):
    refused(lambda: serve(**bad).validate(), message)


def test_serve_boundaries_are_accepted():
    for ok in ({"port": 0}, {"port": 65535}, {"max_batch_sentences": 1, "max_batch_tokens": 1}, {"max_wait_ms": 0.0},
               {"max_wait_ms": 60000.0}, {"max_request_sentences": 10, "max_queue": 10}, {"search": {"beam": 16}},
               {"max_queue": 1, "max_request_sentences": 1, "max_sentence_chars": 1, "max_beam": 4},
               {"max_connections": 1}, {"header_timeout": 0.5, "body_timeout": 0.5},
               {"header_timeout": 3600.0, "body_timeout": 3600.0}, {"graceful_timeout": 0.0},
               {"graceful_timeout": 0.5}, {"graceful_timeout": 3600.0}):
        serve(**ok).validate()


# ---------------------------------------------------------------------------------------------
# export


def test_export_refusals():
    from nmtkit.backends.export import ExportOptions

    def opts(**kw):
        return ExportOptions(data_dir="d", path="m.pt", output="out", **kw)

    refused(lambda: opts(format="tflite").validate(), "--format must be one of ctranslate2, onnx, huggingface, got 'tflite'")
    refused(lambda: opts(quantization="int4").validate(),
            "--quantization must be one of float32, int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, "
            "bfloat16, got 'int4'")
    for q in ("float32", "int8", "bfloat16"):
        opts(quantization=q).validate()


def test_export_file_refusals(tmp_path):
    """--score-file (Hugging Face's model card only) and --shortlist (the runtimes with vocabulary
    selection only), each checked before anything is read."""
    from nmtkit.backends.export import ExportOptions

    scores, shortlist = tmp_path / "bleu.json", tmp_path / "shortlist.txt"
    scores.write_text("{}", encoding="utf-8")
    shortlist.write_text("\tx\n", encoding="utf-8")

    def opts(**kw):
        return ExportOptions(data_dir="d", path="m.pt", output="out", **kw)

    for fmt in ("ctranslate2", "onnx"):
        refused(lambda: opts(format=fmt, score_file=str(scores)).validate(),
                f"--score-file: the {fmt} export has no model card; drop it")
        opts(format=fmt, shortlist=str(shortlist)).validate()
        refused(lambda: opts(format=fmt, shortlist=str(tmp_path / "none")).validate(),
                f"--shortlist {tmp_path / 'none'}: not found (make one with nmtkit shortlist DATA_DIR)")
    opts(format="huggingface", score_file=str(scores)).validate()
    refused(lambda: opts(format="huggingface", score_file=str(tmp_path / "none")).validate(),
            f"--score-file {tmp_path / 'none'}: not found (give the output of nmtkit score)")
    refused(lambda: opts(format="huggingface", shortlist=str(shortlist)).validate(),
            "--shortlist: the huggingface export's runtime has no vocabulary selection; export to onnx or ctranslate2")


# ---------------------------------------------------------------------------------------------
# score


def score(**kw):
    from nmtkit.scoring.files import ScoreOptions

    kw.setdefault("ref", [Path("ref.txt")])
    return ScoreOptions(**kw)


@pytest.mark.parametrize("bad,message", [
    ({"metric": "parseval", "lowercase": True}, "--lowercase does not apply to --metric parseval"),
    ({"metric": "parseval", "tokenize": "13a"}, "--tokenize does not apply to --metric parseval"),
    ({"metric": "parseval", "lang": "de"}, "--lang does not apply to --metric parseval"),
    ({"metric": "parseval", "compound_split": True}, "--compound-split does not apply to --metric parseval"),
    ({"metric": "parseval", "pretokenized": True}, "--pretokenized does not apply to --metric parseval"),
    ({"metric": "parseval", "confidence": True}, "--confidence does not apply to --metric parseval"),
    ({"metric": "parseval", "paired_bs": Path("base.txt")}, "--paired-bs does not apply to --metric parseval"),
    ({"metric": "parseval,bleu"}, "--metric parseval cannot be combined with translation metrics; run score twice"),
    ({"metric": "parseval", "ref": [Path("a"), Path("b")]}, "--metric parseval takes exactly one --ref (the gold trees), got 2"),
    ({"metric": "parseval", "ref": []}, "--metric parseval takes exactly one --ref (the gold trees), got 0"),
    ({"per_sentence": True}, "--per-sentence only applies to --metric parseval"),
    ({"evalb_param": Path("x.prm")}, "--evalb-param only applies to --metric parseval"),
    ({"tokenize": "13a", "metric": "chrf"}, "--tokenize applies to --metric bleu (sacreBLEU); tok-bleu uses Moses "
                                            "tokenization (--lang)"),
    ({"lang": "de"}, "--lang only applies to --metric tok-bleu"),
    ({"compound_split": True}, "--compound-split only applies to --metric tok-bleu"),
    ({"pretokenized": True}, "--pretokenized only applies to --metric tok-bleu"),
    ({"metric": "tok-bleu", "pretokenized": True, "lang": "de"}, "--lang has no effect with --pretokenized (no Moses "
                                                                 "tokenization is done)"),
    ({"confidence": True, "confidence_n": 1}, "--confidence-n must be >= 2, got 1"),
    ({"paired_bs": Path("base.txt"), "paired_bs_n": 1}, "--paired-bs-n must be >= 2, got 1"),
])
def test_score_refusals(bad, message):
    refused(lambda: score(**bad).validate(), message)


def test_score_valid_combinations_are_accepted():
    refused_tok = pytest.raises(UserError)
    with refused_tok as e:
        score(tokenize="nope").validate()
    assert str(e.value).startswith("--tokenize: unknown sacreBLEU tokenizer 'nope' (choose from ") and "13a" in str(e.value)
    for ok in ({}, {"metric": "parseval"}, {"metric": "parseval", "per_sentence": True, "evalb_param": Path("x.prm")},
               {"tokenize": "13a"}, {"metric": "bleu,tok-bleu", "tokenize": "intl", "lang": "de", "compound_split": True},
               {"metric": "tok-bleu", "pretokenized": True}, {"confidence": True, "confidence_n": 2},
               {"paired_bs": Path("b"), "paired_bs_n": 2}, {"confidence_n": 1, "paired_bs_n": 1}):
        score(**ok).validate()


# ---------------------------------------------------------------------------------------------
# attention


def attention(**kw):
    from nmtkit.generation.inspection import AttentionOptions

    if isinstance(kw.get("search"), dict):
        kw["search"] = SearchConfig(**kw["search"])
    return AttentionOptions(data_dir="d", path="m.pt", **kw)


@pytest.mark.parametrize("bad,message", [
    ({"sources": ["x"], "kind": "self"}, "--kind must be one of enc-self, dec-self, cross, got 'self'"),
    ({"sources": ["x"], "level": "chars"}, "--level must be one of subword, words, got 'chars'"),
    ({"sources": ["x"], "format": "svg"}, "--format must be one of png, json, npz, got 'svg'"),
    ({"sources": ["x"], "style": "dots"}, "--style must be one of heatmap, lines, got 'dots'"),
    ({"sources": ["x"], "precision": "fp8"}, "--precision must be one of fp32, bf16, fp16, got 'fp8'"),
    ({"sources": ["x"], "indices": [0]}, "--index and --split-target apply to --gen-subset"),
    ({"sources": ["x"], "split_target": True}, "--index and --split-target apply to --gen-subset"),
    ({}, "give a sentence: --source TEXT (raw text), or --gen-subset SPLIT --index N"),
    ({"sources": ["x", "y"], "targets": ["a"]}, "--target: 1 given for 2 --source sentences (one target per source, "
                                                "or none for the model's own translations)"),
    ({"gen_subset": "test", "indices": [0], "sources": ["x"]}, "--source and --gen-subset exclude each other (raw "
                                                               "text or a binarized split)"),
    ({"gen_subset": "test"}, "--gen-subset needs --index N (the 0-based sentence number; give it several times)"),
    ({"gen_subset": "test", "indices": [0], "targets": ["a"], "split_target": True}, "--target and --split-target "
                                                                                     "exclude each other"),
    ({"gen_subset": "test", "indices": [0, 1], "targets": ["a"]}, "--target: 1 given for 2 --index sentences"),
    ({"gen_subset": "test", "indices": [3, -1, -2]}, "--index is a 0-based sentence number, got -1"),
    ({"sources": ["x"], "query": 0}, "--query applies to --style lines (PNG)"),
    ({"sources": ["x"], "query": 0, "style": "lines", "format": "json"}, "--query applies to --style lines (PNG)"),
    ({"sources": ["x"], "query": -1, "style": "lines"}, "--query is a 0-based token position, got -1"),
    ({"sources": ["x"], "query": "  ", "style": "lines"}, "--query takes a 0-based query token position or the "
                                                         "token itself, got ''"),
    ({"sources": ["x"], "layer": 0}, "--layer is 1-based (1 = the lowest layer), got 0"),
    ({"sources": ["x"], "heads": "2,0,1"}, "--heads are 1-based (1 = the first head), got 0"),
    ({"sources": ["x"], "heads": "1,x"}, "--heads takes head numbers separated by commas (1-based) or 'all', got '1,x'"),
    ({"sources": ["x"], "heads": "1,2,1"}, "--heads names a head twice: '1,2,1'"),
    ({"sources": ["x"], "threads": -1}, "--threads must be >= 0 (0 = torch's default), got -1"),
    ({"sources": ["x"], "search": {"sampling": True}}, "--sampling: the model's own translation here is its beam (or "
                                                       "greedy) search result"),
])
def test_attention_refusals(bad, message):
    refused(lambda: attention(**bad).validate(), message)


def test_attention_valid_combinations_are_accepted():
    from nmtkit.generation.inspection import _heads

    for ok in ({"sources": ["x"]}, {"sources": ["x", "y"], "targets": ["a", "b"]},
               {"gen_subset": "test", "indices": [0, 2]}, {"gen_subset": "test", "indices": [0], "split_target": True},
               {"gen_subset": "test", "indices": [0, 1], "targets": ["a", "b"]},
               {"sources": ["x"], "query": 0, "style": "lines"}, {"sources": ["x"], "layer": 1, "heads": "1,3"},
               {"sources": ["x"], "heads": " all "}, {"sources": ["x"], "threads": 0, "kind": "enc-self", "level": "words"}):
        attention(**ok).validate()
    assert _heads(None) is None and _heads("all") is None and _heads(" all") is None
    assert _heads("3,1") == [3, 1] and _heads("2") == [2]


# ---------------------------------------------------------------------------------------------
# nmtkit.cli.main: one line, the right exit status


class _Command:
    """Stands in for the typer command: `main` raises what the test gives (or returns it)."""

    def __init__(self, outcome):
        self.outcome = outcome

    def main(self, **kwargs):
        assert kwargs["prog_name"] == "nmtkit" and kwargs["standalone_mode"] is False
        self.args = kwargs["args"]
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


@pytest.fixture
def run_main(monkeypatch, capsys):
    import nmtkit.cli as cli
    from nmtkit.cli.app import state

    saved = state["debug"]

    def run(outcome, *argv: str, from_sys: bool = False):
        command = _Command(outcome)
        monkeypatch.setattr(cli.typer.main, "get_command", lambda app: command)
        state["debug"] = False
        try:
            cli.main(None if from_sys else list(argv))
            code = "returned"
        except SystemExit as e:
            code = e.code
        finally:
            debug, state["debug"] = state["debug"], saved
        cap = capsys.readouterr()
        assert command.args == (None if from_sys else list(argv))  # the arguments reach the command
        return code, cap.out, cap.err, debug

    return run


def test_main_user_error_is_one_line_exit_2(run_main):
    assert run_main(UserError("in.de:3: bad line")) == (2, "", "nmtkit: error: in.de:3: bad line\n", False)
    # a SettingError is a UserError
    assert run_main(SettingError("--beam must be >= 1, got 0"))[:3] == (2, "", "nmtkit: error: --beam must be >= 1, got 0\n")


def test_main_debug_keeps_the_traceback(run_main):
    for exc in (UserError("bad"), RuntimeError("bug"), OSError(errno.EACCES, "denied")):
        with pytest.raises(type(exc)):
            run_main(exc, "generate", "--debug")


def test_main_debug_is_read_from_argv_only_when_given(run_main, monkeypatch):
    import sys

    from nmtkit.cli.app import state

    assert run_main(0, "score", "--debug")[3] is True
    assert run_main(0, "score")[3] is False
    # argv None: sys.argv[1:] is read (the program name is not a flag)
    monkeypatch.setattr(sys, "argv", ["--debug", "score"])
    assert run_main(0, from_sys=True)[3] is False
    monkeypatch.setattr(sys, "argv", ["nmtkit", "score", "--debug"])
    assert run_main(0, from_sys=True)[3] is True
    monkeypatch.setattr(sys, "argv", ["nmtkit", "--debug", "score"])
    assert run_main(0, from_sys=True)[3] is True
    # NMTKIT_DEBUG=1 (state already True) is kept when --debug is absent
    import nmtkit.cli as cli

    monkeypatch.setattr(cli.typer.main, "get_command", lambda app: _Command(UserError("x")))
    state["debug"] = True
    try:
        with pytest.raises(UserError):
            cli.main(["score"])
    finally:
        state["debug"] = False


def test_main_exit_statuses_of_the_other_outcomes(run_main):
    import typer

    from nmtkit.cli.app import PipeClosed

    assert run_main(None)[:3] == (0, "", "")
    assert run_main(3)[:3] == (3, "", "")  # a command's own integer result
    assert run_main("text")[:3] == (0, "", "")
    assert run_main(typer.Exit(4))[:3] == (4, "", "")
    assert run_main(typer.Abort())[:3] == (130, "", "nmtkit: error: aborted\n")
    assert run_main(KeyboardInterrupt())[:3] == (130, "", "nmtkit: error: interrupted\n")
    assert run_main(PipeClosed())[:3] == (0, "", "")
    assert run_main(BrokenPipeError())[:3] == (0, "", "")
    assert run_main(RuntimeError("boom"))[:3] == (
        1, "", "nmtkit: error: internal error: RuntimeError: boom (run with --debug for the traceback)\n")
    assert run_main(OSError(errno.EACCES, "Permission denied"))[:3] == (
        1, "", "nmtkit: error: internal error: PermissionError: [Errno 13] Permission denied (run with --debug for "
               "the traceback)\n")


def test_main_a_full_disk_is_a_user_error(run_main):
    full = OSError(errno.ENOSPC, "No space left on device", "/out/model.pt")
    assert run_main(full)[:3] == (2, "", "nmtkit: error: no space left on device while writing /out/model.pt\n")
    assert run_main(OSError(errno.ENOSPC, "No space left on device"))[:3] == (
        2, "", "nmtkit: error: no space left on device\n")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded", "/out/x")
    assert run_main(quota)[:3] == (2, "", "nmtkit: error: disk quota exceeded while writing /out/x\n")


def test_cli_usage_errors_name_the_command_s_help(run_cli):
    r = run_cli("generate", "--zzz")  # a flag spelled close to a real one gets click's suggestion too
    assert r.code == 2 and r.out == ""
    assert r.err == "nmtkit: error: No such option: --zzz (see 'nmtkit generate --help')\n"
    r = run_cli("generat")
    assert r.code == 2
    assert r.err == "nmtkit: error: No such command 'generat'. Did you mean 'generate'?\n"
    r = run_cli("score", "--metric")  # a flag without its value (click gives no context here)
    assert r.code == 2 and r.err == "nmtkit: error: Option '--metric' requires an argument.\n"
    r = run_cli()  # no arguments at all: the help, exit 0
    assert r.code == 0 and "Usage: nmtkit" in r.out and "generate" in r.out and r.err == ""
    r = run_cli("generate")  # a command without its required flags is a usage error
    assert r.code == 2 and r.err == "nmtkit: error: Missing option '--path'. (see 'nmtkit generate --help')\n"
    r = run_cli("generate", "--remove-bpe")  # one of fairseq's flags: what nmtkit does instead
    assert (r.code, r.out, r.err) == (2, "", "nmtkit: error: --remove-bpe: nmtkit removes subwords itself; drop it\n")


def test_cli_usage_errors_under_debug_raise(run_cli):
    import click
    import typer

    errors = tuple(c for c in (getattr(getattr(typer, "_click", None), "exceptions", None), click.exceptions) if c)
    with pytest.raises(tuple(m.ClickException for m in errors)):
        run_cli("--debug", "generate", "--no-such-flag")


def test_cli_refusals_end_to_end_are_exact_lines(run_cli, tmp_path, monkeypatch):
    """One refusal per command through the real CLI: the config's message, one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    cases = [
        (("train", "d", "--save-dir", "s", "--update-freq", "0"), "--update-freq must be > 0, got 0"),
        (("generate", "d", "--path", "m.pt", "--max-len-b", "6", "--buffer-size", "0"), "--buffer-size must be >= 1, got 0"),
        (("serve", "d", "--path", "m.pt", "--max-len-b", "6", "--port", "70000"), "--port must be in 0..65535, got 70000"),
        (("score", "--ref", "r", "--lang", "de"), "--lang only applies to --metric tok-bleu"),
        (("attention", "d", "--path", "m.pt", "--max-len-b", "6"), "give a sentence: --source TEXT (raw text), or --gen-subset SPLIT --index N"),
        (("export", "d", "--path", "m.pt", "-o", "out", "--quantization", "int4"),
         "--quantization must be one of float32, int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, "
         "bfloat16, got 'int4'"),
    ]
    for args, message in cases:
        r = run_cli(*args)
        assert (r.code, r.out, r.err) == (2, "", f"nmtkit: error: {message}\n"), args


# ---------------------------------------------------------------------------------------------
# preprocess


def prep(**kw):
    from nmtkit.data.preprocess import PreprocessConfig

    base = {"source_lang": "de", "target_lang": "en", "trainpref": "train", "destdir": "out"}
    return PreprocessConfig(**{**base, **kw})


@pytest.mark.parametrize("bad,message", [
    ({"source_lang": ""}, "--source-lang must be a short language code such as 'de', got ''"),
    ({"source_lang": "d/e"}, "--source-lang must be a short language code such as 'de', got 'd/e'"),
    ({"source_lang": "d\\e"}, "--source-lang must be a short language code such as 'de', got 'd\\\\e'"),
    ({"source_lang": "de.x"}, "--source-lang must be a short language code such as 'de', got 'de.x'"),
    ({"source_lang": "d e"}, "--source-lang must be a short language code such as 'de', got 'd e'"),
    ({"source_lang": "d\te"}, "--source-lang must be a short language code such as 'de', got 'd\\te'"),
    ({"target_lang": "-en"}, "--target-lang must be a short language code such as 'de', got '-en'"),
    ({"target_lang": "de"}, "--source-lang and --target-lang must differ, both are 'de'"),
    ({"bpe": "wordpiece"}, "--bpe must be one of sentencepiece, subword-nmt, none, got 'wordpiece'"),
    ({"vocab_size": 0}, "--vocab-size must be >= 1, got 0"),
    ({"bpe_merges": -1}, "--bpe-merges must be >= 0, got -1"),
    ({"spm_max_lines": -1}, "--spm-max-lines must be >= 0, got -1"),
    ({"pad_to_multiple": 0}, "--pad-to-multiple must be >= 1, got 0"),
    ({"max_len": -1}, "--max-len must be >= 0, got -1"),
    ({"min_len": -1}, "--min-len must be >= 0, got -1"),
    ({"workers": 0}, "--workers must be >= 1, got 0"),
    ({"shard_size": 0}, "--shard-size must be >= 1, got 0"),
    ({"thresholdsrc": -1}, "--thresholdsrc must be >= 0, got -1"),
    ({"thresholdtgt": -1}, "--thresholdtgt must be >= 0, got -1"),
    ({"ratio": 0.5}, "--ratio must be 0 (off) or >= 1, got 0.5"),
    ({"ratio": -1.0}, "--ratio must be 0 (off) or >= 1, got -1.0"),
    ({"min_len": 11, "max_len": 10}, "--min-len 11 is larger than --max-len 10"),
    ({"joined_dictionary": True, "nwordstgt": 100}, "--nwordstgt/--thresholdtgt do not apply with --joined-dictionary "
                                                    "(use --nwordssrc/--thresholdsrc)"),
    ({"joined_dictionary": True, "thresholdtgt": 2}, "--nwordstgt/--thresholdtgt do not apply with --joined-dictionary "
                                                     "(use --nwordssrc/--thresholdsrc)"),
    ({"srcdict": "dict.de.txt", "nwordssrc": 100}, "--nwordssrc does not apply with --srcdict/--tgtdict: the reused "
                                                   "dictionaries are taken as they are"),
    ({"tgtdict": "dict.en.txt", "nwordstgt": 100}, "--nwordstgt does not apply with --srcdict/--tgtdict: the reused "
                                                   "dictionaries are taken as they are"),
    ({"srcdict": "d", "thresholdsrc": 1}, "--thresholdsrc does not apply with --srcdict/--tgtdict: the reused "
                                          "dictionaries are taken as they are"),
    ({"srcdict": "d", "thresholdtgt": 1}, "--thresholdtgt does not apply with --srcdict/--tgtdict: the reused "
                                          "dictionaries are taken as they are"),
    ({"srcdict": "d", "target_bpe": "none"}, "--srcdict/--tgtdict apply to --task translation"),
    ({"target_bpe": "bpe"}, "target_bpe must be None or 'none', got 'bpe'"),
    ({"ratio": float("nan")}, "--ratio must be a finite number, got nan"),
])
def test_preprocess_refusals(bad, message):
    refused(lambda: prep(**bad).validate(), message)


def test_preprocess_extra_files(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_text("x\n", encoding="utf-8")
    for name in ("", "a/b", "a\\b", ".hidden", "manifest.json", "x.bin", "x.idx", "x.model", "x.codes", "dict.de.txt"):
        refused(lambda: prep(extra_files={name: str(f)}).validate(),
                f"extra file name {name!r} is not allowed in a data directory")
    refused(lambda: prep(extra_files={"notes.txt": str(tmp_path / "missing")}).validate(),
            f"file not found: {tmp_path / 'missing'}")
    refused(lambda: prep(extra_files={"notes.txt": str(tmp_path)}).validate(), f"file not found: {tmp_path}")
    prep(extra_files={"notes.txt": str(f), "a.bin.txt": str(f)}).validate()


def test_preprocess_boundaries_are_accepted():
    for ok in ({"vocab_size": 1, "bpe_merges": 0, "spm_max_lines": 0, "pad_to_multiple": 1, "workers": 1,
                "shard_size": 1, "thresholdsrc": 0}, {"ratio": 0.0}, {"ratio": 1.0}, {"max_len": 0, "min_len": 5},
               {"min_len": 10, "max_len": 10}, {"joined_dictionary": True, "nwordssrc": 50, "thresholdsrc": 2},
               {"srcdict": "a", "tgtdict": "b"}, {"target_bpe": "none"}, {"target_bpe": None}, {"bpe": "none"},
               {"source_lang": "pt_BR", "target_lang": "en-US"}, {"source_lang": "Xx", "target_lang": "XX"},
               {"min_len": 0}):
        prep(**ok).validate()


def test_main_a_reader_gone_at_the_final_flush_is_exit_0(run_main, monkeypatch):
    """`nmtkit generate ... | head`: stdout is flushed inside main, so a closed pipe found only
    then is the quiet exit 0 too, not the command's status or an error."""
    import sys

    class GonePipe:
        def write(self, text):
            return len(text)

        def flush(self):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", GonePipe())
    assert run_main(3)[:3] == (0, "", "")


def test_main_click_errors_spread_over_lines_become_one(run_main):
    import click

    assert run_main(click.UsageError("first\nsecond"))[:3] == (2, "", "nmtkit: error: first second\n")
    root = click.Context(click.Group("nmtkit"), info_name="nmtkit")
    sub = click.Context(click.Command("train"), parent=root, info_name="train")
    assert run_main(click.UsageError("bad\nflag", ctx=sub))[:3] == (
        2, "", "nmtkit: error: bad flag (see 'nmtkit train --help')\n")
    assert run_main(click.UsageError("bad", ctx=root))[:3] == (2, "", "nmtkit: error: bad\n")
    # a click error without a context at all (not a usage error)
    assert run_main(click.ClickException("no context"))[:3] == (2, "", "nmtkit: error: no context\n")


def test_error_line_is_bold_red_on_a_terminal(monkeypatch):
    """On a terminal the line is bold red; the text is printed as it is (no markup, no emoji)."""
    import io

    from rich.console import Console

    import nmtkit.cli as cli

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="standard", markup=False, emoji=False,
                      highlight=False, width=200)
    monkeypatch.setattr(cli, "_err", console)
    cli.error_line("train.de:100: [bold]x[/bold] :smile:")
    assert buf.getvalue() == "\x1b[1;31mnmtkit: error: train.de:100: [bold]x[/bold] :smile:\x1b[0m\n"
