"""Continuous batching, after vLLM v1's scheduler. Plain Python: no SimPy, no clock of its own.

There is no separate prefill phase: every sequence has `num_tokens` (prompt + outputs so far) and `computed`
(tokens whose KV is cached), and a step gives each scheduled sequence `num_tokens - computed` new tokens (one
for a decode), within a token budget `max_num_batched_tokens` and `max_num_seqs` sequences, running
sequences first, then waiting ones in the order of the request queue (FCFS, priority or shortest prompt
first: `capacity.sched.queues`). A prefill longer than the remaining budget is chunked (chunked prefill) or
waits (without it). KV blocks come from the KV cache manager (`capacity.sched.kv`); when a running sequence
needs a block and none is free, the queue's victim (FCFS: the last admitted; priority: the least important,
then newest) is preempted by recompute: its blocks are freed and it goes back to the waiting queue with
`computed = 0`. A waiting sequence is admitted only when its whole remaining input fits in free blocks
(vLLM 0.32's default `scheduler_reserve_full_isl`), not just its first chunk, and no sequence is admitted in
a step that had to preempt. With prefix caching, a shared prefix's cached blocks are skipped on admission.

`decode_stretch(...)` and `advance_decodes(...)` (`capacity.sched.stretch`) let the simulator advance k
decode-only steps in one event.

Checked step by step against vLLM 0.32's own scheduler and KV cache manager, driven without a model
(`bench/vllm_scheduler_trace.py` records, `tests/test_vllm_scheduler_trace.py` compares): the same tokens for
the same sequences, the same preemptions, finishes and free blocks at every step.
"""
from __future__ import annotations

from typing import Any

from capacity.cost.step import PrefillChunk, StepPlan
from capacity.sched.base import NAN, Seq, Step, accept_drafts
from capacity.sched.configs import ContinuousConfig
from capacity.sched.kv_factory import make_kv_manager
from capacity.sched.queues import make_queue
from capacity.sched.stretch import DecodeStretches
from capacity.workload import Request

NO_STEP = StepPlan()  # frozen: one shared empty plan


class ContinuousScheduler(DecodeStretches):  # QueueView via DecodeStretches (same MRO; mypyc: one base)
    """vLLM-v1-style continuous batching (see module docstring)."""

    def __init__(self, cfg: ContinuousConfig) -> None:
        self.cfg = cfg
        self.kv = make_kv_manager(cfg.num_blocks, cfg.block_size, cfg.prefix_caching, cfg.kv_groups,
                                  cfg.inflight_tokens or cfg.max_num_batched_tokens)
        self.waiting = make_queue(cfg.queue)
        self.running: list[Seq] = []
        self.num_preemptions = 0
        self.retiring: list[Seq] = []  # async scheduling: finished, still holding blocks and a running slot
        self.unprocessed: list[Seq] = []  # async scheduling: the last step's sequences, output not processed yet
        self.retired_after = False  # the last schedule call freed finished sequences after deciding (async)
        self.loading: list[Seq] = []  # disaggregated decode pool: admitted, loading their prompt's KV
        self.held: dict[Seq, Seq] = {}  # disaggregated prefill pool: finished prefills -> the stand-ins holding
        # their blocks until a decode replica has read them (`release`)
        self.kv.lag = 1 if cfg.async_scheduling else 0
        # async scheduling: which sequences' last step is unprocessed matters only to a KV manager that caches or
        # frees on processed tokens (prefix caching, sliding windows); for the others, processing an output is
        # only the retirement of the finished sequences, done after the next schedule call all the same
        self._track_inflight = cfg.async_scheduling and self.kv.tracks_inflight
        self.drafts_accepted = 0  # speculative decoding: draft tokens accepted so far (outputs beyond one per step)
        self.encoder: Any = None  # vLLM V1's encoder budget and cache for a run with images (capacity.sim.encoder_budget)

    # ---- the protocol's read-only view ------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.loading)

    @property
    def outstanding(self) -> int:
        return len(self.running) - len(self.retiring) + len(self.waiting) + len(self.loading)

    @property
    def max_running(self) -> int:
        return self.cfg.max_num_seqs

    # ---- queue ------------------------------------------------------------------------------------
    def admissible(self, req: Request) -> str | None:
        """Why a request can never run (None if it can)."""
        total = req.prompt_tokens + req.output_tokens
        if self.cfg.max_model_len is not None and total > self.cfg.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.cfg.max_model_len}"
        if self.kv.blocks_for(total) > self.cfg.num_blocks:
            return f"{total} tokens need more KV blocks than the pool's {self.cfg.num_blocks}"
        if self.cfg.reserve_full_input and self.kv.admission_blocks(req.prompt_tokens) > self.cfg.num_blocks:
            return (f"a prompt of {req.prompt_tokens} tokens needs {self.kv.admission_blocks(req.prompt_tokens)} "
                    f"free KV blocks to be admitted, more than the pool's {self.cfg.num_blocks}")
        if not self.cfg.chunked_prefill and req.prompt_tokens > self.cfg.max_num_batched_tokens:
            return (f"prompt of {req.prompt_tokens} tokens exceeds max_num_batched_tokens "
                    f"{self.cfg.max_num_batched_tokens} without chunked prefill")
        return None

    def add(self, req: Request) -> Seq:
        seq = Seq(req)
        self.waiting.add(seq)
        return seq

    def resume(self, seq: Seq) -> None:
        """A sequence whose prompt was computed by a prefill replica, as vLLM's decode instance takes it with the
        NIXL connector (pull_scheduler.py, scheduler.py 0.32): it waits in the queue like any request; admitted
        (the running batch has room, the token budget is not spent, the whole prompt's blocks fit), it takes the
        blocks of its whole prompt and starts loading their KV (`Step.loads`: the simulator moves it), holding
        them with no batch slot and no tokens (WAITING_FOR_REMOTE_KVS); `loaded` puts it back at the head of
        the queue with every prompt token but the last computed, so its first step computes that one and emits
        the first output token."""
        seq.computed = 0
        seq.generated = 0
        seq.blocks = seq.shared_blocks = seq.kv_capacity = 0
        seq.output = seq.req.output_tokens
        seq.last_token_s = NAN
        seq.phase = 2
        seq.loading = 1
        self.waiting.add(seq)

    def loaded(self, seq: Seq) -> None:
        """Its KV has arrived (_update_waiting_for_remote_kv: a full prompt hit recomputes the last token)."""
        self.loading.remove(seq)
        seq.loading = 0
        seq.computed = seq.prompt - 1
        self.waiting.prepend(seq)

    def release(self, seq: Seq) -> None:
        """A decode replica has read this finished prefill's KV: its blocks are freed (the NIXL connector's
        request_finished delays the free until then)."""
        self.kv.free(self.held.pop(seq))

    def _hold(self, seq: Seq) -> Seq:
        """A finished prefill for a decode pool: a stand-in (phase 3) takes its blocks until `release`, and its
        place in the batch where async scheduling keeps one; the sequence itself goes on to a decode replica."""
        h = self.kv.detach(seq)
        h.phase, h.generated, h.output, h.computed = 3, 1, 1, seq.computed
        self.held[seq] = h
        return h

    def _free_finished(self, seq: Seq) -> None:
        if seq.phase == 3:  # a stand-in: its blocks go with `release`
            return
        if seq.phase == 1:
            self._hold(seq)
        else:
            self.kv.free(seq)

    def _preempt(self, seq: Seq, step: Step) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        if seq.generated >= seq.output:  # async scheduling: a finished sequence whose output is still on its way
            self.retiring.remove(seq)  # (vLLM preempts it like any other; it is done, so it does not come back)
            self.num_preemptions += 1
            step.preempted.append(seq)
            return
        if self.encoder is not None:
            self.encoder.release_all(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(seq)
        step.preempted.append(seq)

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> Step:
        cfg, kv, waiting = self.cfg, self.kv, self.waiting
        budget = cfg.max_num_batched_tokens
        step = Step(NO_STEP)
        sched: list[tuple[Seq, int]] = []
        decodes: list[int] = []  # contexts of the running decodes, classified as they are scheduled
        chunks: list[tuple[Seq, int]] = []  # the other scheduled sequences (prefill chunks), in order
        running = self.running
        chunked = cfg.chunked_prefill
        enc = self.encoder
        if enc is not None:
            enc.begin()
        dtok = 1 + cfg.spec_tokens  # budget tokens of one decoding sequence (its drafts too)
        i = 0
        for seq in running:  # the common case first: decodes whose block has room, scheduled as the loop below would
            c = seq.computed
            g = seq.generated
            if not g or g >= seq.output or seq.prompt + g - c != 1 or c >= seq.kv_capacity or budget <= 0:
                break
            sched.append((seq, 1))
            decodes.append(c)
            budget -= dtok if dtok < budget else budget
            i += 1
        stuck = False  # the sequence being scheduled was itself preempted: vLLM schedules no more running ones
        while i < len(running) and budget > 0 and not stuck:
            seq = running[i]
            c = seq.computed
            g = seq.generated
            if g >= seq.output:  # async scheduling: finished in the step before, not scheduled again
                i += 1
                continue
            rem = seq.prompt + g - c
            if rem == 1 and g and c < seq.kv_capacity:  # the common case: a decode whose block has room
                sched.append((seq, 1))
                decodes.append(c)
                budget -= dtok if dtok < budget else budget
                i += 1
                continue
            num_new = rem if rem < budget else budget
            if num_new < rem and not chunked:
                i += 1
                continue
            if enc is not None and seq.req.images:  # the chunk stops before an image the encoder cannot take
                num_new = enc.limit(seq, c, num_new)
                if not num_new:
                    i += 1
                    continue
            while True:
                if c + num_new <= seq.kv_capacity or kv.allocate_slots(seq, num_new):
                    if enc is not None and seq.req.images:
                        enc.commit(seq)
                    sched.append((seq, num_new))
                    if rem == 1 and seq.generated:
                        decodes.append(c)
                        budget -= dtok - 1 if dtok <= budget else budget - 1  # its drafts, as above
                    else:
                        chunks.append((seq, num_new))
                    budget -= num_new
                    i += 1
                    break
                victim = waiting.victim(running)
                v = running.index(victim)
                if v < i:  # the priority queue's victim can be one scheduled earlier in this step: it gives its
                    i -= 1  # tokens back (vLLM's scheduler does the same)
                    for j, (q, n) in enumerate(sched):
                        if q is victim:
                            budget += n
                            del sched[j]
                            break
                self._preempt(victim, step)
                running = self.running
                if victim is seq:
                    stuck = True
                    break
        if not step.preempted:  # as vLLM: no admissions in a step that had to preempt
            while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                seq = waiting.peek()
                kv.get_computed_blocks(seq)
                remaining = seq.num_tokens - seq.computed
                if seq.loading:  # a remote prefill: the whole prompt's blocks now, its KV loaded before it runs
                    if cfg.reserve_output:
                        ok = kv.reserve(seq, seq.prompt + seq.output)
                    else:
                        ok = (not cfg.reserve_full_input or kv.can_fit(seq, remaining)) and \
                            kv.allocate_slots(seq, remaining)
                    if not ok:
                        kv.drop_computed_blocks(seq)
                        break
                    waiting.pop()
                    seq.loading = 2
                    self.loading.append(seq)
                    step.loads.append(seq)
                    continue
                num_new = min(remaining, budget)
                if not cfg.chunked_prefill and num_new < remaining:
                    break
                if enc is not None and seq.req.images:
                    num_new = enc.limit(seq, seq.computed, num_new)
                    if not num_new:
                        kv.drop_computed_blocks(seq)
                        break
                if cfg.reserve_output:
                    ok = kv.reserve(seq, seq.prompt + seq.output)
                elif cfg.reserve_full_input and not kv.can_fit(seq, remaining):
                    ok = False
                else:
                    ok = seq.computed + num_new <= seq.kv_capacity or kv.allocate_slots(seq, num_new)
                if not ok:
                    kv.drop_computed_blocks(seq)
                    break
                waiting.pop()
                if enc is not None and seq.req.images:
                    enc.commit(seq)
                self.running.append(seq)
                if seq.first_scheduled_s != seq.first_scheduled_s:  # NaN: first time
                    seq.first_scheduled_s = now
                sched.append((seq, num_new))
                if remaining == 1 and seq.generated:  # a resumed sequence whose cached prefix left one token
                    decodes.append(seq.computed)
                else:
                    chunks.append((seq, num_new))
                budget -= num_new
        if not step.preempted:  # the common case: each sequence was classified when it was scheduled
            step.plan = StepPlan(tuple(PrefillChunk(n, q.computed, q.computed + n == q.prompt + q.generated)
                                       for q, n in chunks), tuple(decodes))
        else:  # classified after the whole step, as a preemption may have reset a scheduled sequence
            prefills, decodes = [], []
            for seq, n in sched:
                c = seq.computed
                if n == 1 and seq.generated > 0 and seq.prompt + seq.generated - c == 1:
                    decodes.append(c)
                else:
                    prefills.append(PrefillChunk(n, c, c + n == seq.prompt + seq.generated))
            step.plan = StepPlan(tuple(prefills), tuple(decodes))
        step.scheduled = sched
        freed = bool(self.retiring)
        if self.unprocessed:  # async scheduling: the last step's output is processed after this schedule call
            self._process_output()
        elif self.retiring:  # the same, for a KV manager that does not track tokens in flight
            self._retire()
        # async scheduling: finished sequences left with their blocks after this call decided; if it scheduled
        # nothing, vLLM's engine loop (it has requests) schedules again at once, and the queue's head may fit now
        self.retired_after = freed
        step.load_s = kv.take_load_s()  # a host-memory tier's loads for the requests admitted (sched.offload)
        return step

    def _process_output(self) -> None:
        """Async scheduling, after a schedule call: the step before it has its output processed (vLLM's
        update_from_output): its sequences' computed blocks are cached, nothing is in flight any more, and the
        ones that finished leave the batch and free their blocks."""
        kv = self.kv
        for seq in self.unprocessed:
            if seq.inflight and seq.computed:  # not preempted meanwhile
                kv.cache_processed(seq)
            seq.inflight = 0
        self.unprocessed = []
        if self.retiring:
            self._retire()

    def _retire(self) -> None:
        gone = set(map(id, self.retiring))
        self.running = [s for s in self.running if id(s) not in gone]
        for seq in self.retiring:
            self._free_finished(seq)
        self.retiring = []

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        """Apply a step that ended at `end_s`: returns (sequences that emitted a token, finished ones)."""
        emitted: list[Seq] = []
        finished: list[Seq] = []
        spec = self.cfg.spec_tokens
        for seq, n in step.scheduled:
            c = seq.computed = seq.computed + n
            g = seq.generated
            if c == seq.prompt + g:
                g = seq.generated = g + 1
                if spec and g > 1 and n == 1:  # a verify step: its accepted drafts too
                    a = accept_drafts(seq, self.kv, spec, self.cfg.spec_extra_mean)
                    g += a
                    self.drafts_accepted += a
                if g == 1:
                    seq.first_token_s = end_s
                seq.last_token_s = end_s
                emitted.append(seq)
                if g >= seq.output:
                    seq.finish_s = end_s
                    finished.append(seq)
        if self._track_inflight:
            self.unprocessed = [seq for seq, _ in step.scheduled]
            for seq, n in step.scheduled:
                seq.inflight = n
        if finished:
            if self.cfg.async_scheduling:
                for seq in finished:
                    if seq.phase == 1:  # a stand-in keeps its slot and blocks: the sequence goes on elsewhere now
                        h = self._hold(seq)
                        self.running[self.running.index(seq)] = h
                        self.retiring.append(h)
                    else:
                        self.retiring.append(seq)
            else:
                gone = set(map(id, finished))
                self.running = [s for s in self.running if id(s) not in gone]
                for seq in finished:
                    self._free_finished(seq)
        return emitted, finished
