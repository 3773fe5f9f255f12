"""Time the dashboard's first paint in a real browser: `python scripts/first_paint.py [app.py]`.

Starts `streamlit run` on a free local port with the disk cache off (a cold start, as a new deployment sees it),
opens the page in headless Chromium (Selenium, Debian's chromium + chromium-driver) and prints the seconds from the
request to (1) the title, (2) the Memory tab's KV tokens, (3) the header's answer ("GPUs needed") and (4) the whole page idle (the script run over, no spinner),
and the host's CPU, since the figures depend on it. One run; repeat it for a spread.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(app: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, CAPACITY_CACHE_DIR="off", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = tempfile.NamedTemporaryFile(prefix="first-paint-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", app, "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--server.fileWatcherType", "none"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1200"):
            opts.add_argument(a)
        drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
        try:
            t0 = time.perf_counter()
            drv.get(url)
            title = memory = header = idle = None
            while time.perf_counter() - t0 < 600:
                if title is None and drv.find_elements(By.CSS_SELECTOR, "h1"):
                    title = time.perf_counter() - t0
                labels = [e.get_attribute("textContent").strip()
                          for e in drv.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]')]
                if memory is None and "KV tokens" in labels:  # the Memory tab, open by default
                    memory = time.perf_counter() - t0
                if header is None and "GPUs needed" in labels:
                    header = time.perf_counter() - t0
                # the script run is over (Streamlit's own flag on the app's root) and nothing spins
                done = drv.find_elements(By.CSS_SELECTOR, '[data-test-script-state="notRunning"]')
                busy = drv.find_elements(By.CSS_SELECTOR, '[data-testid="stSpinner"]')
                if header is not None and done and not busy:
                    idle = time.perf_counter() - t0
                    break
                time.sleep(0.2)
        finally:
            drv.quit()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"app: {app}; CPU: {cpu_model()} x {os.cpu_count()}")
    print(f"title shown after {title:.1f} s" if title is not None else "title not shown within 600 s")
    print(f"Memory tab shown after {memory:.1f} s" if memory is not None else "Memory tab not shown within 600 s")
    print(f"header shown after {header:.1f} s" if header is not None else "header not shown within 600 s")
    print(f"page idle after {idle:.1f} s" if idle is not None else "page not idle within 600 s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "app.py"))
