"""Record the golden outputs (see cases.py). Run from the repository root: python -m tests.golden.record [NAME...]"""
import json
import sys

from tests.conftest import ROOT, run_cli
from tests.golden.cases import CASES

OUT = ROOT / "tests" / "golden" / "outputs"


def main(names: list[str]) -> None:
    OUT.mkdir(exist_ok=True)
    for name in names or list(CASES):
        r = run_cli(*CASES[name], timeout=900)
        if r.returncode != 0:
            raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr}")
        data = json.loads(r.stdout)
        (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{name}: recorded", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
