"""A screenshot of `nmtkit serve`'s page on a real model (docs/images/serve_page.png).

    python recipes/bench/page_screenshot.py DATA_DIR CHECKPOINT OUT.png [SENTENCE ...]

Starts the server in this process on a free loopback port, opens the page in headless Chromium
(selenium; Debian: apt-get install chromium chromium-driver), translates the sentences (default:
three of Multi30k's test set) with two alternatives each, shows the cross-attention of the first
sentence (last layer, mean of the heads), and saves the window. What the page does is tested in
tests/test_serve_page.py; this only makes the picture.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from nmtkit.serving.options import ServeOptions
from nmtkit.serving.server import Server

SENTENCES = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
             "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
             "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt."]


def wait(condition, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.1)
    raise SystemExit("the page did not get there in time")


def main(data: str, ckpt: str, out: str, sentences: list[str]) -> None:
    srv = Server(ServeOptions(data_dir=data, paths=[ckpt], port=0, threads=2), log=lambda line: print(line, file=sys.stderr))
    port = srv.bind()
    threading.Thread(target=srv.run, daemon=True).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,1250"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait(lambda: "\u2192" in driver.find_element(By.ID, "model").text)
        driver.find_element(By.ID, "source").send_keys("\n".join(sentences))
        driver.find_element(By.ID, "nbest-on").click()
        nbest = driver.find_element(By.ID, "nbest")
        nbest.clear()
        nbest.send_keys("2")
        driver.find_element(By.ID, "translate").click()
        wait(lambda: driver.execute_script("return document.getElementById('heatmap').dataset.cell"))
        time.sleep(0.5)
        driver.save_screenshot(out)
    finally:
        driver.quit()
        srv.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] or SENTENCES)
