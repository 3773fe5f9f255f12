"""SGLang's scheduler (v0.5.5, `python/sglang/srt/managers/scheduler.py`, `schedule_policy.py`,
`schedule_batch.py`), as the simulator's `Scheduler`. Plain Python: no SimPy, no clock of its own.

What one round of SGLang's event loop does (`get_next_batch_to_run`), and so one step here:

- **Prefill first.** If a chunked request is in progress, or requests wait and the running batch is not marked
  full, a prefill ("extend") batch is formed by the `PrefillAdder` rules; if one forms, the step runs it alone:
  SGLang does not mix prefill and decode in one batch by default (`enable_mixed_chunk` is off). Otherwise every
  running request decodes one token.
- **Admission** (`PrefillAdder.add_one_req`, FCFS order, the default `schedule_policy`): with
  `rem_total = free KV slots - offset`, where the offset starts at the sum over running requests of
  min(max_new_tokens - output so far, 4096) x new_token_ratio, a request is refused (NO_TOKEN) when its input +
  min(its remaining max_new_tokens, 4096) >= rem_total; an admitted one adds its (page-rounded) input + its whole
  clipped max_new_tokens to the offset. At most `max_prefill_tokens` input tokens per batch (the first request is
  always allowed), at most `chunked_prefill_size` (the last request is cut there and becomes the chunked request,
  whose chunks then run in consecutive prefill steps), and at most `max_running_requests` requests in all.
- **The "batch is full" mark** (`running_batch.batch_is_full`): a refusal for tokens, or reaching
  max_running_requests, marks the running batch full, and no prefill is tried again until the batch shrinks
  (a request finishes: it is filtered out at the start of the next decode round, so the next prefill attempt
  comes one decode step after the finish; a retraction; a prefill batch that loses members). So a refused
  request is not retried every step as the ratio decays: it is retried when something leaves.
- **Decode and retraction** (`update_running_batch`, `ScheduleBatch.retract_decode`): if the free slots cannot
  hold one new token per running request (one new page per request crossing a page boundary), requests sorted
  by (output tokens, -input tokens) descending are popped from the end (fewest outputs first, ties: the longest
  prompt), one at a time until the rest fit; their KV is freed, they are appended to the back of the waiting
  queue (SGLang's `_add_request_to_queue`, FCFS keeps list order) and later recompute input + outputs so far;
  new_token_ratio = min(1, (outputs of the kept + 20 x kept) / (max_new_tokens of the kept + 1)). Without a
  retraction, new_token_ratio decays by (init - min) / 600 per decode step, down to min (init 0.7 x
  schedule_conservativeness, min = init x 0.14). A round that forms no batch (the server idle) resets it to init.

A request's `output_tokens` stands for its max_new_tokens: it generates exactly that many (a client capping
max_tokens at the length it gets; no early EOS). Requests SGLang would cut are refused instead: input >=
max_req_len - 5, or input + output > max_req_len - 1, with max_req_len = min(context_len, pool) - 1.

**The overlap scheduler** (`overlap_schedule`, off by default in SglangConfig, on from the engine model as in
SGLang, `event_loop_overlap`): steps decided on one-step-stale state, in `sglang_overlap.py`.

Not modelled: the radix (prefix) cache (no prefix is shared; with no reuse SGLang's evictable cache counts as
free slots, as here), the stricter admission of `ignore_eos` requests when the radix cache is disabled
(`add_one_req_ignore_eos`), mixed chunked prefill, priority scheduling and its preemption, speculative draft trees
(top-k > 1), DP attention, LoRA batching, hierarchical cache, disaggregation.

The ratio is kept as (base, decode steps since) so that `advance_decodes(k)` (the simulator's fast path) and k
single decode steps give the same float: base - n x decay, floored at min once n > 0.
"""
from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr

from capacity.cost.step import PrefillChunk, StepPlan
from capacity.sched.base import Seq, Step, accept_drafts
from capacity.sched.configs import MAX_PREFILL_TOKENS as MAX_PREFILL_TOKENS  # capacity.engine.sglang's
from capacity.sched.configs import SglangConfig
from capacity.sched.kv import KVCacheManager, longest_stretch
from capacity.sched.sglang_overlap import SglangOverlap
from capacity.sched.stretch import advance_running
from capacity.workload import Request


@mypyc_attr(allow_interpreted_subclasses=True)  # the trace tests change one rule in a subclass
class SglangScheduler(SglangOverlap):  # QueueView via SglangOverlap (same MRO; mypyc: one base)
    """SGLang v0.5.5's scheduling (see module docstring); the overlap scheduler's bookkeeping is `SglangOverlap`'s."""

    def __init__(self, cfg: SglangConfig) -> None:
        self.cfg = cfg
        self.kv = KVCacheManager(cfg.max_total_tokens // cfg.page_size, cfg.page_size)
        self.waiting = deque()  # deque[Seq] (typed Any by QueueView)
        self.running: list[Seq] = []  # decoding requests, in SGLang's running-batch order
        self.chunked: Seq | None = None  # the request whose prompt is being prefilled in chunks
        self.inflight: list[Seq] = []  # the members of the prefill batch being run
        self.inflight_prefill = False
        self.batch_full = False  # running_batch.batch_is_full
        self.unfiltered = 0  # finished requests SGLang still holds in the running batch until the next decode round
        self.num_preemptions = 0
        self.init_ratio = min(cfg.init_new_token_ratio * cfg.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * cfg.min_new_token_ratio_factor, 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / cfg.new_token_ratio_decay_steps
        self.ratio_base = self.init_ratio
        self.ratio_steps = 0  # decode steps without retraction since the ratio was last set
        self._init_overlap(cfg.overlap_schedule)  # the overlap scheduler's one-step lag
        self.drafts_accepted = 0  # speculative decoding: draft tokens accepted so far

    # ---- new_token_ratio -----------------------------------------------------------------------------
    @property
    def new_token_ratio(self) -> float:
        if self.ratio_steps == 0:
            return self.ratio_base
        return max(self.ratio_base - self.ratio_steps * self.decay, self.min_ratio)

    def _set_ratio(self, value: float) -> None:
        self.ratio_base, self.ratio_steps = value, 0

    # ---- the protocol's read-only view ---------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.inflight or self.chunked is not None or self.holders)

    @property
    def outstanding(self) -> int:
        extra = len(self.inflight) if self.inflight else int(self.chunked is not None)
        return len(self.running) - len(self.retiring) + len(self.waiting) + extra

    @property
    def max_running(self) -> int:
        return self.cfg.max_running_requests

    # ---- queue ---------------------------------------------------------------------------------------
    def admissible(self, req: Request) -> str | None:
        """Why SGLang would not run this request as given (None if it runs): an input of max_req_len - 5 tokens
        or more is refused; a longer total would have its max_new_tokens cut to max_req_len - 1 - input."""
        m = self.cfg.max_req_len
        if req.prompt_tokens >= m - 5:
            return f"prompt of {req.prompt_tokens} tokens: SGLang refuses inputs of max_req_len - 5 = {m - 5} or more"
        total = req.prompt_tokens + req.output_tokens
        if total > m - 1:
            return (f"prompt + output = {total} tokens exceeds max_req_len - 1 = {m - 1} (min(context_len, KV "
                    "pool) - 2): SGLang would cut its output")
        return None

    def add(self, req: Request) -> Seq:
        seq = Seq(req)
        self.waiting.append(seq)
        return seq

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> Step:
        if self.overlap:
            return self._schedule_overlap(now)
        for _ in range(4):  # a round that forms no batch (SGLang's idle round) changes state; the next one runs
            step = self._round(now)
            if step is not None:
                return step
            if not self.waiting and self.chunked is None:
                break
        return Step(StepPlan())

    def _round(self, now: float) -> Step | None:
        step = self._prefill(now)
        if step is not None:
            return step
        # update_running_batch: finished requests leave the batch now; a smaller batch is no longer full
        shrunk, self.unfiltered = self.unfiltered > 0, 0
        if not self.running:
            self.batch_full = False
            if not self.launched:  # no batch this round (nor in the last, with overlap): self_check_during_idle
                self._set_ratio(self.init_ratio)
            return None
        step = Step(StepPlan())
        if not self._decode_fits(self.running):
            self._retract(step)
            shrunk = True
        else:
            self.ratio_steps += 1
        if shrunk:
            self.batch_full = False
        kv = self.kv
        for s in self.running:
            if not kv.allocate_slots(s, 1):  # _decode_fits / _retract made room
                raise AssertionError("SGLang decode ran out of KV slots")
        step.plan = StepPlan((), tuple(s.computed for s in self.running))
        step.scheduled = [(s, 1) for s in self.running]
        self.inflight_prefill = False
        return step

    def _decode_fits(self, seqs: list[Seq]) -> bool:
        """check_decode_mem: free slots hold one more token of each (a new page where one is crossed)."""
        need = 0
        for s in seqs:
            if s.computed + 1 > s.kv_capacity:
                need += 1
        return need <= self.kv.num_free_blocks

    def _retract(self, step: Step) -> None:
        """retract_decode: fewest outputs first (ties: longest prompt), until the rest can decode one token."""
        running = self.running
        order = list(range(len(running)))  # output counts as SGLang sees them (overlap: one short for the last step)
        order.sort(key=lambda i: (running[i].generated - running[i].inflight, -running[i].prompt), reverse=True)
        first = True
        while first or not self._decode_fits([running[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            seq = running[order.pop()]
            if seq.inflight:  # overlap: the token the last step sampled for it is dropped
                self._drop_inflight(seq)
            else:
                self.kv.free(seq)
            seq.computed = 0
            seq.preemptions += 1
            self.num_preemptions += 1
            self.waiting.append(seq)
            step.preempted.append(seq)
        self.running = [running[i] for i in order]
        decoded = sum(s.generated - s.inflight for s in self.running)
        max_new = sum(s.output for s in self.running)
        self._set_ratio(min(1.0, (decoded + self.cfg.retract_decode_steps * len(self.running)) / (max_new + 1)))

    def _prefill(self, now: float) -> Step | None:
        """get_new_batch_prefill with PrefillAdder (see module docstring); None if no batch forms."""
        cfg, kv = self.cfg, self.kv
        if (self.batch_full or not self.waiting) and self.chunked is None:
            return None
        cap = cfg.max_running_requests
        running_bs = len(self.running) + self.unfiltered
        if cap - running_bs <= 0 and self.chunked is None:
            self.batch_full = True
            return None
        page, clip = cfg.page_size, cfg.clip_max_new_tokens
        ratio = self.new_token_ratio
        avail = kv.num_free_blocks * page  # available_size() (+ an evictable radix cache: none here)
        # the running requests' estimated future tokens, summed in batch order as SGLang does (0 + sum of list;
        # start 0.0, the same floats: mypyc compiles `0 + sum(...)` of floats as an int addition, a TypeError)
        offset: float = sum([min(s.output - s.generated + s.inflight, clip) * ratio for s in self.running], 0.0)
        cur_offset = 0
        rem_input = cfg.max_prefill_tokens
        rem_chunk = cfg.chunked_prefill_size
        can_run: list[tuple[Seq, int]] = []
        chunked: Seq | None = None

        def ceil_page(n: int) -> int:
            return -(-n // page) * page

        if self.chunked is not None:  # add_chunked_req: its next chunk, whatever the token budget says
            seq = self.chunked
            assert rem_chunk is not None
            ext = seq.prompt + seq.generated - seq.computed
            room = min(rem_chunk, int(avail - offset))
            n = max(1, min(ext, room))  # (SGLang would form an empty chunk if nothing were left: not reached)
            truncated = ext > room
            can_run.append((seq, n))
            c = ceil_page(n)
            offset += c + (0 if truncated else min(seq.output, clip))
            cur_offset += c
            rem_input -= c
            rem_chunk -= c
            if truncated:
                chunked = seq
        taken = 0
        for seq in self.waiting:
            if len(can_run) >= cap - running_bs:
                self.batch_full = True
                break
            ext = seq.prompt + seq.generated - seq.computed
            total = ext + min(max(seq.output - seq.generated, 0), clip)
            if total >= avail - offset:  # NO_TOKEN
                self.batch_full = True
                break
            inp = ceil_page(ext)
            if inp >= rem_input and can_run:  # OTHER
                break
            if rem_chunk is None or inp <= rem_chunk:
                n = ext
                offset += inp + min(seq.output, clip)
                c = inp
            else:
                c = rem_chunk // page * page
                if c <= 0:  # OTHER
                    break
                n = c
                chunked = seq
                offset += c
            can_run.append((seq, n))
            taken += 1
            cur_offset += c
            rem_input -= c
            if rem_chunk is not None:
                rem_chunk -= c
            if avail - offset <= 0 or avail - cur_offset <= 0:  # budget_state: NO_TOKEN
                self.batch_full = True
                break
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):  # budget_state: OTHER
                break
        if not can_run:
            return None
        for _ in range(taken):
            self.waiting.popleft()
        self.chunked = chunked
        prefills = []
        for seq, n in can_run:
            if seq.first_scheduled_s != seq.first_scheduled_s:  # NaN: first time
                seq.first_scheduled_s = now
            c = seq.computed
            if not kv.allocate_slots(seq, n):  # the adder kept the batch inside the free slots
                raise AssertionError("SGLang prefill ran out of KV slots")
            prefills.append(PrefillChunk(n, c, c + n == seq.prompt + seq.generated))
        self.inflight = [s for s, _ in can_run]
        self.inflight_prefill = True
        return Step(StepPlan(tuple(prefills)), scheduled=can_run)

    def complete(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        """Apply a step that ended at `end_s`: (sequences that emitted a token, finished ones)."""
        if self.overlap:
            return self._complete_overlap(step, end_s)
        emitted: list[Seq] = []
        finished: list[Seq] = []
        prefill = self.inflight_prefill
        was_empty = not self.running and not self.unfiltered
        shrunk = False
        for seq, n in step.scheduled:
            c = seq.computed = seq.computed + n
            g = seq.generated
            if c != seq.prompt + g:  # a chunk short of the prompt's end: stays the chunked request
                shrunk = True
                continue
            g = seq.generated = g + 1
            if self.cfg.spec_tokens and not prefill:  # a verify step (eagle_worker.py): its accepted drafts too
                a = accept_drafts(seq, self.kv, self.cfg.spec_tokens, self.cfg.spec_extra_mean)
                g += a
                self.drafts_accepted += a
            if g == 1:
                seq.first_token_s = end_s
            seq.last_token_s = end_s
            emitted.append(seq)
            if g >= seq.output:
                seq.finish_s = end_s
                finished.append(seq)
            elif prefill:
                self.running.append(seq)  # merge_batch: the prefill batch joins the running batch
        if finished:
            gone = set(map(id, finished))
            if not prefill:
                self.running = [s for s in self.running if id(s) not in gone]
                self.unfiltered += len(finished)
            else:
                shrunk = True
            for seq in finished:
                self.kv.free(seq)
        if prefill:
            self.inflight = []
            self.inflight_prefill = False
            if shrunk or was_empty:  # a smaller prefill batch, or one that became the running batch
                self.batch_full = False
        self._maybe_idle()
        return emitted, finished

    def _maybe_idle(self) -> None:
        """Nothing left: SGLang's next round forms no batch and resets new_token_ratio (and the full mark)."""
        if (not self.running and not self.waiting and self.chunked is None and not self.inflight
                and not self.holders):
            self._set_ratio(self.init_ratio)
            self.batch_full = False
            self.unfiltered = 0

    # ---- decode-only stretches (simulator fast path) -------------------------------------------------
    def decode_stretch(self, max_steps: int) -> int:
        """How many decode steps can run with nothing else happening: no chunked prefill in progress, no prefill
        attempt due (the queue is empty or the running batch is marked full: SGLang then tries no prefill, and
        nothing during a stretch clears the mark, so neither arrivals nor the decaying new_token_ratio matter),
        no finished request still to be filtered, no finish before the last step, and free slots for every
        step (no retraction). With the overlap scheduler, also no finished request still to be processed (it
        would decode once more) nor an extra slot still to be freed. 0 means: take a normal step."""
        run = self.running
        if not run or self.chunked is not None or self.unfiltered or self.retiring or self.holders or self.cfg.spec_tokens:
            return 0
        if self.waiting and not self.batch_full:
            return 0
        k = max_steps
        for s in run:
            left = s.output - s.generated
            if left < k:
                k = left
        if k < 2:
            return 0
        k = longest_stretch(self.kv, run, k, self.kv.num_free_blocks)  # the largest k whose slots are free
        return k if k >= 2 else 0

    def advance_decodes(self, k: int, end_s: float) -> list[Seq]:
        """Apply k decode steps to every running sequence (the last ending at `end_s`): k decays of
        new_token_ratio; returns the sequences that finished at the k-th step (overlap: see `_report`). With the
        overlap scheduler, the k-th step's output is left unprocessed, as after k single steps (the earlier ones'
        processing changes nothing a decode-only stretch decides)."""
        kv = self.kv
        finished = advance_running(kv, self.running, k, end_s)
        self.ratio_steps += k
        if self.overlap:  # the k-th step's finishes are reported as complete() would (`_report`)
            return self._advance_overlap(finished)
        if finished:
            self.running = [s for s in self.running if s.generated < s.output]
            self.unfiltered += len(finished)
            for s in finished:
                kv.free(s)
        self._maybe_idle()
        return finished
