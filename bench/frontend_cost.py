"""Measure the serving front end's per-input-token cost: a Hugging Face fast tokenizer (`tokenizers`, the Rust
library vLLM's, SGLang's and trtllm-serve's API servers tokenise prompts with) encoding prompts of growing length on
this host, one thread at a time as vLLM's API server does (its tokeniser runs on a ThreadPoolExecutor(max_workers=1)).

The prompt text is what `vllm bench serve --dataset-name random` sends: random token ids decoded to text (and a
second, prose-like text: the standard library's docstrings). A least-squares line time = a + b x tokens over the
lengths gives b (us per input token) and a (us per call). The per-request part of the front end is not measured
here: it comes from the calibration recipe's fits on real vLLM servers (`bench/results/recipe_fidelity-vllm.json`,
read below). Writes bench/results/frontend.json; capacity.engine.frontend holds the figures taken from it.

`tokenizers` is not a project dependency: run it from a scratch environment, with a tokenizer.json at hand
(huggingface.co may not be reachable; the anthropic 0.30.0 wheel on PyPI ships one, a 65k-vocab byte-level BPE):

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
    pip download --no-deps anthropic==0.30.0 -d /tmp/anth && unzip -o /tmp/anth/*.whl anthropic/tokenizer.json -d /tmp/anth
    /tmp/tokvenv/bin/python bench/frontend_cost.py /tmp/anth/anthropic/tokenizer.json
"""
from __future__ import annotations

import argparse
import json
import platform
import pydoc
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)


def host_cpu() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), "unknown CPU")


def prose() -> str:
    """Docstrings of standard-library modules: natural text with code in it."""
    out = []
    for name in ("argparse", "json", "collections", "statistics", "random", "pathlib", "typing", "email", "asyncio",
                 "subprocess", "unittest", "logging", "datetime", "decimal", "fractions", "inspect"):
        mod = __import__(name)
        out.append(pydoc.render_doc(mod, renderer=pydoc.plaintext))
    return "\n".join(out)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def measure(tok, texts: dict[int, str], repeats: int) -> dict:
    rows = []
    for n, text in texts.items():
        got = len(tok.encode(text).ids)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            tok.encode(text)
            times.append(time.perf_counter() - t0)
        rows.append({"target_tokens": n, "tokens": got, "median_us": statistics.median(times) * 1e6,
                     "min_us": min(times) * 1e6})
    a, b = fit_line([r["tokens"] for r in rows], [r["median_us"] for r in rows])
    # the fastest of the repeats, up to 1024 tokens (calls short enough to run unpreempted on a busy host)
    short = [r for r in rows if r["tokens"] <= 1100]
    a_min, b_min = fit_line([r["tokens"] for r in short], [r["min_us"] for r in short])
    return {"rows": rows, "us_per_call": a, "us_per_token": b, "us_per_call_min_short": a_min,
            "us_per_token_min_short": b_min}


def texts_of(tok, kind: str, seed: int = 0) -> dict[int, str]:
    rng = random.Random(seed)
    vocab = tok.get_vocab_size()
    if kind == "random":  # vllm bench serve's random dataset: random ids, decoded
        return {n: tok.decode([rng.randrange(vocab) for _ in range(n)]) for n in LENGTHS}
    ids = tok.encode(prose()).ids
    return {n: tok.decode(ids[:n]) for n in LENGTHS}


def recipe_front_ends() -> dict:
    out = {}
    for f in ("recipe_fidelity-vllm.json", "recipe_fidelity.json"):
        d = json.loads((ROOT / "bench/results" / f).read_text())
        out[f] = {"server": d.get("engine"), "frontend_ms": [round(x["frontend_s"] * 1e3, 2) for x in d["fits"]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokenizer_json", help="a Hugging Face tokenizer.json")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench/results/frontend.json"))
    args = ap.parse_args()
    import tokenizers  # the scratch environment's (not a project dependency)

    tok = tokenizers.Tokenizer.from_file(args.tokenizer_json)
    res = {"command": "python bench/frontend_cost.py " + " ".join(sys.argv[1:]),
           "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": {"cpu": host_cpu(), "python": platform.python_version(), "tokenizers": tokenizers.__version__},
           "tokenizer": {"file": args.tokenizer_json, "vocab": tok.get_vocab_size()},
           "tokenisation": {k: measure(tok, texts_of(tok, k), args.repeats) for k in ("random", "prose")},
           "per_request_from_recipe_fits": recipe_front_ends()}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    for k, m in res["tokenisation"].items():
        print(f"{k:7s} {m['us_per_token']:.3f} us/token + {m['us_per_call']:.1f} us/call (medians); "
              f"{m['us_per_token_min_short']:.3f} us/token + {m['us_per_call_min_short']:.1f} us/call (fastest, "
              "<= 1024 tokens)  "
              + " ".join(f"{r['tokens']}:{r['median_us']:.0f}us" for r in m["rows"]))
    print(json.dumps(res["per_request_from_recipe_fits"]))


if __name__ == "__main__":
    main()
