"""The capacity review's tables, from a plan's JSON form (what `capacity plan --json` prints and `capacity export`
reads back): the same (header, rows) feed the workbook, its CSV files, `plan --output md|csv` and the tests.
Units live in the headers; numbers stay numbers (ms, GiB, tokens/s, USD); yes/no are words."""
from __future__ import annotations

import json

GiB = 2**30
Table = tuple[list[str], list[list]]


def ms(x):
    """Seconds -> milliseconds; None for a value that is not a finite number (saturated, not measured)."""
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x * 1e3


def yn(b) -> str:
    return "yes" if b else "no"


def kstr(m: int) -> str:
    return f"{m // 1024}k" if m >= 1024 and m % 1024 == 0 else f"{m:,}"


def mean_output_tokens(plan: dict) -> float | None:
    """The plan's own class-weighted mean output length (plans saved before it was recorded: the base
    length distribution's mean)."""
    if plan.get("mean_output_tokens"):
        return plan["mean_output_tokens"]
    out = plan["scenario"]["workload"]["output_len"]
    return out.get("value") or mean_len(out)


def mean_len(spec: dict) -> float | None:
    if spec.get("kind") == "uniform":
        return (spec["low"] + spec["high"]) / 2
    if spec.get("kind") == "lognormal":
        return spec.get("mean")
    if spec.get("kind") == "empirical" and spec.get("values"):
        return sum(spec["values"]) / len(spec["values"])
    return spec.get("value")


def length_text(spec: dict | None) -> str:
    if not spec:
        return "the workload's"
    k = spec.get("kind")
    if k == "fixed":
        return f"{spec['value']:,}"
    if k == "uniform":
        return f"uniform {spec['low']:,}-{spec['high']:,}"
    if k == "lognormal":
        cap = f", {spec.get('low', 1):,}-{spec['high']:,}" if spec.get("high") else ""
        return f"lognormal mean {spec['mean']:,.0f} cv {spec['cv']}{cap}"
    return f"{len(spec.get('values') or [])} observed lengths, mean {mean_len(spec) or 0:,.0f}"


def scenario_line(plan: dict) -> str:
    """The question in one line: model, GPU, TP, workload in/out, rate, SLO."""
    wl, slo = plan["scenario"]["workload"], plan["slo"]
    p = slo["percentile"]
    mean_out, base = mean_output_tokens(plan), mean_len(wl["output_len"])
    classes = f" (mean {mean_out:,.0f} over {len(wl['classes'])} classes)" if mean_out and mean_out != base else ""
    return (f"{plan['model']} on {plan['gpu']} (TP {plan['tp']}), prompts {length_text(wl['input_len'])} / outputs "
            f"{length_text(wl['output_len'])}{classes} tokens, {plan['target_rate']:g} req/s, SLO P{p} TTFT <= "
            f"{slo['ttft_s'] * 1e3:,.0f} ms and P{p} TPOT <= {slo['tpot_s'] * 1e3:,.0f} ms")


def frontier(plan: dict) -> Table:
    """One row per simulated configuration (max_num_seqs): its latency does not depend on max_model_len (paged
    KV), which only decides what fits; the fitting range is one column."""
    pct = plan["slo"]["percentile"]
    rec = plan.get("recommended") or {}
    head = ["max_num_seqs", "max_model_len that fits", "covers the longest request from", f"P{pct} TTFT (ms)",
            f"P{pct} TTFT band (ms)", f"P{pct} TPOT (ms)", f"P{pct} TPOT band (ms)", "peak output tokens/s",
            "KV blocks", "preemptions", "meets SLO", "recommended", "status"]
    rows = []
    for s in sorted({c["max_num_seqs"] for c in plan["frontier"]}):
        cells = sorted((c for c in plan["frontier"] if c["max_num_seqs"] == s), key=lambda c: c["max_model_len"])
        fit = [c for c in cells if c["feasible"]]
        if not fit:
            rows.append([s, "none", "-", None, "", None, "", None, None, None, "no", "no",
                         "does not fit: " + (cells[0]["why"] if cells else "")])
            continue
        c = fit[-1]
        covers = next((x["max_model_len"] for x in fit if x["covers_workload"]), None)
        sat = c.get("saturated") or (c["p_ttft"] is None and c["feasible"])
        band = lambda b: f"{b[0] * 1e3:,.0f}-{b[1] * 1e3:,.0f}" if b else ""
        band1 = lambda b: f"{b[0] * 1e3:,.1f}-{b[1] * 1e3:,.1f}" if b else ""
        status = ("saturated at the per-replica load: the queue grows without bound" if sat
                  else "" if any(x["meets_slo"] for x in fit) else "misses the SLO at the per-replica load")
        rows.append([s, f"{kstr(fit[0]['max_model_len'])}-{kstr(fit[-1]['max_model_len'])}" if len(fit) > 1
                     else kstr(fit[0]["max_model_len"]), kstr(covers) if covers else "none",
                     None if sat else ms(c["p_ttft"]), band(c.get("p_ttft_band")), None if sat else ms(c["p_tpot"]),
                     band1(c.get("p_tpot_band")), c["capacity_tokens_per_s"], c.get("kv_blocks"), c.get("preemptions"),
                     yn(any(x["meets_slo"] for x in fit)), yn(rec.get("max_num_seqs") == s), status])
    return head, rows


def percentiles(plan: dict) -> Table:
    rows = []
    seen = set()
    for c in plan["frontier"]:
        if not c["feasible"] or not c["stats"] or c["max_num_seqs"] in seen:
            continue
        seen.add(c["max_num_seqs"])
        for metric in ("ttft", "tpot", "itl", "e2e"):
            st = c["stats"].get(metric, {})
            rows.append([c["max_num_seqs"], metric.upper(), *(ms(st.get(k)) for k in
                         ("mean", "p50", "p90", "p95", "p99", "p99_ci_low", "p99_ci_high"))])
    return (["max_num_seqs", "metric", "mean (ms)", "P50 (ms)", "P90 (ms)", "P95 (ms)", "P99 (ms)",
             "P99 95% CI low (ms)", "P99 95% CI high (ms)"], rows)


def memory(plan: dict) -> Table:
    """The usable memory split into its terms (the bar chart's data) and what lies outside the budget."""
    b = plan["budget"]
    graphs_in = b["cuda_graphs_in_budget"]
    rows = [["weights", b["weights_bytes"] / GiB, "exact, from the card's tensors"],
            ["activation peak (profiling pass)", b["activation_bytes"] / GiB,
             "estimate" if "activation" in b["estimates"] else "given"],
            ["non-torch memory", b["non_torch_bytes"] / GiB, "estimate" if "non_torch" in b["estimates"] else "given"],
            ["CUDA graphs inside the budget", b["cuda_graph_bytes"] / GiB if graphs_in else 0.0,
             ("estimate" if "cuda_graphs" in b["estimates"] else "given") + ("" if graphs_in else
             f": {b['cuda_graph_bytes'] / GiB:.2f} GiB captured after the KV cache, outside the budget (vLLM default)")],
            ["model-runner buffers", b.get("runner_buffers_bytes", 0.0) / GiB,
             "persistent buffers the release's profiler counts (vLLM 0.27+)"],
            ["KV cache", b["kv_budget_bytes"] / GiB, f"{b['num_blocks']:,} blocks x {b['block_size']} tokens "
             f"(planner: {b.get('planning_blocks', b['num_blocks']):,}, the {b.get('kv_estimate', 'middle')} end)"],
            ["usable = total x gpu_memory_utilization", b["usable_bytes"] / GiB,
             f"{b['total_bytes'] / GiB:.2f} GiB x {b['gpu_memory_utilization']}"],
            ["outside the budget: total - usable", (b["total_bytes"] - b["usable_bytes"]) / GiB,
             f"holds the CUDA context{'' if graphs_in else ' and CUDA graphs'} "
             f"({b['outside_budget_bytes'] / GiB:.2f} GiB, estimate)"]]
    return ["term", "GiB per rank", "basis"], rows


def context(plan: dict) -> Table | None:
    if not plan.get("context_frontier"):
        return None
    pct = plan["slo"]["percentile"]
    return (["context (tokens)", "max_num_seqs", "fits memory", f"P{pct} TTFT (ms)", f"P{pct} TPOT (ms)",
             "P99 queue wait (ms)", "preemptions", "peak output tokens/s", "requests the KV cache holds",
             "KV-limited", "meets SLO", "status"],
            [[c["context"], c["max_num_seqs"], yn(c["feasible"]), ms(c["p_ttft"]), ms(c["p_tpot"]),
              ms(c["queue_wait_p99"]), c["preemptions"], c["capacity_tokens_per_s"], c["kv_concurrency"],
              yn(c["kv_concurrency"] is not None and c["kv_concurrency"] < c["max_num_seqs"]), yn(c["meets_slo"]),
              c["why"] or (f"saturated at {plan.get('headroom', 0.8):.0%} of its peak" if c["saturated"] else "")]
             for c in plan["context_frontier"]])


def memory_table(plan: dict) -> Table:
    return (["batch", "context (tokens)", "KV needed (GiB)", "share of KV budget", "fits", "why"],
            [[r["batch"], r["context"], r["kv_bytes"] / GiB, r["kv_fraction"], yn(r["fits"]), r["reason"]]
             for r in plan.get("memory_table", [])])


def short(v):
    """A float as a person writes it (6 significant digits: 79.16, not 79.160000000149); others as they are."""
    return float(f"{v:.6g}") if isinstance(v, float) else v


def assumptions(plan: dict) -> Table:
    """Everything the answer assumed, every engine default spelled out (the resolved value, not `None`), the
    request classes as rows, and where the step costs came from."""
    sc, b, rec = plan["scenario"], plan["budget"], plan.get("recommended") or {}
    eng = dict(sc.get("engine") or {})
    resolved = {"tensor_parallel_size": plan["tp"], "max_num_seqs": b["max_num_seqs"],
                "max_model_len": b["max_model_len"], "max_num_batched_tokens": b["max_num_batched_tokens"],
                "block_size": b["block_size"], "kv_cache_dtype": f"{eng.get('kv_cache_dtype', 'auto')} ({b['kv_dtype']})"}
    rows: list[list] = [["model", plan["model"], "card"], ["GPU", plan["gpu"], "catalogue"],
                        ["usable memory the engine sees (GiB)", round(b["total_bytes"] / GiB, 2), "catalogue"]]
    for k, v in eng.items():
        if k in ("memory_params",):
            continue
        if k in resolved:
            basis = "recommended" if k in ("max_num_seqs", "max_model_len") and rec else (
                "engine default" if v is None else "scenario")
            rows.append([f"engine.{k}", resolved[k], basis])
        elif v is not None:
            rows.append([f"engine.{k}", short(v) if not isinstance(v, bool) else yn(v), "scenario or default"])
    for k, v in (eng.get("memory_params") or {}).items():  # bytes as GiB: 0.5, not 536870912
        if k.endswith("_bytes") and isinstance(v, (int, float)) and not isinstance(v, bool):
            rows.append([f"engine.memory_params.{k[:-6]}_gib", round(v / GiB, 3), "estimate parameter"])
        else:
            rows.append([f"engine.memory_params.{k}", short(v), "estimate parameter"])
    wl = sc["workload"]
    arr = wl["arrivals"]
    rows += [["arrivals", arr["kind"] + (f" (cv {arr['cv']})" if arr["kind"] == "gamma" else ""), "scenario"],
             ["target rate, whole service (req/s)", plan["target_rate"], "scenario"],
             ["rate simulated per replica (req/s)", short(plan["per_replica_rate"]), "target / replicas, frontier"],
             ["headroom (share of the max rate a replica runs at)", plan.get("headroom", 1.0), "scenario"],
             ["prompt tokens", length_text(wl["input_len"]), "workload"],
             ["output tokens", length_text(wl["output_len"]), "workload"],
             ["mean output tokens per request", mean_output_tokens(plan), "class-weighted"]]
    for c in wl["classes"]:
        slo = ", ".join(x for x in (f"TTFT <= {c['slo_ttft_s'] * 1e3:,.0f} ms" if c.get("slo_ttft_s") else "",
                                    f"TPOT <= {c['slo_tpot_s'] * 1e3:,.0f} ms" if c.get("slo_tpot_s") else "") if x)
        rows.append([f"class {c['name']}", f"weight {c['weight']:g}, priority {c['priority']}, prompts "
                     f"{length_text(c.get('input_len') or wl['input_len'])}, outputs "
                     f"{length_text(c.get('output_len') or wl['output_len'])}, SLO {slo or 'the scenario SLO'}",
                     "workload class"])
    slo = plan["slo"]
    rows += [["SLO", f"P{slo['percentile']} TTFT <= {slo['ttft_s'] * 1e3:,.0f} ms, P{slo['percentile']} TPOT <= "
                     f"{slo['tpot_s'] * 1e3:,.0f} ms", "scenario"],
             ["step-cost source", plan["source"], "cost factory"],
             ["search", ", ".join(f"{k} {v}" for k, v in sc["search"].items()), "scenario"],
             ["verification seeds", json.dumps(plan["verification"]["seeds"]), "fresh, unlike the search's"],
             ["tool version", plan["tool_version"], ""]]
    for k, v in sorted((plan.get("provenance") or {}).items()):
        if v not in (None, "", [], {}):
            rows.append([f"calibration.{k}", v if isinstance(v, (int, float, str)) else json.dumps(v), "profile"])
    return ["field", "value", "basis"], rows


def sweep(rows: list[dict]) -> Table:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return keys, [[cell_value(r.get(k)) for k in keys] for r in rows]


def cell_value(v):
    if isinstance(v, dict):
        return v.get("value", json.dumps(v))
    if isinstance(v, (list, tuple)):
        return json.dumps(v)
    return v


def tables(plan: dict | None, sweep_rows: list[dict] | None = None) -> dict[str, Table]:
    """Every table of the review, by sheet/CSV name."""
    out: dict[str, Table] = {}
    if plan:
        out["Assumptions"] = assumptions(plan)
        out["Memory"] = memory(plan)
        out["Frontier"] = frontier(plan)
        ctx = context(plan)
        if ctx:
            out["Context"] = ctx
        out["Percentiles"] = percentiles(plan)
        out["Memory table"] = memory_table(plan)
    if sweep_rows:
        out["Sweep"] = sweep(sweep_rows)
    return out
