"""End to end in a real browser: `streamlit run app.py` on 127.0.0.1 driven by headless Chromium (Debian's
chromium + chromium-driver via Selenium). Changes a slider, checks the page updated and shows no exception
box, saves screenshots (to $SCREENSHOT_DIR when set). Skipped only where no browser is installed; .ci/run
installs one and sets REQUIRE_BROWSER=1, which turns a missing browser into a failure."""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # a real browser and a real server: in CI (`pytest -m slow`)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _need_browser():
    if CHROMIUM and DRIVER:
        return
    msg = "no chromium/chromedriver: apt-get install chromium chromium-driver to run the browser test"
    if os.environ.get("REQUIRE_BROWSER") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def server():
    _need_browser()
    pytest.importorskip("selenium")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, CAPACITY_CACHE_DIR="off", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = open(Path(os.environ.get("SCREENSHOT_DIR", "/tmp")) / f"streamlit-{port}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             # no file watcher: a test never edits the app, and a busy tree (a build, another
                             # test run) overflowed its inotify queue and kept the server at full CPU
                             "--server.fileWatcherType", "none"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"streamlit did not start on {url} (log: {log.name})")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def _metric(drv, label: str) -> str | None:
    from selenium.webdriver.common.by import By

    for m in drv.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]'):
        # textContent, not .text: metrics on inactive tabs are in the DOM but hidden
        lab = m.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]')
        val = m.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricValue"]')
        if lab and val and lab[0].get_attribute("textContent").strip() == label:
            return val[0].get_attribute("textContent").strip() or None
    return None


def _idle(drv) -> bool:
    """No rerun in progress: no spinner and no running-status widget (stale elements are faded while running)."""
    from selenium.webdriver.common.by import By

    return not drv.find_elements(By.CSS_SELECTOR, '[data-testid="stSpinner"], [data-testid="stStatusWidget"]')


def _wait(cond, timeout=180, what=""):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_slider_updates_the_page(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    shots = Path(os.environ.get("SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    browser.get(server)
    before = _wait(lambda: _metric(browser, "KV tokens"), what="the KV tokens metric")
    _wait(lambda: _metric(browser, "P99 TTFT (ms)") and _idle(browser), what="the latency view")
    # the headline answer comes first, above the tabs
    for label in ("GPUs needed", "replicas x TP", "USD per 1M output tokens", "P99 TTFT at that load (ms)"):
        assert _metric(browser, label), label
    browser.save_screenshot(str(shots / "dashboard-default.png"))
    # Streamlit's slider: a visible thumb around a visually hidden <input type=range aria-label=LABEL>
    sel = 'input[type="range"][aria-label="gpu_memory_utilization"]'
    slider = _wait(lambda: next(iter(browser.find_elements(By.CSS_SELECTOR, sel)), None), what="the utilisation slider")
    start = slider.get_attribute("aria-valuetext")
    slider.find_element(By.XPATH, "../..").click()  # the thumb
    for _ in range(10):
        browser.switch_to.active_element.send_keys(Keys.ARROW_LEFT)
    _wait(lambda: (v := browser.find_element(By.CSS_SELECTOR, sel).get_attribute("aria-valuetext")) != start and v,
          what="the slider to move")
    final = float(browser.find_element(By.CSS_SELECTOR, sel).get_attribute("aria-valuetext"))
    assert final < 0.9
    want = f"{_kv_tokens(final):,}"  # what the library says for the utilisation the slider ended on
    _wait(lambda: _metric(browser, "KV tokens") == want, what=f"KV tokens to become {want}")
    assert int(want.replace(",", "")) < int(before.replace(",", ""))  # less memory, fewer KV tokens
    _wait(lambda: _metric(browser, "P99 TTFT (ms)") and _idle(browser), what="the latency view after the change")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    browser.save_screenshot(str(shots / "dashboard-after-slider.png"))
    browser.find_element(By.XPATH, "//*[@role='tab'][contains(., 'Trade-offs')]").click()
    _wait(lambda: len([p for p in browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot") if p.is_displayed()]) >= 3
          and _idle(browser), what="the trade-off charts")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    titles = " | ".join(t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, ".gtitle, .annotation-text"))
    for t in ("P99 TTFT vs max batch", "P99 TPOT vs max batch", "Request context x max_num_seqs", "Throughput vs P99"):
        assert t in titles, (t, titles)
    browser.save_screenshot(str(shots / "dashboard-tradeoffs.png"))
    for tab in ("Latency", "Timeline", "Disaggregated", "Memory"):
        browser.find_element(By.XPATH, f"//*[@role='tab'][contains(., '{tab}')]").click()
        _wait(lambda: _idle(browser), what=f"the {tab} tab")
        time.sleep(1)
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), tab
        browser.save_screenshot(str(shots / f"dashboard-{tab.lower()}.png"))
    browser.set_window_size(1280, 800)
    time.sleep(1)
    browser.save_screenshot(str(shots / "dashboard-1280x800.png"))


def _kv_tokens(util: float) -> int:
    from capacity.engine.config import EngineConfig
    from capacity.engine.memory import budget
    from capacity.files import validate
    from capacity.model.card import load_model_card
    from capacity.model.gpus import get_gpu

    eng = {"tensor_parallel_size": 1, "max_num_seqs": 256, "max_model_len": 8192, "max_num_batched_tokens": 8192,
           "gpu_memory_utilization": util, "block_size": 16, "kv_cache_dtype": "auto", "enable_chunked_prefill": True}
    return budget(load_model_card(ROOT / "models/llama-3.1-8b.yaml"), get_gpu("h100-sxm"),
                  validate(EngineConfig, eng, "engine")).kv_tokens
