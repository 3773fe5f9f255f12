"""SGLang's overlap scheduler (v0.5.5, `event_loop_overlap` in `python/sglang/srt/managers/scheduler.py`): the
bookkeeping of its one-step lag, a mixin `SglangScheduler` (`sglang.py`, the scheduling itself) inherits.

**The overlap scheduler** (`overlap_schedule`, off by default in SglangConfig, on from the engine model as in SGLang, `event_loop_overlap`):
SGLang schedules and launches step n+1 before it processes step n's output (`process_batch_result` runs after
`run_batch` of the next batch). So each step is decided on one-step-stale state, and the output of the step before
is processed after the decision (here: at the end of `schedule`, after its first round):
- a request that sampled its last token in step n is not known finished when step n+1 is formed: it stays in
  the running batch (counted against max_running_requests, its remaining estimate 1 x new_token_ratio), keeps
  its KV, and if step n+1 decodes, it decodes once more (a wasted token, an extra KV slot). Its KV is freed once
  step n is processed, but for that extra slot (a new page only where it crosses a page boundary), freed one
  step later (`process_batch_result_decode`: "Free the one extra delayed token"); it leaves the running batch at
  the next decode round's filter, as without overlap;
- the output counts SGLang sees are one short for the requests of step n (`len(req.output_ids)`): the admission
  offset, the retraction order and the ratio set by a retraction use them;
- a retracted request of step n loses the token step n sampled for it (it is dropped when step n is processed,
  `req.is_retracted`), and its KV but the slot step n wrote is freed at once, that slot after the decision; the
  dropped token was reported emitted by complete() already, so it is not reported again when resampled;
- a finish is known only once step n is processed (`process_batch_result_decode`: `req.check_finished`): a
  request that sampled its last token in step n and is retracted when step n+1 is formed is not finished (its
  token is dropped, it samples it again after a re-prefill). So complete() of step n reports a finish only if
  step n+1 cannot retract (its decode would fit), else complete() of step n+1 does, once processed; finish_s is
  step n's end either way (SGLang streams the token then: `process_batch_result` runs right after step n+1's
  launch and waits only for step n's `copy_done`);
- check_decode_mem counts the extra decode of a request finished but not processed (it is still in the batch);
- no batch formed right after a step that ran (its output still to process) does not reset new_token_ratio:
  `self_check_during_idle` runs only when neither the last pass nor this one formed a batch.
Checked step by step against SGLang's own `event_loop_overlap` (tests/data/sglang_scheduler/overlap/). Not
modelled: SGLang's double free of a page in one corner (pages > 1, a request retracted right after its re-prefill,
whose last slot shares a page: `process_batch_result_prefill` frees that slot's page, which release_req freed).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from capacity.cost.step import StepPlan
from capacity.sched.base import NAN, QueueView, Seq, Step

if TYPE_CHECKING:
    from capacity.sched.configs import SglangConfig
    from capacity.sched.kv import KVCacheManager


@mypyc_attr(allow_interpreted_subclasses=True)  # SglangScheduler's base (its tests subclass it)
class SglangOverlap(QueueView):  # SglangScheduler's only base (same MRO as before; mypyc: one base)
    """The overlap scheduler's state and its processing of a step's output one step late (see module docstring);
    the scheduling it wraps (`_round`, check_decode_mem, the idle reset) is `SglangScheduler`'s."""

    # SglangScheduler's state, which the lag's bookkeeping reads and updates
    cfg: SglangConfig
    kv: KVCacheManager
    # waiting: a deque[Seq], declared Any by QueueView (mypyc: a subclass may not narrow an attribute's type)
    running: list[Seq]
    chunked: Seq | None
    inflight: list[Seq]
    inflight_prefill: bool
    batch_full: bool
    unfiltered: int

    # SglangScheduler's methods (real methods, not TYPE_CHECKING stubs: mypyc compiles no statement in a class body)
    def _round(self, now: float) -> Step | None:
        raise NotImplementedError

    def _decode_fits(self, seqs: list[Seq]) -> bool:
        raise NotImplementedError

    def _maybe_idle(self) -> None:
        raise NotImplementedError

    def _init_overlap(self, on: bool) -> None:
        """The lag's state, set by SglangScheduler.__init__ (`on`: SglangConfig.overlap_schedule)."""
        # the overlap scheduler's one-step lag (all empty and False without it)
        self.overlap = on
        self.pending: list[Seq] = []  # the last step's sequences whose sampled token is not processed yet
        self.retiring: list[Seq] = []  # finished in the last step, not processed yet: still running
        self.holders: list[Seq] = []  # a finished request's one extra decode slot, freed after the next decision
        self.done: list[Seq] = []  # finishes processed by the last decision, reported by the next complete()
        self.deferred = False  # the finishes in `retiring` are not reported yet (the next decision may retract them)
        self.resampled: set[Seq] = set()  # requests whose dropped token was reported emitted already
        self.dropping: list[Seq] = []  # a retracted request's slot of the last step, freed after this decision
        self.launched = False  # the last loop pass formed a batch (its output is processed in the next one)

    def _schedule_overlap(self, now: float) -> Step:
        """event_loop_overlap: each round (loop pass) decides on stale state, then the first one processes the
        output of the step before it (a later round follows a pass that formed no batch: nothing to process)."""
        for i in range(4):
            step = self._round(now)
            if i == 0:
                self._process_output(step)
            self.launched = step is not None
            if step is not None:
                return step
            if not self.waiting and self.chunked is None:
                break
        self._maybe_idle()  # nothing ran: the idle passes that follow reset the ratio
        return Step(StepPlan())

    def _process_output(self, step: Step | None) -> None:
        """process_batch_result of the last step, after this step was formed (see module docstring)."""
        kv = self.kv
        for h in self.holders:  # the extra slots of the requests that finished two steps ago
            kv.free(h)
        self.holders = []
        for h in self.dropping:
            kv.free(h)
        self.dropping = []
        for s in self.pending:
            s.inflight = 0
        self.pending = []
        if self.deferred:  # process_batch_result_decode: req.check_finished, stream_output
            self.done.extend(self.retiring)
            self.deferred = False
        if not self.retiring:
            return
        decoded = set(map(id, self.running)) if step is not None and not step.plan.prefills else ()
        page = self.cfg.page_size
        gone = set()
        for s in self.retiring:  # cache_finished_req: all but the slot of the extra decode, if one ran
            if id(s) in decoded and s.computed % page == 0:  # that slot opened a new page
                self.holders.append(self._free_but_last(s))
            else:
                kv.free(s)
            gone.add(id(s))
        self.running = [s for s in self.running if id(s) not in gone]
        self.unfiltered += len(self.retiring)
        self.retiring = []

    def _free_but_last(self, seq: Seq) -> Seq:
        """Free `seq`'s KV but its last page, kept by the returned holder until the step that wrote it is processed.
        SGLang never frees that slot early, so the holder takes back the page just freed, never a new one: the slot
        was allocated by alloc_for_decode (or the prefill) after check_decode_mem / PrefillAdder counted it."""
        kv = self.kv
        kv.free(seq)
        h = Seq(seq.req)
        if not kv.allocate_slots(h, 1):  # cannot fail: kv.free(seq) returned at least that page
            raise AssertionError("SGLang's held slot is not one of the request's")
        return h

    def _drop_inflight(self, seq: Seq) -> None:
        """Overlap: a retracted request of the last step frees its KV but the slot that step wrote, kept until the
        step is processed (release_req frees input + outputs - 1 tokens; process_batch_result frees the last one,
        a whole page where it opened one), and loses the token sampled for it."""
        seq.generated -= seq.inflight
        seq.inflight = 0
        self.resampled.add(seq)  # complete() returned it as emitted: not again when it is sampled anew
        if seq.generated > 0 and (seq.computed - 1) % self.cfg.page_size == 0:
            self.dropping.append(self._free_but_last(seq))
        else:
            self.kv.free(seq)
        if seq in self.retiring:  # its last token dropped: not finished (it samples that token again)
            assert self.deferred, "a reported finish retracted"
            self.retiring.remove(seq)
            seq.finish_s = NAN

    def _complete_overlap(self, step: Step, end_s: float) -> tuple[list[Seq], list[Seq]]:
        """complete() with the overlap scheduler: the step's output is not processed until after the next
        decision: a finished request stays running and keeps its KV (`_process_output` releases it), the one
        extra decode of a request finished before emits nothing, and nothing leaves the batch here. Finishes: see
        `_report`."""
        emitted: list[Seq] = []
        prefill = self.inflight_prefill
        was_empty = not self.running and not self.unfiltered
        shrunk = False
        pending, resampled = self.pending, self.resampled
        for seq, n in step.scheduled:
            g = seq.generated
            if g >= seq.output:  # finished in the step before: its extra decode's token is dropped
                continue
            c = seq.computed = seq.computed + n
            if c != seq.prompt + g:  # a chunk short of the prompt's end: stays the chunked request
                shrunk = True
                continue
            g = seq.generated = g + 1
            seq.inflight = 1
            pending.append(seq)
            if g == 1:
                seq.first_token_s = end_s
            seq.last_token_s = end_s
            if resampled and seq in resampled:  # the token a retraction dropped (counted when first sampled)
                resampled.discard(seq)
            else:
                emitted.append(seq)
            if g >= seq.output:  # finish_s: when SGLang streams the token (process_batch_result, run after the
                self.retiring.append(seq)  # next batch's launch, waits for this step's copy_done only)
                seq.finish_s = end_s
            if prefill:
                self.running.append(seq)  # merge_batch: unprocessed, a finished request joins as well
        if prefill:
            self.inflight = []
            self.inflight_prefill = False
            if shrunk or was_empty:
                self.batch_full = False
        finished = self._report(self.done)
        self._maybe_idle()
        return emitted, finished

    def _report(self, done: list[Seq]) -> list[Seq]:
        """The finishes to report now: those the last decision processed (`done`, deferred), and the requests that
        sampled their last token in the step just applied (`retiring`) if the next decision cannot retract them:
        it retracts only in a decode round whose check_decode_mem fails, on the KV state of now (nothing frees
        or takes KV before it: a prefill formed first means no retraction). Else they are reported once processed
        (`_process_output`), or never if retracted (SGLang then drops the token: `req.is_retracted`)."""
        self.done = []
        if self.retiring and not self.deferred:
            if self._decode_fits(self.running):
                return done + self.retiring
            self.deferred = True
        return done

    def _advance_overlap(self, finished: list[Seq]) -> list[Seq]:
        """advance_decodes' end with the overlap scheduler: the k-th step's output is left unprocessed, as after k
        single steps; `finished` (the k-th step's finishes) are reported as complete() would (`_report`)."""
        kv = self.kv
        for h in self.dropping:
            kv.free(h)
        self.dropping = []
        for s in self.running:
            s.inflight = 1
        self.pending = list(self.running)
        self.retiring = finished
        self.launched = True
        return self._report(self.done)
