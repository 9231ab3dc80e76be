"""The page of `nmtkit serve` (GET /) and its attention endpoint (POST /attention).

Two layers: HTTP tests (any machine with the `serve` extra): the page's headers and policy, and
/attention's answers against `Translator.attention` and its limits; and browser tests, in headless
Chromium driven by Selenium, which type sentences, press the button, and compare what the page
shows with `nmtkit generate` on the same lines, draw the heatmap, show a server error, and run
no script that a translation holds. The browser tests skip with a reason where Chromium, its
driver or the selenium package is missing (CI installs them: .ci/run).

NMTKIT_SCREENSHOT=FILE saves the page after the attention test (docs/images/serve_page.png was
taken so, on the quickstart model: NMTKIT_PAGE_MODEL=DATA_DIR:CHECKPOINT).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import re
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from nmtkit.search.beam import SearchConfig  # noqa: E402
from nmtkit.serving.options import ServeOptions  # noqa: E402
from tests.test_generate import setup  # noqa: E402, F401 - fixture
from tests.test_export import wm  # noqa: E402, F401 - fixture
from tests.test_serve import POOL, options, running, want  # noqa: E402, F401 - fixture


class Identity:
    """A translator without a model that returns each sentence as it came (markup included)."""

    src_lang, tgt_lang, task, device = "de", "en", "translation", "cpu"

    def __init__(self):
        self.search = SearchConfig(max_len_b=6)
        self.engine = SimpleNamespace(name="identity", architectures=lambda: [{"d_model": 8}])

    def search_config(self, **settings):
        return dataclasses.replace(self.search, **settings)

    def translate_nbest(self, sentences, **settings):
        return [[SimpleNamespace(text=s, score=-1.0)] for s in sentences]


def identity_options(tmp_path, **kw) -> ServeOptions:
    f = tmp_path / "model.pt"
    f.write_bytes(b"not read")
    return ServeOptions(paths=[str(f)], port=0, threads=1, max_wait_ms=0.0, **kw)


@pytest.fixture(scope="module")
def served(setup):  # noqa: F811
    data, ckpt, _, _ = setup
    with running(options(data, ckpt, max_wait_ms=20, max_sentence_chars=200, max_beam=6)) as s:
        yield s


@pytest.fixture(scope="module")
def translator(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    return Translator.load(str(ckpt), data_dir=str(data), threads=1, search=SearchConfig(max_len_b=6))  # the served settings


def attention(url, body):
    return httpx.post(f"{url}/attention", json=body, timeout=60)


# ----------------------------------------------------------------------------------------------
# HTTP


def test_the_page_is_served_with_a_policy_that_allows_only_its_own_inline_code(served):
    url, _, _ = served
    r = httpx.get(f"{url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    for kind in ("script", "style"):
        blocks = re.findall(rf"<{kind}>(.*?)</{kind}>", html, re.S)
        assert len(blocks) == 1
        digest = base64.b64encode(hashlib.sha256(blocks[0].encode()).digest()).decode()
        assert f"{kind}-src 'sha256-{digest}'" in csp
    # self-contained: nothing fetched from elsewhere, no inline handlers or style attributes
    assert not re.search(r"""(src|href)\s*=|https?://|@import|\son\w+\s*=|\sstyle\s*=""", html)
    assert r.headers["x-content-type-options"] == "nosniff"


def test_no_ui_serves_the_api_only(setup, tmp_path):  # noqa: F811
    data, ckpt, _, _ = setup
    with running(options(data, ckpt, no_ui=True)) as (url, _, _):
        r = httpx.get(f"{url}/")
        assert r.status_code == 404
        assert r.json() == {"error": "no such path / (the API has /health, /info, /translate and /attention)"}
        assert httpx.post(f"{url}/translate", json={"text": ["a"]}, timeout=60).status_code == 200


def test_attention_equals_the_translators_for_its_translation_and_for_a_given_target(served, translator, want):
    url, _, _ = served
    info = httpx.get(f"{url}/info").json()
    assert info["attention"] is True and "training pairs" in info["data"]
    sentence = next(s for s in POOL if want[s])
    got = attention(url, {"text": sentence}).json()
    ref = translator.attention(sentence)
    assert got["source_tokens"] == ref.source_tokens and got["target_tokens"] == ref.target_tokens
    layers, heads = ref.cross.shape[:2]
    assert (got["layers"], got["heads"], got["layer"], got["head"]) == (layers, heads, layers - 1, None)
    np.testing.assert_allclose(got["weights"], ref.cross[-1].mean(axis=0), atol=6e-5)
    assert got["target_given"] is False and got["score"] == pytest.approx(ref.score.score)
    forced = attention(url, {"text": sentence, "target": want[sentence], "layer": 0, "head": heads - 1}).json()
    given = translator.attention(sentence, want[sentence])  # the text re-segmented: its own pieces
    assert forced["target_tokens"] == given.target_tokens
    np.testing.assert_allclose(forced["weights"], given.cross[0, heads - 1], atol=6e-5)
    assert forced["target_given"] is True and np.allclose(np.sum(forced["weights"], axis=1), 1, atol=1e-3)


@pytest.mark.parametrize("body, status, message", [
    ({"text": ["a list"]}, 400, '"text" must be a string, got ["a list"]'),
    ({"text": "a", "target": 3}, 400, '"target" must be a string, got 3'),
    ({"text": "a", "layer": "top"}, 400, '"layer" must be an integer, got "top"'),
    ({"text": "a", "head": True}, 400, '"head" must be an integer or null'),
    ({"text": "a", "beam": 4}, 400, 'unknown field "beam" (known: text, target, layer, head, target_lang)'),
    ({"target": "a"}, 400, 'missing field "text": one sentence (a string)'),
    ({"text": "a " * 150}, 413, '"text" has 300 characters; at most 200'),
    ({"text": "a", "target": "b" * 201}, 413, '"target" has 201 characters; at most 200'),
    ({"text": "a", "layer": 2}, 400, '"layer" 2 is out of range: the model has 2 layers (0-based)'),
    ({"text": "a", "head": 4}, 400, '"head" 4 is out of range: the model has 4 heads (0-based)'),
    ({"text": ""}, 400, "empty source sentence"),
])
def test_bad_attention_requests_get_their_status_and_one_sentence(served, body, status, message):
    url, _, _ = served
    r = attention(url, body)
    assert r.status_code == status and message in r.json()["error"], r.json()
    assert "\n" not in r.json()["error"]


def test_attention_on_an_engine_without_weights_is_501_and_info_says_so(tmp_path):
    with running(identity_options(tmp_path), load=lambda opts, warn: Identity()) as (url, _, _):
        assert httpx.get(f"{url}/info").json()["attention"] is False
        r = attention(url, {"text": "a"})
        assert r.status_code == 501 and "identity, which gives no attention weights" in r.json()["error"]


# ----------------------------------------------------------------------------------------------
# the browser


def browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[ui-test]' in the nmtkit checkout)"
    for exe in ("chromium", "chromedriver"):
        if shutil.which(exe) is None:
            return f"{exe} is not installed (Debian: apt-get install chromium chromium-driver)"
    return None


needs_browser = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")


@pytest.fixture(scope="module")
def browser():
    if browser_missing():
        pytest.skip(browser_missing())
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,1200", "--lang=en"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    yield driver
    driver.quit()


def wait_for(driver, condition, timeout: float = 30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition(driver)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("the page did not get there in time: " + driver.find_element("id", "error").text)


def translate_on_page(driver, url: str, text: str, keys: bool = False, reload: bool = True) -> list[str]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    if reload:
        driver.get(url + "/")
    wait_for(driver, lambda d: "\u2192" in d.find_element(By.ID, "model").text)  # /info arrived
    box = driver.find_element(By.ID, "source")
    box.clear()
    box.send_keys(text)
    before = driver.find_element(By.ID, "timing").text
    if keys:
        box.send_keys(Keys.CONTROL, Keys.ENTER)
    else:
        driver.find_element(By.ID, "translate").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "timing").text not in (before, "translating...")
             or d.find_element(By.ID, "error").text)
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#translations > li > .translation")]


@needs_browser
@pytest.mark.slow
def test_the_page_translates_what_generate_translates(browser, served, want):
    url, _, _ = served
    sentences = [s for s in POOL if s.strip()][:6]  # the page leaves blank lines out
    assert translate_on_page(browser, url, "\n".join(sentences)) == [want[s] for s in sentences]
    assert re.fullmatch(r"6 sentence\(s\) in \d+ ms", browser.find_element("id", "timing").text)
    assert translate_on_page(browser, url, sentences[0], keys=True) == [want[sentences[0]]]  # Ctrl+Enter
    info = browser.find_element("id", "model").text
    assert "de \u2192 en" in info and "training pairs" in info and "device: cpu" in info


@needs_browser
@pytest.mark.slow
def test_the_heatmap_draws_the_weights_of_the_chosen_layer_and_head(browser, served, want):
    from selenium.webdriver.support.ui import Select

    url, _, _ = served
    sentence = next(s for s in POOL if want[s])
    translate_on_page(browser, url, sentence)
    Select(browser.find_element("id", "head")).select_by_value("0")
    wait_for(browser, lambda d: d.execute_script("return document.getElementById('heatmap').dataset.cell"))
    time.sleep(0.5)  # the redraw for head 1 after the first one (mean)
    ref = attention(url, {"text": sentence, "target": want[sentence], "layer": -1, "head": 0}).json()
    pixels = browser.execute_script("""
        const c = document.getElementById('heatmap'), d = c.dataset, ctx = c.getContext('2d');
        const out = [];
        for (let t = 0; t < Number(d.rows); t++) for (let s = 0; s < Number(d.columns); s++) {
          const x = Number(d.left) + s * Number(d.cell) + 2, y = Number(d.top) + t * Number(d.cell) + 2;
          out.push(Array.from(ctx.getImageData(x, y, 1, 1).data));
        }
        return [Number(d.rows), Number(d.columns), out];""")
    rows, cols, rgba = pixels
    assert (rows, cols) == (len(ref["target_tokens"]), len(ref["source_tokens"]))
    want_red = [round(255 * (1 - w)) for row in ref["weights"] for w in row]
    assert [p[0] for p in rgba] == pytest.approx(want_red, abs=1)  # each cell's colour is its weight
    assert [p[2] for p in rgba] == [255] * len(rgba) and any(r < 200 for r in want_red)  # not blank
    if os.environ.get("NMTKIT_SCREENSHOT"):
        browser.save_screenshot(os.environ["NMTKIT_SCREENSHOT"])


@needs_browser
@pytest.mark.slow
def test_a_server_error_shows_as_a_readable_message(browser, served):
    url, _, _ = served
    assert translate_on_page(browser, url, "a" * 250) == []
    assert browser.find_element("id", "error").text == '"text"[0] has 250 characters; at most 200'


@needs_browser
@pytest.mark.slow
def test_markup_in_a_translation_is_shown_as_text_and_runs_nothing(browser, tmp_path):
    hostile = ['<script>window.pwned = 1</script>', '<img src=x onerror="window.pwned = 2">',
               '"><svg onload="window.pwned = 3">']
    with running(identity_options(tmp_path), load=lambda opts, warn: Identity()) as (url, _, _):
        shown = translate_on_page(browser, url, "\n".join(hostile))
        assert shown == hostile
        assert browser.execute_script("return window.pwned === undefined")
        assert browser.execute_script("return document.querySelectorAll('#translations img, #translations svg, "
                                      "#translations script').length") == 0
        note = browser.find_element("id", "attention-note")
        assert note.is_displayed() and "identity, which does not give them" in note.text
        assert not browser.find_element("id", "attention-panel").is_displayed()
        assert not browser.find_element("id", "terms").is_displayed()  # a runtime without a constrained search


@needs_browser
@pytest.mark.slow
def test_the_page_on_a_ctranslate2_export_translates_and_hides_the_attention_panel(browser, wm):  # noqa: F811
    pytest.importorskip("ctranslate2")
    from nmtkit import Translator
    from tests.test_export import export_dir, sentences

    out = export_dir(wm, "post")
    texts = [t for t in sentences(6, 3) if t.strip()]
    want = Translator.load(str(out), threads=1).translate(texts)
    opts = ServeOptions.from_flags({  # the command line's defaults on an export: its engine's decoding
        **{k: getattr(ServeOptions(paths=[str(out)]), k) for k in ServeOptions.__dataclass_fields__},
        "paths": [str(out)], "data_dir": None, "port": 0, "threads": 1, "max_wait_ms": 0.0,
        "search": {**SearchConfig().__dict__, "lenpen_form": None, "max_len_b": None, "early_stop": None},
    })
    with running(opts) as (url, _, _):
        assert translate_on_page(browser, url, "\n".join(texts)) == want
        assert "ctranslate2" in browser.find_element("id", "model").text
        note = browser.find_element("id", "attention-note")
        assert note.is_displayed() and "runs on ctranslate2, which does not give them" in note.text
        assert not browser.find_element("id", "attention-panel").is_displayed()
        assert not browser.find_element("id", "terms").is_displayed()  # CTranslate2 has no constrained search


@needs_browser
@pytest.mark.slow
def test_terminology_typed_on_the_page_reaches_the_search(browser, served, translator, want):
    from selenium.webdriver.common.by import By

    url, _, _ = served
    sentences = [s for s in POOL if s.strip() and want[s]][:2]
    words = sorted({w for s in POOL for w in want[s].split()} - set(" ".join(want[s] for s in sentences).split()))
    must, avoid = words[0], want[sentences[1]].split()[0]
    expect = translator.translate(sentences, constraints=[[must], None], avoid=[[avoid], [avoid]])
    assert expect[0] != want[sentences[0]] and must in expect[0].split()  # the constraint changes the output
    browser.get(url + "/")
    wait_for(browser, lambda d: d.find_element(By.ID, "terms").is_displayed())
    browser.find_element(By.ID, "constraints").send_keys(must + "\n")
    browser.find_element(By.ID, "avoid").send_keys(avoid)
    assert translate_on_page(browser, url, "\n".join(sentences), reload=False) == expect


def test_every_header_of_the_page_and_the_api_is_the_documented_one(served):
    """The whole header set, not a few names: the page's policy rebuilt here from its own inline
    blocks, and the API's JSON answers (an answer, an error) with no header beyond the plain ones."""
    url, _, _ = served
    r = httpx.get(f"{url}/")
    html = r.text
    digest = {kind: base64.b64encode(hashlib.sha256(re.search(rf"<{kind}>(.*?)</{kind}>", html, re.S)
                                                     .group(1).encode()).digest()).decode()
              for kind in ("script", "style")}
    csp = ("default-src 'none'; connect-src 'self'; img-src 'self' data:; "
           f"script-src 'sha256-{digest['script']}'; style-src 'sha256-{digest['style']}'; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    plain = {"date", "server", "content-length"}  # present on every answer; their values vary
    assert {k: v for k, v in r.headers.items() if k not in plain} == {
        "content-security-policy": csp, "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
        "cache-control": "no-cache", "content-type": "text/html; charset=utf-8"}
    assert plain - {"server"} <= set(r.headers)
    for answer in (httpx.post(f"{url}/translate", json={"text": ["Ein Hund ."]}, timeout=60),
                   httpx.post(f"{url}/translate", json={"texts": ["a"]}, timeout=60)):
        assert answer.status_code in (200, 400)
        assert {k: v for k, v in answer.headers.items() if k not in plain} == {"content-type": "application/json"}
