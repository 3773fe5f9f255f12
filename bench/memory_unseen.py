"""Score the start-up memory model on real logs from sources the project had not used (tests/data/startup_v3).

The logs were collected on 2026-12-06 into two groups before anyone looked at them: a case goes to the held-out
group when int(sha256(source URL)) % 3 == 0 (the `*_heldout.yaml` files), else to the development group. The
development group is what the model was checked against while it was worked on; the held-out group is scored once,
at the end (`--group heldout`), and both results are reported.

For each case `inputs.yaml` says what a user would give capacity (the model config, the GPU, the engine release,
the flags the log shows), or why the case cannot be scored (`skip`). The prediction is the engine model's budget
(`get_engine(spec).budget`, the call `capacity memory` makes) and is compared on:

- the KV cache: GiB where the log prints it, else blocks or tokens converted to GiB at the model's bytes per token;
  "5%" = within max(5%, 0.5 GiB) (the issue's criterion), "2%" = within 2%;
- whether the engine started (a log that did not start must be predicted not to fit, and the reverse);
- "over": the KV promised above the logged by more than 5% (the unsafe direction), at the planner's
  (conservative) end.

    python bench/memory_unseen.py                  # development group: table + bench/results/memory_unseen-dev.json
    python bench/memory_unseen.py --group heldout  # once, at the end
    python bench/memory_unseen.py --set v4         # round 4 (tests/data/startup_v4), development group
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
V3 = DATA / "startup_v3"
SETS = {"v3": V3, "v4": DATA / "startup_v4"}  # --set: which round of logs (v4: tests/data/startup_v4, 2026-12-07)
GiB = 1024**3


def _records(path: Path) -> list[dict[str, Any]]:
    d = yaml.safe_load(path.read_text()) or []
    if isinstance(d, dict):
        d = d.get("records") or d.get("cases") or []
    return list(d)


def load_cases(group: str, folder: Path = V3) -> list[dict[str, Any]]:
    """Every log of a group with its engine kind and its inputs (None where inputs.yaml has none)."""
    inputs = (yaml.safe_load((folder / "inputs.yaml").read_text()) or {}).get("cases") or {}
    out = []
    for f in sorted(folder.glob(f"*_{group}.yaml")):
        kind = f.name.split("_")[0]
        for rec in _records(f):
            out.append({"id": rec["id"], "kind": kind, "file": f.name, "log": rec, "inputs": inputs.get(rec["id"])})
    return out


def _card(inp: dict[str, Any]):
    from capacity.model.card import load_model_card

    card = load_model_card(ROOT / inp["model"] if inp["model"].startswith("models/") else DATA / inp["model"])
    if inp.get("overrides"):
        card = card.with_overrides(**inp["overrides"])
    return card


def predict(case: dict[str, Any], kv_estimate: str = "middle"):
    """The budget capacity predicts for a case (check_fit off: a case that does not fit is a result)."""
    from capacity.engine import get_engine
    from capacity.engine.config import EngineConfig
    from capacity.files import validate
    from capacity.model.gpus import get_gpu, with_memory

    inp = case["inputs"]
    gpu = with_memory(get_gpu(inp["gpu"]), inp.get("gpu_memory_gib"))
    cfg = validate(EngineConfig, {"engine": inp["engine"], "kv_estimate": kv_estimate, **(inp.get("flags") or {})},
                   case["id"])
    return get_engine(inp["engine"]).budget(_card(inp), gpu, cfg, check_fit=False)


def logged_kv(case: dict[str, Any]) -> dict[str, Any]:
    """What the log says of the KV cache and whether the engine started, in one shape for the three engines."""
    rec, kind = case["log"], case["kind"]
    if kind == "vllm":
        lg = rec.get("logged") or {}
        gib = lg.get("kv_cache_gib")
        if gib is None and lg.get("kv_cache_gb_as_printed") is not None:
            gib = lg["kv_cache_gb_as_printed"]
        return {"gib": gib, "blocks": lg.get("gpu_blocks"), "tokens": lg.get("kv_cache_tokens"), "fits": lg.get("fits")}
    if kind == "sglang":
        fig = rec.get("figures") or {}
        tokens = fig.get("kv_tokens")
        fits = rec.get("fits")
        if fits is None and "fail" in rec["id"]:
            fits = False
        return {"gib": None, "blocks": None, "tokens": tokens, "fits": fits if fits is not None else (True if tokens else None)}
    r = rec.get("readings") or {}
    return {"gib": r.get("allocated_gib"), "blocks": r.get("primary_blocks"),
            "tokens": r.get("allocated_tokens") or r.get("kv_tokens"),
            "fits": rec.get("fits", False if "fail" in rec["id"] else None)}


def score(case: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": case["id"], "kind": case["kind"], "file": case["file"]}
    inp = case["inputs"]
    if not inp:
        row["skip"] = "no inputs written"
        return row
    if inp.get("skip"):
        row["skip"] = inp["skip"]
        return row
    try:
        b = predict(case)
        lo = predict(case, "conservative")
    except Exception as exc:  # a case the model cannot express is a result too (and counts as a miss)
        row.update(error=f"{type(exc).__name__}: {str(exc)[:160]}", within5=False, fits_ok=False)
        return row
    log = logged_kv(case)
    bpt = b.kv_bytes_per_token if not b.kv_groups or not b.kv_groups.group_size else b.block_bytes / b.block_size
    row.update(engine=b.release, family=family(b.release), fits_log=log["fits"], fits_pred=b.fits, kv_pred_gib=b.kv_budget_bytes / GiB,
               tokens_pred=b.kv_tokens, blocks_pred=b.num_blocks)
    if log["gib"] is not None:
        row["kv_log_gib"] = float(log["gib"])
    elif log["blocks"] is not None:
        row["kv_log_gib"] = log["blocks"] * b.block_bytes / GiB
        row["kv_pred_gib"] = b.num_blocks * b.block_bytes / GiB
    elif log["tokens"] is not None:
        row["kv_log_gib"] = log["tokens"] * bpt / GiB
        row["kv_pred_gib"] = b.kv_tokens * bpt / GiB
    # whether the engine starts: SGLang starts with any pool and cuts requests at it (a pool under one context_len
    # request is `fits` False for a plan, with that reason), vLLM and TensorRT-LLM refuse to
    starts = b.fits or (b.engine == "sglang" and b.kv_tokens > 0)
    row["starts_pred"] = starts
    row["fits_ok"] = log["fits"] is None or bool(log["fits"]) == starts
    started = log["fits"] is not False
    if "kv_log_gib" in row and started and row["kv_log_gib"] > 0:
        kl, kp = row["kv_log_gib"], row["kv_pred_gib"]
        row["kv_err_gib"] = kp - kl
        row["kv_err_pct"] = 100 * (kp - kl) / kl
        row["within5"] = abs(kp - kl) <= max(0.05 * kl, 0.5)
        row["within2"] = abs(kp - kl) <= 0.02 * kl
        plan = lo.planning_blocks * lo.block_bytes / GiB if log["gib"] is None else lo.ranges["kv_budget"][0] / GiB
        row["plan_over_pct"] = 100 * (plan - kl) / kl
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def part(rs: list[dict[str, Any]]) -> dict[str, Any]:
        tried = [r for r in rs if "skip" not in r]
        kv = [r for r in tried if "within5" in r]
        dnf = [r for r in tried if r.get("fits_log") is False]
        return {
            "cases": len(rs), "scored": len(tried), "errors": sum(1 for r in tried if "error" in r),
            "kv_cases": len(kv), "within_5pct_or_0.5gib": sum(1 for r in kv if r["within5"]),
            "within_2pct": sum(1 for r in kv if r.get("within2")),
            "fit_verdict_right": sum(1 for r in tried if r.get("fits_ok")),
            "does_not_fit_predicted": f"{sum(1 for r in dnf if r.get('fits_ok'))}/{len(dnf)}",
            "plan_over_by_more_than_5pct": [r["id"] for r in kv if r.get("plan_over_pct", 0) > 5],
            "pass": sum(1 for r in tried if _passes(r)),
        }

    kinds = sorted({r["kind"] for r in rows})
    fams = sorted({r["family"] for r in rows if r.get("family")})
    return {"all": part(rows), "by_engine": {k: part([r for r in rows if r["kind"] == k]) for k in kinds},
            "by_family": {f: part([r for r in rows if r.get("family") == f]) for f in fams}}


def family(engine: str) -> str:
    """The release family a prediction came from (how its profiler counts): vLLM V0 to 0.6.3 (free memory
    consumed since init), V0 0.6.4-0.10, V1 0.7-0.16, V1 0.17+; SGLang; TensorRT-LLM."""
    if not engine.startswith("vllm"):
        return engine.split("@")[0]
    from capacity.engine.vllm.release import parse_engine, release

    _, v, runner = parse_engine(engine)
    rel = release(v, runner)
    if rel.runner == "v0":
        return "vllm V0 <= 0.6.3" if rel.version <= (0, 6, 3) else "vllm V0 0.6.4-0.10"
    return "vllm V1 0.7-0.16" if rel.version < (0, 17, 0) else "vllm V1 0.17+"


def _passes(r: dict[str, Any]) -> bool:
    """The issue's criterion for a case: the fit verdict right and, where a KV figure is logged, within max(5%,
    0.5 GiB)."""
    if "error" in r:
        return False
    return bool(r.get("fits_ok")) and r.get("within5", True)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'case':40} {'engine':14} {'KV log':>7} {'pred':>7} {'err%':>7} {'fit':>4} {'ok':>3}"]
    for r in rows:
        if "skip" in r:
            lines.append(f"{r['id'][:40]:40} skipped: {r['skip'][:40]}")
            continue
        if "error" in r:
            lines.append(f"{r['id'][:40]:40} cannot express: {r['error'][:40]}")
            continue
        kl = f"{r['kv_log_gib']:.2f}" if "kv_log_gib" in r else ""
        kp = f"{r['kv_pred_gib']:.2f}"
        err = f"{r['kv_err_pct']:+.1f}" if "kv_err_pct" in r else ""
        fit = ("ok" if r["fits_ok"] else "NO")
        lines.append(f"{r['id'][:40]:40} {r['engine'][:14]:14} {kl:>7} {kp:>7} {err:>7} {fit:>4} "
                     f"{'yes' if _passes(r) else 'NO':>3}")
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", choices=("dev", "heldout"), default="dev")
    ap.add_argument("--set", choices=sorted(SETS), default="v3", help="which round of logs (default v3)")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    rows = [score(c) for c in load_cases(a.group, SETS[a.set])]
    result = {"set": a.set, "group": a.group, "host": platform.node() or "?", "summary": summary(rows), "cases": rows}
    out = ROOT / "bench" / "results" / (f"memory_unseen-{a.group}.json" if a.set == "v3" else f"memory_unseen-{a.set}-{a.group}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(table(rows))
    print()
    s = result["summary"]
    print(f"{'':24} {'cases':>5} {'scored':>6} {'pass':>4} {'KV 5%':>6} {'KV 2%':>6} {'fit':>5} {'DNF':>5}")
    for name, p in [("all", s["all"]), *s["by_engine"].items(), *s["by_family"].items()]:
        print(f"{name[:24]:24} {p['cases']:>5} {p['scored']:>6} {p['pass']:>4} "
              f"{p['within_5pct_or_0.5gib']:>3}/{p['kv_cases']:<2} {p['within_2pct']:>3}/{p['kv_cases']:<2} "
              f"{p['fit_verdict_right']:>2}/{p['scored']:<2} {p['does_not_fit_predicted']:>5}")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
