"""Async scheduling's input lag: what reaches an engine while a step runs waits for the schedule call after next.

Read in vLLM 0.32's engine core (`vllm/v1/engine/core.py`, `step_with_batch_queue`, a queue of two batches),
TensorRT-LLM's overlap executor (`_executor_loop_overlap`) and SGLang's `event_loop_overlap`. Each schedules step
n + 1 as soon as step n - 1's output is processed, while step n runs, and takes its input only between schedule
calls. So the call the simulator makes when step n ends (for step n + 1) stands for one the engine made when
step n began: it sees what came before then, the simulator's previous call. What comes during step n counts from
step n + 2 at the earliest, a step later than a synchronous engine. What comes at the very end of a step (a
closed-loop user answering its last token) counts as later than that step's output processing, since the reply
must travel first. An engine with nothing to run takes its input at once.

The input is of four kinds, each held the same way:

- `new`: a request from the router (the engine core's input queue);
- `resume`: a finished prefill handed to a decode replica (disaggregated serving: the proxy sends it on);
- `loaded`: a decode replica's KV read is done. vLLM's scheduler learns it from a step's output
  (`finished_recving`, read by `update_from_output`; `_update_waiting_for_remote_kv` promotes the request at the
  next schedule call), so with async scheduling the call already made for the next step does not see it;
- `released`: a prefill replica's KV was read, so its blocks are free (`finished_sending`, the same path).

`capacity.sim.entities.Replica` holds them here and applies them (`Replica._take_lagged`).
"""
from __future__ import annotations

from typing import Any

COUNTED = ("new", "resume")  # kinds that are requests the replica holds (its outstanding count, its queue)
SCHED_CALL = {"resume": "resume", "loaded": "loaded", "released": "release"}  # the scheduler's method for each


class InputLag:
    """The input an engine has not taken yet, in arrival order: (kind, the request or sequence, when it came)."""

    def __init__(self) -> None:
        self.held: list[tuple[str, Any, float]] = []
        self.requests = 0  # held entries that are requests (`COUNTED`)

    def __bool__(self) -> bool:
        return bool(self.held)

    def hold(self, kind: str, obj: Any, t: float) -> None:
        self.held.append((kind, obj, t))
        if kind in COUNTED:
            self.requests += 1

    def take(self, before_s: float) -> list[tuple[str, Any]]:
        """What came before `before_s` (the schedule call that takes it), in order; the rest stays held."""
        due, keep = [], []
        for kind, obj, t in self.held:
            if t < before_s:
                due.append((kind, obj))
                if kind in COUNTED:
                    self.requests -= 1
            else:
                keep.append((kind, obj, t))
        self.held = keep
        return due
