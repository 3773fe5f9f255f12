"""End to end in a real browser: `streamlit run app.py` on 127.0.0.1 driven by headless Chromium (Debian's
chromium + chromium-driver via Selenium). Changes a slider, checks the page updated and shows no exception
box; clicks every button of every tab twice (fresh, then cached) in two browser sessions; saves screenshots
(to $SCREENSHOT_DIR when set, which CI keeps). Skipped only where no browser is installed; .ci/run installs
one and sets REQUIRE_BROWSER=1, which turns a missing browser into a failure."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
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
    logs = Path(os.environ.get("SCREENSHOT_DIR", "/tmp"))
    logs.mkdir(parents=True, exist_ok=True)  # CI's artefact folder may not exist yet
    log = open(logs / f"streamlit-{port}.log", "wb")
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
    downloads = tempfile.mkdtemp(prefix="capacity-downloads-")  # the download buttons' files land here
    opts.add_experimental_option("prefs", {"download.default_directory": downloads,
                                           "download.prompt_for_download": False})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()
    shutil.rmtree(downloads, ignore_errors=True)


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


def _wait(cond, timeout=300, what=""):
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
    _wait(lambda: _metric(browser, "P99 TTFT at that load (ms)") and _idle(browser), what="the header")
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
    _wait(lambda: _metric(browser, "P99 TTFT at that load (ms)") and _idle(browser), what="the header after the change")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    browser.save_screenshot(str(shots / "dashboard-after-slider.png"))
    _open_tab(browser, "Latency")
    _wait(lambda: _metric(browser, "P99 TTFT (ms)") and _idle(browser), what="the latency view")
    _open_tab(browser, "Trade-offs")
    _wait(lambda: len([p for p in browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot") if p.is_displayed()]) >= 3
          and _idle(browser), what="the trade-off charts")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    titles = " | ".join(t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, ".gtitle, .annotation-text"))
    for t in ("P99 TTFT vs max batch", "P99 TPOT vs max batch", "Request context x max_num_seqs", "Throughput vs P99"):
        assert t in titles, (t, titles)
    browser.save_screenshot(str(shots / "dashboard-tradeoffs.png"))
    for tab in ("Latency", "Timeline", "Disaggregated", "Memory"):
        _open_tab(browser, tab)
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), tab
        browser.save_screenshot(str(shots / f"dashboard-{tab.lower()}.png"))
    browser.set_window_size(1280, 800)
    time.sleep(1)
    browser.save_screenshot(str(shots / "dashboard-1280x800.png"))


TABS = ("Memory", "Trade-offs", "Latency", "Timeline", "A/B", "Disaggregated", "Autoscale", "Plan & export")
BUTTONS = ('[data-testid="stMain"] [data-testid="stButton"] button, '
           '[data-testid="stMain"] [data-testid="stDownloadButton"] button')


def _open_tab(drv, name: str) -> None:
    """Click a tab and wait for its content: the tabs are lazy, a click reruns the script for the open tab."""
    from selenium.webdriver.common.by import By

    xp = f"//*[@role='tab'][contains(., '{name}')]"
    tab = drv.find_element(By.XPATH, xp)
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", tab)  # not under the sticky header
    tab.click()
    _wait(lambda: drv.find_element(By.XPATH, xp).get_attribute("aria-selected") == "true", what=f"the {name} tab")
    time.sleep(1)  # the rerun starts after the click reaches the server
    _wait(lambda: _idle(drv), what=f"the {name} tab's content")


def _no_error_box(drv, where: str) -> None:
    from selenium.webdriver.common.by import By

    boxes = drv.find_elements(By.CSS_SELECTOR, '[data-testid="stException"], [data-testid="stAlertContentError"]')
    assert not boxes, (where, [b.get_attribute("textContent")[:500] for b in boxes])


def _click_every_button(drv, where: str) -> list[str]:
    """Click each button of the open tab once, including those a click reveals (a run's download buttons), and
    wait for the page after each; the labels clicked, in order."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def unclicked():
        for _ in range(5):  # a rerun may replace a button between finding it and reading it
            try:
                return [b for b in drv.find_elements(By.CSS_SELECTOR, BUTTONS)
                        if b.is_displayed() and b.text.strip() and b.text.strip() not in clicked]
            except StaleElementReferenceException:
                time.sleep(1)
        pytest.fail(f"{where}: the buttons kept changing")

    clicked: list[str] = []
    while True:
        todo = unclicked()
        if not todo:
            return clicked
        label = todo[0].text.strip()
        drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", todo[0])
        todo[0].click()
        clicked.append(label)
        time.sleep(1)
        _wait(lambda: _idle(drv), timeout=600, what=f"{where}: after clicking {label!r}")
        _no_error_box(drv, f"{where}: after clicking {label!r}")


def test_every_button_of_every_tab_twice_in_two_sessions(server, browser, tmp_path):
    """Issue 48: 'Run the plan' crashed (CacheReplayClosureError) whenever the plan was already cached: a second
    click, a reload, another session. Each tab, each of its buttons (and the Disaggregated toggle), clicked in a
    fresh session and then again (cached), then all of it again in a second session; no exception or error box
    anywhere; a screenshot of each tab in each session."""
    from selenium.webdriver.common.by import By

    shots = Path(os.environ.get("SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    first = browser.current_window_handle
    for session in (1, 2):
        if session == 2:
            browser.switch_to.new_window("window")  # a new page load: a second Streamlit session
        browser.get(server)
        _wait(lambda: _metric(browser, "P99 TTFT at that load (ms)") and _idle(browser), what="the header")
        for tab in TABS:
            _open_tab(browser, tab)
            where = f"session {session}, {tab}"
            _no_error_box(browser, where)
            if tab == "Disaggregated":
                toggle = browser.find_element(By.XPATH, "//label[contains(., 'simulate this layout')]")
                if not toggle.find_element(By.CSS_SELECTOR, "input").is_selected():
                    toggle.click()
                    time.sleep(1)
                    _wait(lambda: _idle(browser), timeout=600, what=f"{where}: the layout's simulation")
                _no_error_box(browser, where)
            for attempt in ("fresh", "cached"):
                clicked = _click_every_button(browser, f"{where} ({attempt})")
                if tab in ("Autoscale", "Plan & export"):
                    assert len(clicked) >= 2, (where, attempt, clicked)  # the run, then its downloads
            browser.save_screenshot(str(shots / f"session{session}-{re.sub(r'[^a-z]+', '-', tab.lower())}.png"))
    browser.close()
    browser.switch_to.window(first)


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
