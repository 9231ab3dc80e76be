"""`nmtkit serve --path EXPORT_DIR`: the server on an export directory (the CTranslate2 runtime).

Each answer must equal `nmtkit generate --path EXPORT_DIR` on the same sentences, with the same
flags; /info says which runtime serves. The model and its export are test_export.py's.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("ctranslate2")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from nmtkit.search.beam import SearchConfig  # noqa: E402
from nmtkit.serving.options import ServeOptions  # noqa: E402
from tests.test_export import export_dir, lines, sentences, wm  # noqa: E402, F401 - fixture
from tests.test_serve import post, running  # noqa: E402


def test_serving_an_export_equals_generate_on_it(wm, tmp_path, run_cli):  # noqa: F811
    out = export_dir(wm, "post")
    texts = sentences(24, 11)
    f = tmp_path / "in.de"
    f.write_text("\n".join(texts) + "\n", encoding="utf-8")
    hyp = tmp_path / "generate.out"
    r = run_cli("generate", "--path", out, "--input", f, "--lenpen-form", "fairseq", "--quiet", "--threads", "1",
                "--batch-size", "1", "--output", hyp)
    assert r.code == 0, r
    want = lines(hyp.read_text(encoding="utf-8"))
    assert len(want) == len(texts) and sum(bool(x) for x in want) > len(texts) // 2
    # the flags' defaults on an export (serve's from_flags): early stop `beam`, the export's max-len-b
    opts = ServeOptions.from_flags({
        **{k: getattr(ServeOptions(paths=[str(out)]), k) for k in ServeOptions.__dataclass_fields__},
        "paths": [str(out)], "data_dir": None, "port": 0, "threads": 1, "max_wait_ms": 50.0,
        "search": {**SearchConfig().__dict__, "lenpen_form": "fairseq", "max_len_b": None, "early_stop": None},
    })
    assert opts.search.early_stop == "beam"
    opts.validate()
    with running(opts) as (url, _, logs):
        info = httpx.get(f"{url}/info").json()
        assert info["model"]["runtime"] == "ctranslate2"
        assert info["model"]["architecture"][0]["d_model"] > 0
        chunks = [texts[i:i + 3] for i in range(0, len(texts), 3)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda c: post(url, {"text": c}), chunks))
    got = [t for a in answers for t in a.json()["translations"]]
    assert all(a.status_code == 200 for a in answers)
    assert got == want


def test_serve_refuses_a_data_dir_or_ema_beside_an_export(wm, run_cli):  # noqa: F811
    out = export_dir(wm, "post")
    r = run_cli("serve", wm["data"], "--path", out, "--lenpen-form", "fairseq")
    assert r.code == 2 and "drop DATA_DIR" in r.err and len(r.err.strip().splitlines()) == 1, r
    r = run_cli("serve", "--path", out, "--ema", "--lenpen-form", "fairseq")
    assert r.code == 2 and "drop --ema" in r.err, r
    r = run_cli("serve", "--path", out, "--quantize", "int8", "--lenpen-form", "fairseq")
    assert r.code == 2 and "nmtkit export --quantization int8" in r.err, r
    r = run_cli("serve", "--path", str(wm["post"]))
    assert r.code == 2 and "missing DATA_DIR" in r.err, r
    # a search setting the export's engine cannot honour: one line, before anything listens
    for args, message in [(["--lenpen-form", "gnmt"], "--lenpen-form gnmt: CTranslate2 has only fairseq's"),
                          (["--early-stop", "bound"], "--early-stop bound: CTranslate2's beam search stops as")]:
        r = run_cli("serve", "--path", out, "--port", "0", *args)
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r


def test_terms_on_an_export_are_refused_in_one_line_naming_ctranslate2(wm, tmp_path, run_cli):  # noqa: F811
    out = export_dir(wm, "post")
    f = tmp_path / "in.de"
    f.write_text("Hund Katze\tdog\n", encoding="utf-8")
    r = run_cli("generate", "--path", out, "--input", f, "--constraints", "--lenpen-form", "fairseq", "--quiet")
    err = [x for x in r.err.strip().splitlines() if not x.startswith("nmtkit: note:")]  # the engine's defaults
    assert r.code == 2 and len(err) == 1 and "CTranslate2 has no constrained search" in err[0], r
    opts = ServeOptions.from_flags({
        **{k: getattr(ServeOptions(paths=[str(out)]), k) for k in ServeOptions.__dataclass_fields__},
        "paths": [str(out)], "data_dir": None, "port": 0, "threads": 1,
        "search": {**SearchConfig().__dict__, "lenpen_form": "fairseq", "max_len_b": None, "early_stop": None},
    })
    with running(opts) as (url, _, _):
        r = post(url, {"text": ["Hund Katze"], "prefix": ["the"]})
        assert r.status_code == 400 and "CTranslate2 has no constrained search" in r.json()["error"]
        assert post(url, {"text": ["Hund Katze"]}).status_code == 200
