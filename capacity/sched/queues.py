"""Request queues: which waiting sequence is served next and which running one is preempted first, one class
per policy, as vLLM v1's `RequestQueue`s. FCFS is a deque; priority and shortest-prompt-first are heaps.

- FCFS: arrival order; a preempted sequence goes back to the front; the victim is the last admitted.
- Priority: (priority, arrival) with lower served first (vLLM's convention); the victim is the least
  important, then the newest, as vLLM v1's priority preemption.
- Shortest prompt first: (prompt tokens, arrival): what an engine can know at arrival (the output length
  is unknown to it); the victim is the longest prompt, then the newest.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from capacity.errors import ConfigError

if TYPE_CHECKING:
    from capacity.sched.seq import Seq


class FCFSQueue:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Seq] = deque()

    def add(self, seq: Seq) -> None:
        self._q.append(seq)

    def prepend(self, seq: Seq) -> None:
        self._q.appendleft(seq)

    def peek(self) -> Seq:
        return self._q[0]

    def pop(self) -> Seq:
        return self._q.popleft()

    def victim(self, running: list[Seq]) -> Seq:
        return running[-1]

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Seq]:
        return iter(self._q)


class _HeapQueue:
    """A heap ordered by `key(seq)`, ties broken by request id (arrival order for generated workloads)."""

    __slots__ = ("_h",)

    @staticmethod
    def key(seq: Seq) -> tuple:
        raise NotImplementedError

    def __init__(self) -> None:
        self._h: list[tuple] = []

    def add(self, seq: Seq) -> None:
        heapq.heappush(self._h, (*self.key(seq), seq.req.id, seq))

    def prepend(self, seq: Seq) -> None:  # a preempted sequence takes its place by key, as in vLLM's priority queue
        self.add(seq)  # (a method, not `prepend = add`: mypyc makes a class-body alias an instance attribute)

    def peek(self) -> Seq:
        return self._h[0][-1]

    def pop(self) -> Seq:
        return heapq.heappop(self._h)[-1]

    def victim(self, running: list[Seq]) -> Seq:
        return max(running, key=self.key)

    def __len__(self) -> int:
        return len(self._h)

    def __bool__(self) -> bool:
        return bool(self._h)

    def __iter__(self) -> Iterator[Seq]:
        return (e[-1] for e in sorted(self._h))


class PriorityQueue(_HeapQueue):
    __slots__ = ()

    @staticmethod
    def key(seq: Seq) -> tuple:
        return (seq.req.priority, seq.req.arrival_s)


class ShortestPromptFirstQueue(_HeapQueue):
    __slots__ = ()

    @staticmethod
    def key(seq: Seq) -> tuple:
        return (seq.req.prompt_tokens, seq.req.arrival_s)


QUEUES: dict[str, type[FCFSQueue] | type[_HeapQueue]] = {
    "fcfs": FCFSQueue, "priority": PriorityQueue, "sjf": ShortestPromptFirstQueue}


def make_queue(kind: str) -> FCFSQueue | _HeapQueue:
    try:
        return QUEUES[kind]()
    except KeyError:
        raise ConfigError(f"queue {kind!r}: use {', '.join(QUEUES)}") from None
