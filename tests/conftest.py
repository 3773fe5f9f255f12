import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


def pytest_sessionstart(session):
    """An in-place compiled build (pip install -e . compiles) shadows a later edit of a compiled module: the tests
    would test the old code. Refuse to run instead of passing on it."""
    from capacity import stale_compiled

    if stale := stale_compiled():
        pytest.exit(f"compiled modules older than their sources ({', '.join(stale[:3])}...): run "
                    "`bash scripts/compile.sh` (or `--clean` for pure Python)", returncode=4)


@pytest.fixture
def card():
    from capacity.model.card import load_model_card

    return lambda name: load_model_card(MODELS / f"{name}.yaml")


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the real `capacity` entry point in a subprocess (exit codes and stderr as a user sees them)."""
    env = dict(os.environ, COLUMNS="200", CAPACITY_CACHE_DIR="off")  # tests never read a stale result cache
    return subprocess.run([sys.executable, "-c", "from capacity.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc): a killed command's workers must not outlive it."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out
