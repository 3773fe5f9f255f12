"""Disaggregated prefill/decode in the simulator: hand-traced timelines of a request through the prefill pool,
the KV transfer and the decode pool; contention on a shared link; the fast path exact with deliveries that
arrive during decode stretches."""
import numpy as np
import pytest

from capacity.cost.step import LinearCost
from capacity.errors import CapacityError
from capacity.sched import make_scheduler
from capacity.sim.simulator import Disaggregation, SimConfig, simulate
from capacity.workload import Arrivals, Lengths, Request, WorkloadSpec

# prefill step: 10 ms + 1 ms per token; decode step: 20 ms + 1 ms per token (no attention term)
PRE = LinearCost(fixed_s=0.010, per_token_s=0.001, source="prefill")
DEC = LinearCost(fixed_s=0.020, per_token_s=0.001, source="decode")
SCHED = dict(max_num_seqs=16, max_num_batched_tokens=4096, block_size=16, num_blocks=10_000)


def sched():
    return make_scheduler("continuous", **SCHED)


def disagg(p=1, d=1, mode="per_prefill", bw=1e6, lat=0.005):
    # 1,000 bytes of KV per token over a 1 MB/s link: 100 tokens take 0.1 s (+ 5 ms latency)
    return Disaggregation(p, d, DEC, sched, kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=bw, latency_s=lat,
                          link_mode=mode)


def run(reqs, dg, fast=True):
    return simulate(reqs, PRE, sched, np.random.default_rng(0), SimConfig(disagg=dg, fast_forward=fast))


def test_one_request_through_prefill_transfer_and_decode():
    """Prompt 100, output 4, arriving at t=0:
    prefill 0 -> 0.010 + 0.100 = 0.110 (its first token is the prefill pool's, not the client's);
    transfer 0.110 -> + 0.005 + 100 x 1000 / 1e6 = 0.215;
    decode: the last prompt token (1 token, 0.021 s) emits the first output token at 0.236, then 3 decode steps
    of 0.021 s: the last token at 0.299."""
    res = run([Request(0, 0.0, 100, 4)], disagg())
    r = res.records
    assert r.first_scheduled[0] == pytest.approx(0.0)
    assert r.first_token[0] == pytest.approx(0.236)
    assert r.finish[0] == pytest.approx(0.299)
    assert r.replica[0] == 1  # the decode replica (after the one prefill replica)
    # ITL as the client sees it: three gaps of one decode step each
    assert res.itl_weights.sum() == 3 and res.itl_values == pytest.approx([0.021] * len(res.itl_values))


def test_async_scheduling_takes_a_handoff_and_its_kv_a_step_late():
    """One prefill and one decode replica, both scheduling asynchronously (`capacity.sim.lag`): A (prompt 100,
    10 tokens) at t=0, B (prompt 50, 2 tokens) at 0.2. A as in the trace above: first token 0.236, then decode
    steps of 0.021 s. B: prefill 0.2 -> 0.26, handed to the decode replica at 0.26, during its step 0.257 ->
    0.278.
    - Synchronous: the call at 0.278 admits B and its KV read starts, 0.278 -> 0.333 (5 ms + 50 ms). The call at
      0.341 sees it loaded: one step of A and B's last prompt token (0.022 s), B's first token at 0.363, its
      second at 0.385.
    - Async: the call at 0.278 stands for the engine's at 0.257, before B came: the call at 0.299 admits it, and the
      read runs 0.299 -> 0.354. vLLM learns a read is done from a step's output (`finished_recving`), so the call
      at 0.362 (the engine's at 0.341) does not see it and the one at 0.383 does: B's first token at 0.405, two
      steps later, its second at 0.427. A finishes at 0.427 either way."""
    out = {}
    for a in (False, True):
        def sc(a=a):
            return make_scheduler("continuous", **{**SCHED, "async_scheduling": a})
        dg = Disaggregation(1, 1, DEC, sc, kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=1e6, latency_s=0.005)
        for fast in (True, False):
            r = simulate([Request(0, 0.0, 100, 10), Request(1, 0.2, 50, 2)], PRE, sc, np.random.default_rng(0),
                         SimConfig(disagg=dg, fast_forward=fast)).records
            out[a, fast] = (list(r.first_token), list(r.finish))
    for fast in (True, False):
        assert out[False, fast][0] == pytest.approx([0.236, 0.363]) and out[False, fast][1] == pytest.approx([0.427, 0.385])
        assert out[True, fast][0] == pytest.approx([0.236, 0.405]) and out[True, fast][1] == pytest.approx([0.427, 0.427])


@pytest.mark.parametrize("mode, p, first_tokens", [
    # one prefill replica and its link: both prompts in one prefill step (0 -> 0.21), transfers 0.21 -> 0.315 and
    # 0.315 -> 0.42; the first decodes 0.315 -> 0.336 (its first token) ... 0.399, the second 0.42 -> 0.441
    ("per_prefill", 1, [0.336, 0.441]),
    # two prefill replicas, a link each: both prefills 0 -> 0.11, both transfers end at 0.215, one decode step
    # of two 1-token chunks (0.020 + 0.002) gives both first tokens at 0.237
    ("per_prefill", 2, [0.237, 0.237]),
    # two replicas, one shared link: 0.11 -> 0.215, then the second 0.215 -> 0.32; the first decodes 0.215 ->
    # 0.236 ... 0.299, the second 0.32 -> 0.341
    ("shared", 2, [0.236, 0.341]),
])
def test_transfers_queue_for_a_shared_link(mode, p, first_tokens):
    reqs = [Request(0, 0.0, 100, 4), Request(1, 0.0, 100, 4)]
    res = run(reqs, disagg(p=p, mode=mode))
    r = res.records
    assert sorted(r.first_token) == pytest.approx(first_tokens)
    assert np.isfinite(r.finish).all()


@pytest.mark.parametrize("blocks, async_scheduling", [(10_000, False), (120, False), (120, True)])
def test_fast_path_is_exact_with_deliveries_during_decode_stretches(blocks, async_scheduling):
    """Costs and link off the round-number lattice of the hand-traced cases: with whole-millisecond steps and
    transfers, a delivery and a step end can fall on the same instant, where the two modes' float sums (a
    cumulative sum against step-by-step additions) may order them differently. Also with small pools (prompts
    wait for decode blocks before their KV is read, prefill blocks held until read) and async scheduling."""
    pre = LinearCost(fixed_s=0.0101234, per_token_s=0.00097531, source="prefill")
    dec = LinearCost(fixed_s=0.0203457, per_token_s=0.00101117, source="decode")

    def sched():
        return make_scheduler("continuous", **{**SCHED, "num_blocks": blocks, "async_scheduling": async_scheduling})

    dg = Disaggregation(2, 2, dec, sched, kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=4.87e6,
                        latency_s=0.0051357)
    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=6.0),
                        input_len=Lengths(kind="uniform", low=32, high=400),
                        output_len=Lengths(kind="uniform", low=8, high=120), num_requests=400)
    runs = []
    for fast in (True, False):
        runs.append(simulate(spec, pre, sched, np.random.default_rng(3), SimConfig(disagg=dg, fast_forward=fast)))
    fast, slow = runs
    # with async scheduling a delivery held for the schedule call after next keeps the next step a single one
    # (0.52-0.53 of the step-by-step run's events here, 0.41-0.42 without)
    assert fast.events < slow.events * (0.6 if async_scheduling else 0.5) and fast.steps == slow.steps
    for attr in ("arrival", "first_scheduled", "first_token", "finish"):
        np.testing.assert_allclose(getattr(fast.records, attr), getattr(slow.records, attr), rtol=1e-9, atol=1e-12)
    assert fast.itl_weights.sum() == slow.itl_weights.sum()


def test_bad_disaggregation_settings():
    for kw in (dict(p=0), dict(bw=0.0), dict(lat=-1.0), dict(mode="ring")):
        with pytest.raises(CapacityError):
            disagg(**kw)
    with pytest.raises(CapacityError, match="static"):
        simulate([Request(0, 0.0, 10, 2)], PRE, sched, np.random.default_rng(0),
                 SimConfig(disagg=Disaggregation(1, 1, DEC, lambda: make_scheduler("static", max_batch=2),
                                                 1000.0, 1e6)))


def test_simulate_cli_disaggregated_through_the_pipeline():
    """`simulate --disagg 1:2`: the prefill pool's and the decode pool's budgets and costs from the one run path,
    the transfer time from the KV bytes and the link (4,096 tokens x 128 KiB of Llama-3.1-8B KV = 512 MiB over
    50 GB/s of ib-400 at TP 1: 10.7 ms + 20 us), GPUs counted over both pools, Little's law intact."""
    import json

    from tests.conftest import run_cli

    r = run_cli("simulate", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--rate", "4", "-n", "300",
                "--input-len", "4096", "--output-len", "64", "--disagg", "1:2", "--decode-tp", "2", "--link", "ib-400",
                "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d = out["disaggregated"]
    assert d["gpus"] == 1 * 1 + 2 * 2 and d["transfers"] == 300
    assert d["transfer_s"]["mean"] == pytest.approx(4096 * 131072 / 50e9 + 20e-6, rel=1e-9)
    assert out["littles_law"]["L"] == pytest.approx(out["littles_law"]["lambda_W"], rel=1e-6)
    # each pool's KV: whole prompts of 4,096 tokens = 256 blocks each on a prefill replica (held until read);
    # a decode replica at TP 2 holds half the weights per GPU, so more blocks than the prefill's at TP 1
    kv = d["kv"]
    assert kv["prefill"]["blocks_per_replica"] == out["kv_blocks_per_replica"]
    assert kv["prefill"]["peak_used"] >= 256 and kv["prefill"]["peak_used"] % 256 == 0
    assert kv["decode"]["blocks_per_replica"] > kv["prefill"]["blocks_per_replica"]
    assert kv["decode"]["peak_used"] >= 257  # a prompt's blocks and its first output token
    hints = d["launch_hints"].splitlines()
    assert sum("NixlConnector" in h for h in hints) == 3  # one per instance: 1 prefill + 2 decode
    assert sum("--tensor-parallel-size 2" in h for h in hints) == 2
    assert "--decoder-ports 8200 8201" in hints[3] and hints[-1].startswith("# not generated")
    for bad, msg in ((["--disagg", "2"], "P:D"), (["--disagg", "0:2"], "at least one"),
                     (["--disagg", "1:1", "--link", "carrier-pigeon"], "link")):
        r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "10", *bad)
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---- several models on shared GPUs (capacity.sim.simulator.Service) ----------------------------------------
def test_two_models_on_one_gpu_take_turns_step_by_step():
    """Model A (prompt 10, 2 outputs) and model B (prompt 20, 2 outputs), both at t=0, steps of 10 ms + 1 ms per
    token. On one shared GPU: A's prefill 0 -> 0.020, B's prefill waits for it, 0.020 -> 0.050, A's decode
    waits for that, 0.050 -> 0.061, B's decode 0.061 -> 0.072. On a GPU each: A 0.020 and 0.031, B 0.030 and
    0.041."""
    from capacity.sim.simulator import Service

    cost = LinearCost(fixed_s=0.010, per_token_s=0.001, source="t")
    reqs = [Request(0, 0.0, 10, 2, service=0), Request(1, 0.0, 20, 2, service=1)]
    for devices, want in (((0,), {0: (0.020, 0.061), 1: (0.050, 0.072)}),
                          ((None,), {0: (0.020, 0.031), 1: (0.030, 0.041)})):
        svc = tuple(Service(n, cost, sched, 1, devices) for n in ("a", "b"))
        res = simulate(list(reqs), cost, sched, np.random.default_rng(0), SimConfig(services=svc))
        r = res.records
        for rid in range(len(r)):
            ft, fin = want[int(r.replica[rid])]
            assert r.first_token[rid] == pytest.approx(ft) and r.finish[rid] == pytest.approx(fin)


def test_a_model_on_a_shared_gpu_plans_its_step_when_it_asks_for_the_gpu():
    """An engine on a shared GPU schedules a step when it asks for the GPU (its CPU launches the step, the
    kernels wait their turn), so a request that comes while it waits is not in that step; with async scheduling
    a request that comes during a step waits for the schedule call after next. Steps of 10 ms + 1 ms per token.
    A0 (10 in, 3 out) and B0 (20 in, 2 out) at t=0; A1 (10 in, 2 out) at 0.030, while A waits for the GPU.
    Both: A prefills A0 0 -> 0.020; B's prefill (planned at 0) 0.020 -> 0.050; A's decode of A0, planned at
    0.020, 0.050 -> 0.061; B's decode (planned at 0.050) 0.061 -> 0.072, B0 done.
    Synchronous: A plans at 0.061 with A1 in: A0's last token and A1's prompt, 11 tokens, 0.072 -> 0.093;
    A1's decode 0.093 -> 0.104. (Planned when the GPU is free, A1 would have been in the 0.050 step: 0.071.)
    Async: A1 came after A's call at 0.020, so A's call at 0.061 leaves it out: A0's last token 0.072 ->
    0.083; the call at 0.083 takes it: prefill 0.083 -> 0.103, decode -> 0.114."""
    from capacity.sim.simulator import Service

    cost = LinearCost(fixed_s=0.010, per_token_s=0.001, source="t")
    reqs = [Request(0, 0.0, 10, 3, service=0), Request(1, 0.0, 20, 2, service=1), Request(2, 0.030, 10, 2, service=0)]
    want = {False: ([0.020, 0.050, 0.093], [0.093, 0.072, 0.104]),
            True: ([0.020, 0.050, 0.103], [0.083, 0.072, 0.114])}
    for a, (first, finish) in want.items():
        def sc(a=a):
            return make_scheduler("continuous", **{**SCHED, "async_scheduling": a})
        svc = tuple(Service(n, cost, sc, 1, (0,)) for n in ("a", "b"))
        r = simulate(list(reqs), cost, sc, np.random.default_rng(0), SimConfig(services=svc)).records
        np.testing.assert_allclose(r.first_token, first, atol=1e-12, err_msg=f"async={a}")  # arrival order
        np.testing.assert_allclose(r.finish, finish, atol=1e-12, err_msg=f"async={a}")


def test_two_models_swap_on_one_gpu_by_hand():
    """Swap mode (vLLM sleep mode): one model resident at a time; it keeps the GPU until nothing is in flight.
    Steps of 10 ms + 1 ms per token; A wakes in 0.1 s and sleeps in 0.05 s, B 0.2 s and 0.08 s.
    t=0: A (10 in, 2 out) and B (20 in, 2 out) arrive; A asks first: wake 0 -> 0.1, prefill -> 0.120, decode ->
    0.131, idle. B: A sleeps and B wakes, 0.131 -> 0.381, prefill 20 -> 0.411, decode -> 0.422. An A request at
    0.2 waited for all of that: B sleeps, A wakes 0.422 -> 0.602, -> 0.622, -> 0.633. A B request at 0.7: A
    sleeps, B wakes, 0.7 -> 0.95, -> 0.98, -> 0.991. A B request at 1.5 finds B resident: 1.53, 1.541."""
    from capacity.sim.simulator import Service

    cost = LinearCost(fixed_s=0.010, per_token_s=0.001, source="t")
    reqs = [Request(0, 0.0, 10, 2, service=0), Request(1, 0.0, 20, 2, service=1), Request(2, 0.2, 10, 2, service=0),
            Request(3, 0.7, 20, 2, service=1), Request(4, 1.5, 20, 2, service=1)]
    svc = (Service("a", cost, sched, 1, (0,), swap_s=0.1, sleep_s=0.05),
           Service("b", cost, sched, 1, (0,), swap_s=0.2, sleep_s=0.08))
    res = simulate(reqs, cost, sched, np.random.default_rng(0), SimConfig(services=svc, device_sharing="swap"))
    r = res.records
    np.testing.assert_allclose(r.first_token, [0.120, 0.411, 0.622, 0.98, 1.53], atol=1e-12)
    np.testing.assert_allclose(r.finish, [0.131, 0.422, 0.633, 0.991, 1.541], atol=1e-12)
    assert [(round(t, 9), a, b) for t, a, b in res.swaps] == [(0.0, -1, 0), (0.131, 0, 1), (0.422, 1, 0), (0.7, 0, 1)]


def test_a_resident_model_takes_its_input_a_step_late_with_async_scheduling():
    """Swap mode, one model: it keeps the device while it has work, so its steps are back to back and async
    scheduling's input lag applies as on a GPU of its own. Steps of 10 ms + 1 ms per token, wake-up 0.1 s.
    A0 (10 in, 3 out) at t=0: wake 0 -> 0.1, prefill 0.1 -> 0.120. A1 (10 in, 2 out) comes at 0.110, during it.
    Synchronous: A0's decode with A1's prompt, 11 tokens, 0.120 -> 0.141; both decode 0.141 -> 0.153.
    Async: the call at 0.120 sees only what came before 0.1: A0 alone 0.120 -> 0.131; the call at 0.131 takes
    A1: A0's last token with A1's prompt 0.131 -> 0.152; A1's decode 0.152 -> 0.163."""
    from capacity.sim.simulator import Service

    cost = LinearCost(fixed_s=0.010, per_token_s=0.001, source="t")
    reqs = [Request(0, 0.0, 10, 3, service=0), Request(1, 0.110, 10, 2, service=0)]
    want = {False: ([0.120, 0.141], [0.153, 0.153]), True: ([0.120, 0.152], [0.152, 0.163])}
    for a, (first, finish) in want.items():
        def sc(a=a):
            return make_scheduler("continuous", **{**SCHED, "async_scheduling": a})
        svc = (Service("a", cost, sc, 1, (0,), swap_s=0.1),)
        r = simulate(list(reqs), cost, sc, np.random.default_rng(0), SimConfig(services=svc, device_sharing="swap")).records
        np.testing.assert_allclose(r.first_token, first, atol=1e-12, err_msg=f"async={a}")
        np.testing.assert_allclose(r.finish, finish, atol=1e-12, err_msg=f"async={a}")


def test_colocate_cli_compares_separate_and_shared_gpus(tmp_path):
    """`capacity colocate`: the shared layout uses fewer GPUs, gives each engine its share of memory (fewer KV
    blocks) and slows every model's decode steps (they take turns on the GPU); bad fleets are one-line errors."""
    import json

    from tests.conftest import run_cli

    wl = ("{arrivals: {kind: poisson, rate_per_s: %g}, input_len: {kind: fixed, value: 512}, "
          "output_len: {kind: fixed, value: 64}, num_requests: 200}")
    f = tmp_path / "fleet.yaml"
    f.write_text("gpu: h100-sxm\ngpus: 1\nmodels:\n"
                 f"  - {{model: llama-3.1-8b, engine: {{max_model_len: 4096}}, slo_tpot_s: 0.05, workload: {wl % 8}}}\n"
                 f"  - {{model: mistral-7b, engine: {{max_model_len: 4096}}, slo_tpot_s: 0.05, workload: {wl % 6}}}\n")
    r = run_cli("colocate", "--fleet", str(f), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    sep, sh, sw = out["separate"], out["shared"], out["swapped"]
    assert (sep["gpus"], sh["gpus"], sw["gpus"]) == (2, 1, 1)
    # docs/fleet.md's claim: two 8B-class models at 8 and 6 req/s of short chat share one H100 at a 50 ms TPOT SLO
    assert sh["meets_slo"] and all(m["p99_tpot_s"] < 0.05 for m in sh["models"])
    # swapped: each model has the whole GPU's KV when resident; 16 GB / 25 GB/s = 0.64 s a wake-up; steady
    # traffic to both keeps swapping: a model waits for the other to drain, then for the swap
    assert sw["swap_s"][0] == pytest.approx(16.06e9 / 25e9, rel=0.01) and sw["swaps"] >= 2
    for a, b in zip(sep["models"], sw["models"]):
        assert b["kv_blocks"] == a["kv_blocks"] and b["p99_ttft_s"] > a["p99_ttft_s"] + 0.6
    for a, b in zip(sep["models"], sh["models"]):
        assert b["gpu_memory_utilization"] == pytest.approx(0.45) and b["kv_blocks"] < a["kv_blocks"]
        assert b["p50_tpot_s"] > 1.3 * a["p50_tpot_s"]  # the other model's steps in between
        assert a["requests"] == b["requests"]
    f.write_text("gpu: h100-sxm\nmodels:\n  - {model: llama-3.1-8b, share: 0.6, workload: {arrivals: {kind: poisson, "
                 "rate_per_s: 1}}}\n  - {model: mistral-7b, share: 0.6, workload: {arrivals: {kind: poisson, "
                 "rate_per_s: 1}}}\n")
    r = run_cli("colocate", "--fleet", str(f))
    assert r.returncode == 1 and "share" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_layouts_of_a_unit_by_hand():
    from capacity.plan.disagg import Layout, layouts

    assert [x.name for x in layouts(2, (1, 2))] == ["2xTP1", "1xTP2", "P 1xTP1 + D 1xTP1"]
    four = layouts(4, (1, 2, 4))
    assert len(four) == 9 and all(x.gpus == 4 for x in four)  # 3 aggregated + 6 prefill/decode splits
    assert Layout(2, 1, 1, 2).name == "P 2xTP1 + D 1xTP2" and not Layout(2, 1, 1, 2).aggregated


def test_verdict_names_the_binding_slo():
    from capacity.plan.disagg import verdict

    agg = {"layout": "2xTP2", "max_rate": 5.0, "p99_ttft_s": 0.5, "p99_tpot_s": 0.034, "total_gpus": 8}
    dis = {"layout": "P 2xTP2 + D 2xTP2", "max_rate": 6.5, "p99_ttft_s": 1.9, "p99_tpot_s": 0.024, "total_gpus": 8}
    v = verdict(agg, dis, (2.0, 0.035), by_gpus=False)
    assert v.startswith("disaggregated wins (P 2xTP2 + D 2xTP2: 1.30x")
    assert "aggregated layout is bound by TPOT (34.0 of 35 ms)" in v and "by TTFT (1900 of 2000 ms)" in v
    assert verdict(agg, None, (2.0, 0.035), True) == "only aggregated layouts meet the SLO"


def test_disagg_cli_compares_layouts_for_a_target_rate():
    import json
    import math

    from tests.conftest import run_cli

    r = run_cli("disagg", "-m", "llama-3.1-8b", "--gpus", "2", "--input-len", "2048", "--output-len", "64",
                "--slo-tpot-ms", "20", "--target-rate", "10", "--price-per-gpu-hour", "2", "--requests", "200",
                "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["layout"] for x in out["rows"]] == ["2xTP1", "1xTP2", "P 1xTP1 + D 1xTP1"]
    for x in out["rows"]:
        if x["max_rate"]:
            assert x["total_gpus"] == 2 * math.ceil(10 / x["max_rate"] - 1e-9)  # units of 2 GPUs for 10 req/s
            assert x["cost_per_1m_output_tokens"] == pytest.approx(x["total_gpus"] * 2 / (10 * 64 * 3600) * 1e6)
    assert out["verdict"] and not out["tuned"]
    r = run_cli("disagg", "-m", "llama-3.1-8b", "--gpus", "100")
    assert r.returncode == 1 and "gpus" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("disagg", "-m", "llama-3.1-8b", "--slo-tpot-ms", "-5")
    assert r.returncode == 1 and "--slo-tpot-ms" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_tuning_each_role_raises_a_batch_cap_that_binds():
    """Both layouts of two H100s start from a batch cap of 4 (the decode pool's through the decode settings).
    A 32-token output at ~8 ms a step holds a sequence ~0.3 s, so 4 slots hold a replica near 15 req/s, far
    below what the GPU can do: the search must raise each winner's cap (the aggregated engine's, the decode
    pool's), sustain more than the 6% it probes above, and leave the settings it was not given alone."""
    from capacity.cli.common import load_card
    from capacity.engine.config import EngineConfig
    from capacity.model.gpus import get_gpu
    from capacity.plan.disagg import SEQS, compare

    card = load_card("llama-3.1-8b")
    spec = WorkloadSpec(input_len=Lengths(kind="fixed", value=512), output_len=Lengths(kind="fixed", value=32),
                        num_requests=100)
    out = compare(card, get_gpu("h100-sxm"), EngineConfig(max_model_len=4096, max_num_seqs=4), spec, (0.5, 0.05),
                  gpus=2, decode_over={"max_num_seqs": 4}, tune_roles=True)
    agg, dis = out["best_aggregated"], out["best_disaggregated"]
    assert out["tuned"] and agg["aggregated"] and not dis["aggregated"]
    assert agg["settings"]["engine"]["max_num_seqs"] in SEQS and dis["settings"]["decode"]["max_num_seqs"] in SEQS
    assert "max_num_seqs" not in dis["settings"]["prefill"]  # the prefill pool's cap is not searched
    for r in (agg, dis):
        assert r["max_rate"] > 1.06 * r["max_rate_as_given"] > 0
        first = r["tried"][0]
        assert (first["setting"], first["value"]) == ("max_num_seqs", 64) and first["max_rate"] is not None
        # a value kept sustains the rate reported; the rates of the values kept rise
        kept = [t["max_rate"] for t in r["tried"] if t["max_rate"] is not None]
        assert kept == sorted(kept) and kept[-1] == r["max_rate"]
    # the verdict compares the tuned pair
    assert f"{max(agg['max_rate'], dis['max_rate']) / min(agg['max_rate'], dis['max_rate']):.2f}x" in out["verdict"]


@pytest.mark.slow  # three CLI runs: in CI (`pytest -m slow`); the search itself is checked by the test above
def test_disagg_cli_tune_prints_simulate_lines_that_run():
    """--tune prints the two winners as tuned and a `capacity simulate` line for each, which must run as
    printed (the user's --decode-set merged with the tuned decode settings, on the disaggregated line only)."""
    import shlex

    from tests.conftest import run_cli

    r = run_cli("disagg", "-m", "llama-3.1-8b", "--gpus", "2", "--input-len", "2048", "--output-len", "64",
                "--slo-tpot-ms", "20", "--requests", "100", "--decode-set", "max_num_seqs=8", "--tune", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Each role's settings searched" in r.stdout
    lines = [x for x in r.stdout.splitlines() if x.startswith("capacity simulate")]
    assert len(lines) == 2 and "--disagg 1:1" in lines[1] and "--replicas" in lines[0]
    assert "--decode-set" not in lines[0] and lines[1].count("--decode-set max_num_seqs=") == 1
    for line in lines:
        sim = run_cli(*shlex.split(line)[1:], "-n", "100", timeout=120)
        assert sim.returncode == 0, (line, sim.stderr)


# ---- autoscaling either pool ------------------------------------------------------------------------------------
def _curve_spec(rate, n, out=16):
    from capacity.curves import RateCurve

    return WorkloadSpec(arrivals=Arrivals(kind="curve", curve=RateCurve(points=[(0, rate)])),
                        input_len=Lengths(kind="fixed", value=64), output_len=Lengths(kind="fixed", value=out),
                        num_requests=n)


def _run_pools(spec, pre_asc=None, dec_asc=None, p=1, d=1, seed=0):
    dg = Disaggregation(p, d, DEC, sched, kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=1e9, latency_s=0.001,
                        decode_autoscale=dec_asc)
    return simulate(spec, PRE, sched, np.random.default_rng(seed), SimConfig(disagg=dg, autoscale=pre_asc))


def test_autoscaled_pools_held_at_a_fixed_size_change_nothing():
    """min = max: each controller runs but never changes its pool, so every request's times are those of the
    static 2:3 deployment with the same seed (the controllers only read the pools)."""
    from capacity.sim.autoscale import AutoscaleConfig

    spec = WorkloadSpec(arrivals=Arrivals(kind="poisson", rate_per_s=12.0), input_len=Lengths(kind="fixed", value=64),
                        output_len=Lengths(kind="lognormal", mean=24, cv=0.5, low=2, high=80), num_requests=600)
    static = _run_pools(spec, p=2, d=3)
    fixed2 = AutoscaleConfig(min_replicas=2, max_replicas=2, interval_s=1.0)
    fixed3 = AutoscaleConfig(min_replicas=3, max_replicas=3, interval_s=1.0)
    auto = _run_pools(spec, fixed2, fixed3)
    for f in ("arrival", "first_token", "finish", "replica"):
        assert np.array_equal(getattr(static.records, f), getattr(auto.records, f)), f
    assert set(auto.autoscale.ready) == {2} and set(auto.autoscale_decode.ready) == {3}
    assert static.autoscale is None and static.autoscale_decode is None


def test_each_pool_scales_to_its_own_predictive_count():
    """A constant 6 req/s, read ahead by each pool's predictive controller: the prefill pool wants
    ceil(6 / 2.5) = 3 replicas, the decode pool ceil(6 / 1.5) = 4. Both decide at the first tick (t = 10 s) and
    their replicas are ready 20 s later, at t = 30 s; the decode replicas sit after the prefill pool's 3 most."""
    from capacity.curves import RateCurve
    from capacity.sim.autoscale import AutoscaleConfig

    curve = RateCurve(points=[(0, 6.0)])
    kw = dict(min_replicas=1, policy="predictive", interval_s=10, startup_s=20, cooldown_s=1e9, curve=curve)
    pre = AutoscaleConfig(max_replicas=3, per_replica_rate=2.5, **kw)
    dec = AutoscaleConfig(max_replicas=6, per_replica_rate=1.5, **kw)
    res = _run_pools(_curve_spec(6.0, 600), pre, dec)
    for tl, want in ((res.autoscale.arrays(), 3), (res.autoscale_decode.arrays(), 4)):
        assert tl["ready"][0] == 1 and tl["ready"].max() == want
        assert tl["t"][np.argmax(tl["ready"] == want)] == pytest.approx(30.0)
        assert tl["desired"][1] == want and tl["t"][1] == pytest.approx(10.0)
    assert np.isfinite(res.records.finish).all()
    assert set(np.unique(res.records.replica)) <= set(range(3, 3 + 6))  # each request's decode replica


def test_each_pool_scales_on_what_it_holds():
    """Long outputs and short prompts: at 5 req/s a request spends ~0.08 s in the prefill pool (0.4 in flight
    by Little's law) and ~2 s in the decode pool (63 steps of 20 ms + 1 ms per sequence: ~10 in flight), so
    with the same concurrency target of 3 the decode pool grows and the prefill pool stays at its minimum
    (each controller reads the requests its own replicas hold, not the whole system's)."""
    from capacity.sim.autoscale import AutoscaleConfig

    kw = dict(min_replicas=1, max_replicas=8, policy="concurrency", target=3, interval_s=2, startup_s=5,
              cooldown_s=1e9, window_s=10)
    res = _run_pools(_curve_spec(5.0, 1000, out=64), AutoscaleConfig(**kw), AutoscaleConfig(**kw))
    assert res.autoscale.arrays()["ready"].max() == 1
    assert res.autoscale_decode.arrays()["ready"].max() >= 3
    assert np.isfinite(res.records.finish).all()


# ---- the NIXL connector's order of events (vLLM 0.32, nixl/pull_scheduler.py) ------------------------------------
def _sched_blocks(n):
    return lambda: make_scheduler("continuous", **{**SCHED, "num_blocks": n})


def test_a_prefill_replica_holds_the_kv_until_the_decode_replica_has_read_it():
    """The prefill replica keeps a finished prompt's blocks until its KV is read (request_finished delays the
    free). Prefill pool of 8 blocks of 16, prompts of 100 tokens (7 blocks), outputs of 4:
    A (t=0): prefill 0 -> 0.110; read 0.110 -> 0.215 (5 ms + 100 x 1000 B / 1 MB/s); decode 0.215 -> 0.236
    (first token), 3 steps of 0.021 -> 0.299.
    B (t=0.05) finds 1 free block until A's KV is read: prefill 0.215 -> 0.325, read -> 0.430, first token
    0.451, last 0.514. (Freeing at the end of A's prefill, B's prefill would have started at 0.110.)"""
    dg = Disaggregation(1, 1, DEC, sched, kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=1e6, latency_s=0.005)
    res = simulate([Request(0, 0.0, 100, 4), Request(1, 0.05, 100, 4)], PRE, _sched_blocks(8),
                   np.random.default_rng(0), SimConfig(disagg=dg))
    r = res.records
    assert r.first_token == pytest.approx([0.236, 0.451])
    assert r.finish == pytest.approx([0.299, 0.514])
    assert res.transfer_waits == pytest.approx([0.0, 0.0]) and res.transfer_times == pytest.approx([0.105] * 2)


def test_a_decode_replica_reads_the_kv_only_once_it_has_blocks_for_the_whole_prompt():
    """The decode replica admits a remote prefill with blocks for its whole prompt, then reads its KV. Decode
    pool of 8 blocks, A and B both at t=0 (prompts 100, outputs 4): one prefill step 0 -> 0.210 (10 ms + 200 x
    1 ms); A admitted (7 blocks), read 0.210 -> 0.315, first token 0.336, done 0.399; B waits for A's blocks and
    is read only then: 0.399 -> 0.504, first token 0.525, done 0.588. (Moving both before the decode replica
    admits them, B's read would have queued behind A's on the link, 0.315 -> 0.420, first token 0.441.)"""
    dg = Disaggregation(1, 1, DEC, _sched_blocks(8), kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=1e6,
                        latency_s=0.005)
    res = simulate([Request(0, 0.0, 100, 4), Request(1, 0.0, 100, 4)], PRE, sched, np.random.default_rng(0),
                   SimConfig(disagg=dg))
    r = res.records
    assert r.first_token == pytest.approx([0.336, 0.525])
    assert r.finish == pytest.approx([0.399, 0.588])
    assert res.transfer_waits == pytest.approx([0.0, 0.0])  # B's read never queued: it had not begun


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_block_comes_back_to_both_pools(async_scheduling):
    """Under KV pressure on both sides (small pools, bursts, varied lengths, with and without async
    scheduling): every request finishes, and when the run ends both pools have every block free and nothing
    held or loading."""
    from capacity.sim.simulator import Simulation

    def small(n):
        return lambda: make_scheduler("continuous", **{**SCHED, "num_blocks": n, "async_scheduling": async_scheduling})

    dg = Disaggregation(2, 2, DEC, small(40), kv_bytes_per_token=1000.0, bandwidth_bytes_per_s=5e6, latency_s=0.001)
    spec = WorkloadSpec(arrivals=Arrivals(kind="gamma", rate_per_s=8.0, cv=3.0),
                        input_len=Lengths(kind="uniform", low=20, high=300),
                        output_len=Lengths(kind="uniform", low=1, high=40), num_requests=300)
    sim = Simulation(PRE, small(30), np.random.default_rng(5), SimConfig(disagg=dg))
    res = sim.run(spec)
    assert np.isfinite(res.records.finish).all() and not res.rejected
    for rep in sim.replicas:
        s = rep.sched
        assert s.kv.pool.free == s.cfg.num_blocks and not s.held and not s.loading and not s.running


def test_the_decode_pool_has_engine_settings_of_its_own():
    """`--decode-set`: the decode pool's engine alone changes. Its memory budget follows (a token budget of 2,048
    instead of the H100 default 8,192 and 64 sequences instead of 1,024 shrink the activation peak and the CUDA
    graphs, so more KV blocks), its launch line carries the settings, the prefill pool keeps the defaults; a
    wrong key or value is one line naming the flag, on simulate and on disagg."""
    import json

    from tests.conftest import run_cli

    args = ["simulate", "-m", "llama-3.1-8b", "--max-model-len", "8192", "--rate", "2", "-n", "100", "--input-len",
            "2048", "--output-len", "32", "--disagg", "1:1", "--json"]
    base = json.loads(run_cli(*args).stdout)["disaggregated"]
    r = run_cli(*args, "--decode-set", "max_num_batched_tokens=2048", "--decode-set", "max_num_seqs=64")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["disaggregated"]
    assert d["kv"]["prefill"] == base["kv"]["prefill"]
    assert d["kv"]["decode"]["blocks_per_replica"] > base["kv"]["decode"]["blocks_per_replica"]
    prefill_line, decode_line = d["launch_hints"].splitlines()[:2]
    assert "--max-num-seqs 64 " in decode_line and "--max-num-batched-tokens 2048 " in decode_line
    assert "--max-num-seqs 64 " not in prefill_line
    for cmd, bad, msg in ((args, "bogus=1", "'bogus'"), (args, "max_num_seqs=-3", "max_num_seqs"),
                          (["disagg", "-m", "llama-3.1-8b", "--gpus", "2"], "max_num_seqs=0", "max_num_seqs")):
        r = run_cli(*cmd, "--decode-set", bad)
        assert r.returncode == 1 and msg in r.stderr and "--decode-set" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "10", "--decode-set", "max_num_seqs=8")
    assert r.returncode == 1 and "--disagg" in r.stderr
    r = run_cli("disagg", "-m", "llama-3.1-8b", "--gpus", "2", "--input-len", "2048", "--output-len", "64", "-n", "200",
                "--decode-set", "max_num_seqs=64", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["decode_engine"] == {"max_num_seqs": 64}
