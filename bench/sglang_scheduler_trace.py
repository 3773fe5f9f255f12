"""Record SGLang's own scheduler, step by step, for capacity's SGLang scheduler to be checked against.

    /work/sglang-venv/bin/python bench/sglang_scheduler_trace.py             # needs sglang==0.5.5 (see below); no GPU
    /work/sglang-venv/bin/python bench/sglang_scheduler_trace.py --overlap   # SGLang's default loop (see the end)

No model runs, but SGLang v0.5.5's real `sglang.srt.managers.scheduler.Scheduler` does: it is constructed by its
own `__init__` (ServerArgs, PortArgs, model config, memory pool and cache, SchedulePolicy, new_token_ratio
settings), and each step is one pass of the body of `Scheduler.event_loop_normal` (scheduler.py), run by hand:
`process_input_requests` (the requests that arrive before this step, as TokenizedGenerateReqInput, the path
`recv_requests` feeds), `get_next_batch_to_run` (merge of the last prefill batch, `get_new_batch_prefill` with
the real `PrefillAdder`, `update_running_batch` with `check_decode_mem` / `retract_decode` and the
new_token_ratio decay), `run_batch`, `process_batch_result` (finishes, chunked requests, freeing KV through the
cache), or `self_check_during_idle` (its memory-leak check, and the reset of new_token_ratio) when no batch
forms. `--disable-overlap-schedule` (the normal loop) and `--disable-radix-cache` (ChunkCache; one scenario keeps
SGLang's default RadixCache, with no shared prefixes), FCFS, page size 1 or 16, CPU tensors,
`attention_backend=torch_native` (the pure-torch paths of the KV bookkeeping); the paged allocator's two Triton
kernels (which slots a request's new tokens get) run in Triton's CPU interpreter (TRITON_INTERPRET=1).

Stubbed, and only these: `TpModelWorker` (FakeTpWorker below) builds no ModelRunner and loads no weights; it
sizes the limits and builds the pools exactly as `TpModelWorker.__init__` (tp_worker.py) and
`ModelRunner.init_memory_pool` (model_runner.py) do for a pool of `max_total_tokens` (the real ReqToTokenPool,
MHATokenToKVPool of one 1-dim head and layer, and TokenToKVPoolAllocator / PagedTokenToKVPoolAllocator), and its
`forward_batch_generation` returns one sampled token (id 7, never EOS) per request without a forward pass, as
the real worker returns after sampling. The distributed groups (`get_pp_group`, `get_world_group`, the TP
group) are single-rank stand-ins; the output sockets to the tokenizer are a sink; `sgl_kernel` (CUDA kernels,
imported at module level by layers the scheduler module imports but never calls here) is an import stub whose
calls are recorded and must stay zero. Requests do not set ignore_eos (the model never emits EOS, so each runs
to its max_new_tokens): SGLang's stricter `add_one_req_ignore_eos` path, taken only for ignore_eos requests
with the radix cache off, is not exercised, as capacity does not model it.

A step is one loop pass that ran a batch, or an idle pass with no waiting or chunked request. A pass that
forms no batch while requests wait (the running batch was marked full and has just emptied) is followed at
once by another in the same step (recorded as `rounds`), as `SglangScheduler.schedule` does. For every step the
trace keeps the batch kind, the tokens scheduled per request (extend_input_len of each request of a prefill
batch; 1 per request of a decode batch), the requests retracted, the requests finished, the free KV tokens
(allocator available_size + evictable tree cache), and new_token_ratio after the step.
`tests/test_sglang_scheduler_trace.py` replays the same arrivals through `capacity.sched.sglang` and compares
every step. Writes tests/data/sglang_scheduler/<scenario>.json.

`--overlap`: SGLang's default, the overlap scheduler (`event_loop_overlap`, scheduler.py), writing
tests/data/sglang_scheduler/overlap/<scenario>.json (the same scenarios, and `retract_finishing`,
`admission_offset`, `extra_decode_slot` and `extra_decode_page`, recorded only here). The Scheduler is built with the overlap on (`init_overlap`: CPU forward/copy streams and events, the
FutureMap, whose torch.compile'd future-token resolution runs through inductor on CPU), and each step is one pass of
that loop's body (`_trace_overlap`): batch n is formed and launched through `run_batch`'s overlap branch (future
token ids, `copy_to_cpu`, the copy_done event; the stub worker returns the same result object as without
overlap), queued as (batch.copy(), result) on `result_queue`, and only then is batch n-1's result processed, so
batch n was decided before batch n-1's finishes, sampled tokens and freed KV were known. SGLang 0.5.5's loop has no
per-batch opt-out of the overlap (no `is_disable_overlap_for_batch` yet) and `launch_batch_sample_if_needed` does
nothing without grammars. A finish is credited to the step that sampled the last token (SGLang sees it a pass
later); the trace ends once every request has finished and the last batch (the finished requests' extra decode)
has been processed.

Install (CPU only, no CUDA; download.pytorch.org is not reachable here, the CPU torch wheel on disk is used):
    python3 -m venv /work/sglang-venv
    /work/sglang-venv/bin/pip install sglang==0.5.5 --no-deps
    /work/sglang-venv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /work/sglang-venv/bin/pip install numpy psutil setproctitle pyzmq pydantic orjson msgspec requests tqdm \
        packaging pybase64 ipython aiohttp transformers==4.57.1 openai==2.6.1 pillow triton fastapi \
        partial_json_parser dill sentencepiece
    /work/sglang-venv/bin/pip install --no-deps compressed-tensors loguru gguf einops
(no sgl-kernel: its wheel needs libnvrtc / CUDA; it is stubbed at import.)
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests/data/sglang_scheduler"
CONTEXT_LEN = 8192  # the tiny model's max_position_embeddings: SGLang's context_len
SAMPLED_TOKEN = 7  # what the stub model samples; the model's EOS is 2


def scenarios() -> dict[str, dict]:
    rng = np.random.default_rng(0)
    out = {}
    # a small pool, varied lengths, bursts: retractions, new_token_ratio reset by retraction, batch-full marks
    steps = np.cumsum(rng.integers(0, 6, 40))
    out["small_pool_retract"] = {
        "engine": {"max_total_tokens": 600, "page_size": 1, "chunked_prefill_size": 128, "max_prefill_tokens": 16384,
                   "max_running_requests": 16},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 200)),
                      "output": int(rng.integers(4, 150))} for i in range(40)]}
    # chunked prefill next to decodes, no KV pressure: long prompts split over steps, prefill-first batches
    steps = np.cumsum(rng.integers(0, 20, 25))
    out["chunked_prefill_mix"] = {
        "engine": {"max_total_tokens": 20000, "page_size": 1, "chunked_prefill_size": 256, "max_prefill_tokens": 16384,
                   "max_running_requests": 16},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(16, 1500)),
                      "output": int(rng.integers(1, 60))} for i in range(25)]}
    # a burst: 48 requests at step 0 on a pool that holds a fraction: admission by the new_token_ratio estimate,
    # the batch-full mark, and the ratio decaying over a long decode-only stretch
    out["burst_admission"] = {
        "engine": {"max_total_tokens": 3000, "page_size": 1, "chunked_prefill_size": 512, "max_prefill_tokens": 16384,
                   "max_running_requests": 32},
        "requests": [{"id": i, "step": 0, "prompt": int(rng.integers(20, 300)),
                      "output": int(rng.integers(20, 400))} for i in range(48)]}
    # pages of 16: page-rounded admission, a new page per request crossing a boundary; schedule_conservativeness
    # 0.3 (what SGLang sets with DP attention) starts new_token_ratio at 0.21: more admitted, more retractions
    steps = np.cumsum(rng.integers(0, 8, 40))
    out["paged_retract"] = {
        "engine": {"max_total_tokens": 960, "page_size": 16, "chunked_prefill_size": 64, "max_prefill_tokens": 16384,
                   "max_running_requests": 16, "schedule_conservativeness": 0.3},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 250)),
                      "output": int(rng.integers(20, 300))} for i in range(40)]}
    # the ratio's environment knobs: a decay over 60 decode steps (not 600) and 5 retract-decode steps (not 20)
    steps = np.cumsum(rng.integers(0, 8, 40))
    out["fast_decay_retract"] = {
        "engine": {"max_total_tokens": 1000, "page_size": 1, "chunked_prefill_size": 128, "max_prefill_tokens": 16384,
                   "max_running_requests": 16,
                   "env": {"SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": 60, "SGLANG_RETRACT_DECODE_STEPS": 5}},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 250)),
                      "output": int(rng.integers(20, 300))} for i in range(40)]}
    # chunked prefill off (--chunked-prefill-size -1): max_prefill_tokens bounds a prefill batch instead, a cap of
    # 6 running requests
    steps = np.cumsum(rng.integers(0, 8, 30))
    out["unchunked_cap"] = {
        "engine": {"max_total_tokens": 4000, "page_size": 1, "chunked_prefill_size": -1, "max_prefill_tokens": 512,
                   "max_running_requests": 6},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(16, 480)),
                      "output": int(rng.integers(2, 100))} for i in range(30)]}
    # SGLang's default, the radix cache on (capacity's launch command keeps it): the same requests as
    # small_pool_retract; no prompt shares a prefix, finished requests' KV stays in the tree as evictable
    out["small_pool_retract_radix"] = {"engine": {**out["small_pool_retract"]["engine"], "radix_cache": True},
                                       "requests": out["small_pool_retract"]["requests"]}
    # overlap only: short outputs next to long ones under KV pressure, so that a retraction picks a request whose
    # last token was sampled in the step before but not yet processed (SGLang re-queues it)
    rng = np.random.default_rng(21)
    steps = np.cumsum(rng.integers(0, 4, 120))
    out["retract_finishing"] = {
        "overlap_only": True,
        "engine": {"max_total_tokens": 2000, "page_size": 1, "chunked_prefill_size": 128, "max_prefill_tokens": 16384,
                   "max_running_requests": 64},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(16, 700)),
                      "output": int(rng.integers(1, 60))} for i in range(120)]}
    # overlap only: a prefill decided right after a decode step sees the running requests' outputs one short, so
    # its offset holds one more remaining token per running request (x new_token_ratio); here that refuses a request
    # that the processed counts would admit (step 57, request 11)
    rng = np.random.default_rng(117)
    n, pool = int(rng.integers(10, 30)), int(rng.choice([400, 600, 800, 1000]))
    steps = np.cumsum(rng.integers(0, 6, n))
    out["admission_offset"] = {
        "overlap_only": True,
        "engine": {"max_total_tokens": pool, "page_size": 1, "chunked_prefill_size": 128, "max_prefill_tokens": 16384,
                   "max_running_requests": 16},
        "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 150)),
                      "output": int(rng.integers(4, 120))} for i in range(n)]}
    # overlap only: a request that sampled its last token decodes once more (its output is not processed yet), and
    # check_decode_mem counts that extra decode's slot (page 1, step 84: another request is retracted for it) or the
    # new page it opens (pages of 16, step 92: the finishing request itself is retracted)
    for name, seed in (("extra_decode_page", 145), ("extra_decode_slot", 32)):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(10, 40))
        page = int(rng.choice([1, 16]))
        pool = int(rng.choice([300, 400, 600])) // page * page
        steps = np.cumsum(rng.integers(0, 5, n))
        out[name] = {
            "overlap_only": True,
            "engine": {"max_total_tokens": pool, "page_size": page, "chunked_prefill_size": 128,
                       "max_prefill_tokens": 16384, "max_running_requests": 16,
                       "schedule_conservativeness": float(rng.choice([0.3, 1.0]))},
            "requests": [{"id": i, "step": int(steps[i]), "prompt": int(rng.integers(8, 150)),
                          "output": int(rng.integers(2, 120))} for i in range(n)]}
    return out


# ---- the stand-ins ---------------------------------------------------------------------------------------------
KERNEL_CALLS: list[str] = []


class _Dummy:
    """Any attribute of the stubbed sgl_kernel: a name whose calls are recorded (there must be none)."""

    def __init__(self, name: str) -> None:
        self._n = name

    def __getattr__(self, a: str):
        if a.startswith("__"):
            raise AttributeError(a)
        return _Dummy(f"{self._n}.{a}")

    def __call__(self, *a, **k):
        KERNEL_CALLS.append(self._n)
        return _Dummy(self._n + "()")

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "sgl_kernel":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def tiny_model_dir() -> str:
    d = Path(tempfile.gettempdir()) / "capacity-sglang-tiny"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 32000,
        "max_position_embeddings": CONTEXT_LEN, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16"}))
    return str(d)


def build_scheduler(e: dict, overlap: bool = False):
    """SGLang's Scheduler, built by its own __init__ around a model-less TpModelWorker (overlap: SGLang's default
    overlap scheduler on, so that __init__ also runs `init_overlap`: the forward and copy streams, the FutureMap)."""
    import sglang.srt.managers.scheduler as sch
    import sglang.srt.managers.tp_worker as tpw
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.server_args import PortArgs, ServerArgs, set_global_server_args_for_scheduler

    class Group:  # one rank: no TP / PP / world communication
        rank, world_size, ranks, cpu_group, device_group = 0, 1, [0], None, None
        is_first_rank = is_last_rank = True

    class Runner:
        hybrid_gdn_config = None
        mambaish_config = None

    class FakeTpWorker:
        """TpModelWorker less the model: limits as in TpModelWorker.__init__, pools as in
        ModelRunner.init_memory_pool, and a forward pass that returns one sampled token per request."""

        def __init__(self, server_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank, nccl_port, **kw):
            self.model_config = ModelConfig.from_server_args(server_args)
            self.device = "cpu"
            page = server_args.page_size
            total = server_args.max_total_tokens // page * page  # ModelRunner.init_memory_pool: page floor
            self.max_total_num_tokens = total
            ctx = self.model_config.context_len
            max_num_reqs = min(max(int(total / ctx * 512), 2048), 4096)  # init_memory_pool
            r = self.model_runner = Runner()
            r.req_to_token_pool = ReqToTokenPool(size=max_num_reqs, max_context_len=ctx + 4, device="cpu",
                                                 enable_memory_saver=False)
            r.token_to_kv_pool = MHATokenToKVPool(total, page_size=page, dtype=torch.bfloat16, head_num=1,
                                                  head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False,
                                                  start_layer=0, end_layer=1)
            if page == 1:
                r.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
                    total, dtype=torch.bfloat16, device="cpu", kvcache=r.token_to_kv_pool, need_sort=False)
            else:
                r.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(
                    total, page_size=page, dtype=torch.bfloat16, device="cpu", kvcache=r.token_to_kv_pool,
                    need_sort=False)
            self.max_prefill_tokens = server_args.max_prefill_tokens
            self.max_running_requests = min(total // 2 if server_args.max_running_requests is None
                                            else server_args.max_running_requests, max_num_reqs)
            self.max_queued_requests = server_args.max_queued_requests
            self.max_req_len = min(ctx - 1, total - 1)
            self.max_req_input_len = self.max_req_len - 5
            self.random_seed = server_args.random_seed
            self.is_hybrid = False

        def get_worker_info(self):
            r = self.model_runner
            return (self.max_total_num_tokens, self.max_prefill_tokens, self.max_running_requests,
                    self.max_queued_requests, self.max_req_len, self.max_req_input_len, self.random_seed,
                    self.device, r.req_to_token_pool.size, r.req_to_token_pool.max_context_len,
                    r.token_to_kv_pool.size)

        def get_tp_group(self):
            return Group()

        def get_attention_tp_group(self):
            return Group()

        def get_attention_tp_cpu_group(self):
            return None

        def get_pad_input_ids_func(self):
            return None

        def get_memory_pool(self):
            return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

        def forward_batch_generation(self, model_worker_batch, *a, **k):
            n = len(model_worker_batch.seq_lens)
            # the real worker's result with no logits kept (the overlap path's copy_to_cpu reads logits_output)
            return GenerationBatchResult(logits_output=LogitsProcessorOutput(next_token_logits=None),
                                         can_run_cuda_graph=False,
                                         next_token_ids=torch.full((n,), SAMPLED_TOKEN, dtype=torch.int64))

    tpw.TpModelWorker = FakeTpWorker
    sch.get_pp_group = lambda: Group()
    sch.get_world_group = lambda: Group()
    radix = bool(e.get("radix_cache"))
    sa = ServerArgs(model_path=tiny_model_dir(), skip_tokenizer_init=True, disable_radix_cache=not radix,
                    disable_overlap_schedule=not overlap, attention_backend="torch_native", sampling_backend="pytorch",
                    device="cpu", disable_cuda_graph=True, max_total_tokens=e["max_total_tokens"],
                    chunked_prefill_size=e["chunked_prefill_size"], max_prefill_tokens=e["max_prefill_tokens"],
                    max_running_requests=e["max_running_requests"], page_size=e["page_size"],
                    schedule_policy="fcfs", schedule_conservativeness=e.get("schedule_conservativeness", 1.0),
                    watchdog_timeout=1e9, random_seed=0,
                    log_level="error")
    set_global_server_args_for_scheduler(sa)
    s = sch.Scheduler(sa, PortArgs.init_new(sa), gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0, dp_rank=None)
    assert type(s.tree_cache).__name__ == ("RadixCache" if radix else "ChunkCache")
    assert s.enable_overlap == overlap and not s.is_mixed_chunk

    class Sink:
        def send_output(self, out, recv_obj=None):
            pass

    s.send_to_detokenizer = s.send_to_tokenizer = Sink()
    return s


def trace(sc: dict, overlap: bool = False) -> dict:
    e = sc["engine"]
    env = {k: str(v) for k, v in e.get("env", {}).items()}  # SGLang's envs.X.get() reads os.environ at each call
    assert set(env) <= {"SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "SGLANG_RETRACT_DECODE_STEPS",
                        "SGLANG_INIT_NEW_TOKEN_RATIO", "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _trace(sc, e, overlap)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _trace(sc: dict, e: dict, overlap: bool = False) -> dict:
    import sglang
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    s = build_scheduler(e, overlap)
    retracted: list = []
    retract = ScheduleBatch.retract_decode

    def recording_retract(self, server_args):  # the real retract_decode; only its result is noted
        r = retract(self, server_args)
        retracted.extend(r[0])
        return r

    ScheduleBatch.retract_decode = recording_retract
    rng = np.random.default_rng(1)

    def request(r: dict):
        sp = SamplingParams(max_new_tokens=r["output"])
        sp.normalize(None)
        sp.verify(32000)
        ids = [int(x) for x in rng.integers(10, 30_000, r["prompt"])]
        return TokenizedGenerateReqInput(rid=f"{r['id']:06d}", input_text="", input_ids=ids, mm_inputs=None,
                                         sampling_params=sp, return_logprob=False, logprob_start_len=-1,
                                         top_logprobs_num=0, token_ids_logprob=None, stream=False)

    pending = sorted(sc["requests"], key=lambda r: (r["step"], r["id"]))
    if overlap:
        return _trace_overlap(s, sc, e, pending, request, retracted, retract)
    steps, step, done = [], 0, 0
    try:
        while done < len(pending) and step < 100_000:
            s.process_input_requests([request(r) for r in pending if r["step"] == step])
            retracted.clear()
            rounds, kind, scheduled, finished = 0, "idle", [], []
            while True:  # one pass of Scheduler.event_loop_normal, less recv_requests
                rounds += 1
                batch = s.get_next_batch_to_run()
                s.cur_batch = batch
                if batch:
                    kind = "extend" if batch.forward_mode.is_extend() else "decode"
                    assert kind == "extend" or batch.forward_mode.is_decode()
                    scheduled = sorted([int(r.rid), r.extend_input_len if kind == "extend" else 1]
                                       for r in batch.reqs)
                    result = s.run_batch(batch)
                    s.process_batch_result(batch, result)
                    finished = sorted(int(r.rid) for r in batch.reqs if r.finished())
                else:
                    s.self_check_during_idle()
                s.last_batch = batch
                if batch or (not s.waiting_queue and s.chunked_req is None) or rounds >= 4:
                    break
            done += len(finished)
            free = s.token_to_kv_pool_allocator.available_size() + s.tree_cache.evictable_size()
            steps.append({"step": step, "kind": kind, "rounds": rounds, "scheduled": scheduled,
                          "retracted": sorted(int(r.rid) for r in retracted), "finished": finished,
                          "free_tokens": int(free), "new_token_ratio": s.new_token_ratio})
            step += 1
    finally:
        ScheduleBatch.retract_decode = retract
    assert not KERNEL_CALLS, f"a CUDA kernel stub was called: {KERNEL_CALLS[:5]}"
    assert done == len(pending), "not every request finished"
    return {"sglang": sglang.__version__, "engine": {**e, "context_len": CONTEXT_LEN}, "requests": sc["requests"],
            "steps": steps}


def _trace_overlap(s, sc: dict, e: dict, pending: list, request, retracted: list, retract) -> dict:
    """The body of `Scheduler.event_loop_overlap` (scheduler.py, v0.5.5) per pass, less recv_requests: schedule and
    launch batch n (`run_batch` through its overlap branch: the FutureMap's future token ids, the forward stream,
    `copy_to_cpu` and the copy_done event), put (batch.copy(), result) on `result_queue`, then process batch n-1's
    result (`process_batch_result`) if there was a last batch, else `self_check_during_idle` if no batch formed,
    then `launch_batch_sample_if_needed`. A request's finish is credited to the step whose batch sampled its last
    token (it is seen, and its KV freed, one pass later); `free_tokens` and `new_token_ratio` are read after the
    pass, its processing of the last batch included. The trace runs until every request has finished and the
    last batch (the finished requests' one extra decode) has been processed."""
    import sglang
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    s.result_queue = deque()  # event_loop_overlap's first statement
    steps: list[dict] = []
    step, done = 0, 0
    step_of: dict[int, int] = {}  # id(the batch copy on the result queue) -> the step that launched it
    finished: dict[int, list[int]] = {}  # step -> the requests whose last token its batch sampled
    try:
        while (done < len(pending) or s.last_batch is not None) and step < 100_000:
            s.process_input_requests([request(r) for r in pending if r["step"] == step])
            retracted.clear()
            rounds, kind, scheduled = 0, "idle", []
            while True:  # one pass of Scheduler.event_loop_overlap, less recv_requests
                rounds += 1
                batch = s.get_next_batch_to_run()
                s.cur_batch = batch
                batch_result = None
                if batch:
                    kind = "extend" if batch.forward_mode.is_extend() else "decode"
                    assert kind == "extend" or batch.forward_mode.is_decode()
                    scheduled = sorted([int(r.rid), r.extend_input_len if kind == "extend" else 1]
                                       for r in batch.reqs)
                    batch_result = s.run_batch(batch)
                    copy = batch.copy()
                    step_of[id(copy)] = step
                    s.result_queue.append((copy, batch_result))
                if s.last_batch:
                    tmp_batch, tmp_result = s.result_queue.popleft()
                    before = {id(r) for r in tmp_batch.reqs if not r.finished()}
                    s.process_batch_result(tmp_batch, tmp_result)
                    fin = sorted(int(r.rid) for r in tmp_batch.reqs if id(r) in before and r.finished())
                    finished[step_of.pop(id(tmp_batch))] = fin
                    done += len(fin)
                elif batch is None:
                    s.self_check_during_idle()
                s.launch_batch_sample_if_needed(batch_result)
                s.last_batch = batch
                if batch or (not s.waiting_queue and s.chunked_req is None) or rounds >= 4:
                    break
            free = s.token_to_kv_pool_allocator.available_size() + s.tree_cache.evictable_size()
            steps.append({"step": step, "kind": kind, "rounds": rounds, "scheduled": scheduled,
                          "retracted": sorted(int(r.rid) for r in retracted), "finished": [],
                          "free_tokens": int(free), "new_token_ratio": s.new_token_ratio})
            step += 1
    finally:
        ScheduleBatch.retract_decode = retract
    assert not KERNEL_CALLS, f"a CUDA kernel stub was called: {KERNEL_CALLS[:5]}"
    assert done == len(pending) and not s.result_queue, "not every request finished"
    for x in steps:
        x["finished"] = finished.get(x["step"], [])
    assert sum(len(x["finished"]) for x in steps) == len(pending)
    return {"sglang": sglang.__version__, "overlap": True, "engine": {**e, "context_len": CONTEXT_LEN},
            "requests": sc["requests"], "steps": steps}


def main() -> int:
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    os.environ["TRITON_INTERPRET"] = "1"  # the paged allocator's Triton kernels run in Triton's CPU interpreter
    sys.meta_path.insert(0, _StubFinder())
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    args = sys.argv[1:]
    overlap = "--overlap" in args
    only = {a for a in args if a != "--overlap"}
    out = OUT / "overlap" if overlap else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, sc in scenarios().items():
        if (only and name not in only) or (sc.pop("overlap_only", False) and not overlap):
            continue
        t = trace(sc, overlap)
        ret = sum(len(x["retracted"]) for x in t["steps"])
        (out / f"{name}.json").write_text(json.dumps(t, separators=(",", ":")) + "\n")
        print(f"{name}: {len(t['steps'])} steps, {ret} retractions, "
              f"{sum(x['rounds'] > 1 for x in t['steps'])} steps of more than one round, SGLang {t['sglang']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
