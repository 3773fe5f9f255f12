"""Batching policies behind one protocol (`capacity.sched.base.Scheduler`) and one factory.

`make_scheduler(policy, **limits)`: continuous (vLLM v1, FCFS), priority (vLLM v1 with
`--scheduling-policy priority`), sjf (continuous batching serving the shortest prompt first: a what-if, not a
vLLM policy) and static (the classic collect-a-batch server). A new policy is a request queue in
`queues.py` (and a name here) or, for a different batching mechanism, a module beside `continuous.py`.
`make_scheduler("sglang", **SglangConfig fields)` is SGLang's scheduler (`sglang.py`): an engine model picks it,
it is not one of the `policy` values.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.sched.base import Scheduler, Seq, Step
from capacity.sched.continuous import ContinuousConfig, ContinuousScheduler
from capacity.sched.sglang import SglangConfig, SglangScheduler
from capacity.sched.static import StaticConfig, StaticScheduler

POLICIES = ("continuous", "priority", "sjf", "static")
_QUEUE = {"continuous": "fcfs", "priority": "priority", "sjf": "sjf"}

__all__ = ["POLICIES", "ContinuousConfig", "ContinuousScheduler", "Scheduler", "Seq", "SglangConfig",
           "SglangScheduler", "StaticConfig", "StaticScheduler", "Step", "make_scheduler"]


def make_scheduler(policy: str, **kw) -> ContinuousScheduler | StaticScheduler | SglangScheduler:
    """One factory for the policies (see module docstring); `kw` are the policy's config fields."""
    if policy == "sglang":
        return SglangScheduler(SglangConfig(**kw))
    if policy in _QUEUE:
        return ContinuousScheduler(ContinuousConfig(queue=_QUEUE[policy], **kw))
    if policy == "static":
        return StaticScheduler(StaticConfig(**kw))
    raise ConfigError(f"policy {policy!r}: use {', '.join(POLICIES)}")
