"""Running many simulations: executors (serial, local process pool, Ray) behind one `run(tasks)` call, a disk
cache keyed by each task's hash (re-runs, the dashboard and exports are instant; a stopped sweep resumes), and
a progress bar with ETA on stderr.

Tasks are `capacity.plan.tasks.SimTask` (plain data) and results `TaskResult` (typed); the cache holds the
result's JSON form, and an entry that does not read back as a result is recomputed, never trusted.
Ray is imported only by `RayExecutor` (`pip install 'capacity[ray]'`); `--ray` starts a local Ray,
`--ray-address` joins a cluster. A failed task is an error for the whole run, never a silently missing point.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from capacity.errors import CapacityError, ConfigError
from capacity.plan.progress import Phases
from capacity.plan.tasks import SimTask, TaskResult, run_task

CACHE_ENV = "CAPACITY_CACHE_DIR"
MEMO = 4096  # results an executor keeps by key (about 1 kB each)
MISS, HIT, AHEAD = 0, 1, 2  # how a kept result counts when asked for (AHEAD: run ahead, not asked for yet)


def cache_dir() -> Path | None:
    v = os.environ.get(CACHE_ENV, str(Path.home() / ".cache" / "capacity"))
    return None if v in ("", "0", "off") else Path(v)


class Executor:
    """Base: cache lookups, progress, and a `_map` the subclasses implement."""

    def __init__(self, progress: bool = False, cache: Path | None | bool = True) -> None:
        self.progress = progress
        self.cache = cache_dir() if cache is True else (cache or None)
        self.hits = self.misses = 0
        self.on_task = None  # called with the number of tasks done so far (a dashboard's progress bar)

        self.phases = Phases(enabled=progress)  # the planner names its phases; piped, a line as each ends
        # key -> (result, how the next ask counts: HIT/MISS/AHEAD, how asks after it count: HIT/MISS)
        self._memo: dict[str, tuple[TaskResult, int, int]] = {}
        self._ahead: list[SimTask] = []

    def _get(self, key: str) -> TaskResult | None:
        if self.cache is None:
            return None
        p = self.cache / f"{key}.json"
        try:
            if not p.is_file() or p.stat().st_size > 16 << 20:
                return None
            return TaskResult.from_json(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
            # a torn write from a killed run, a corrupt file, an entry of another version: drop it, recompute
            try:
                p.unlink()
            except OSError:
                pass
            return None

    def _put(self, key: str, value: TaskResult) -> bool:
        """Write the result to the disk cache; whether it is there now."""
        if self.cache is None:
            return False
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
            tmp = self.cache / f"{key}.json.tmp{os.getpid()}"
            tmp.write_text(json.dumps(value.to_json(), default=float))
            tmp.replace(self.cache / f"{key}.json")
            return True
        except OSError:
            return False  # the cache is an optimisation: an unwritable or full cache directory costs only speed

    def run(self, tasks: list[SimTask]) -> list[TaskResult]:
        """Results in task order; identical tasks (same key) run once, cached ones not at all. A task this executor
        already ran (an earlier batch, or one queued by `ahead`) is not run again: a simulation is deterministic in
        its task. `hits` and `misses` count the tasks asked for as if each batch ran alone, looking in the disk
        cache (a plan's `simulations` and `cache_hits` do not depend on what ran ahead or was kept)."""
        keys = [t.key() for t in tasks]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        got: dict[str, TaskResult] = {}
        hit = 0
        for k in first:
            m = self._memo.get(k)
            if m is not None:
                got[k] = m[0]
                hit += m[1] == HIT
                if m[1] == AHEAD:  # asked for the first time: counted as run now; later, as the disk cache says
                    self._memo[k] = (m[0], m[2], m[2])
            else:
                v = self._get(k)
                if v is not None:
                    got[k] = v
                    self._remember(k, v, HIT, HIT)
                    hit += 1
        todo = [i for k, i in first.items() if k not in got]
        self.hits += hit
        done = self.hits + self.misses
        self.misses += len(first) - hit
        self.phases.count(len(first) - hit)
        if self.on_task:
            self.on_task(done)
        done += len(got) - hit  # run by this executor before: counted as run now
        # tasks queued by `ahead` go with this batch (unless cached or run already): one round on the pool, not two
        ahead, self._ahead = self._ahead, []
        extra: dict[str, SimTask] = {}
        for t in ahead:
            k = t.key()
            if k in first or k in self._memo or k in extra:
                continue
            v = self._get(k)
            if v is not None:
                self._remember(k, v, HIT, HIT)
            else:
                extra[k] = t
        if todo or extra:
            bkeys = [keys[i] for i in todo] + list(extra)
            batch = [tasks[i] for i in todo] + list(extra.values())
            for j, res in self._map(batch, list(range(len(batch)))):
                stored = HIT if self._put(bkeys[j], res) else MISS  # what a later lookup would find
                if j < len(todo):
                    got[bkeys[j]] = res
                    self._remember(bkeys[j], res, stored, stored)
                    done += 1
                    if self.on_task:
                        self.on_task(done)
                else:
                    self._remember(bkeys[j], res, AHEAD, stored)
        return [got[k] for k in keys]

    def ahead(self, tasks: list[SimTask]) -> None:
        """Tasks a later step will ask for whatever the next batch's results are: they run with the next batch
        (in its round on the pool), and the later `run` finds them done. Meant for tasks that will be asked for
        (a speculative one costs its CPU when it is not)."""
        self._ahead += tasks

    def _remember(self, key: str, value: TaskResult, now: int, later: int) -> None:
        self._memo[key] = (value, now, later)
        while len(self._memo) > MEMO:  # the oldest first: a plan asks again for what it ran a few batches ago
            del self._memo[next(iter(self._memo))]

    def _map(self, tasks: list[SimTask], idx: list[int]) -> Iterable[tuple[int, TaskResult]]:
        raise NotImplementedError

    def prestart(self) -> None:
        """Get ready for simulations soon to come (the pool starts its workers); nothing to do here."""

    def close(self) -> None:
        self.phases.end()


def _bar(total: int, enabled: bool, label: str = "simulating"):
    from contextlib import nullcontext

    if not enabled or total < 2:
        return nullcontext(None)
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:  # piped or redirected: a progress bar would only leave blank lines behind
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn(label, markup=False), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), transient=True, console=console)


class SerialExecutor(Executor):
    def _map(self, tasks, idx):
        with _bar(len(tasks), self.progress, self.phases.label) as bar:
            t = bar.add_task("", total=len(tasks)) if bar else None
            for i, task in zip(idx, tasks):
                yield i, run_task(task)
                if bar:
                    bar.advance(t)


def _worker_init() -> None:
    """Pool workers never outlive the command: Ctrl-C is the parent's to handle, SIGTERM ends a worker at once,
    and on Linux a worker is told (PR_SET_PDEATHSIG) to end when its parent dies, even by SIGTERM or SIGKILL."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)
    except (OSError, AttributeError):  # not Linux: the pool's own shutdown is all there is
        pass


def _warm_worker_init() -> None:
    """`_worker_init`, then the imports a simulation needs beyond this module's own (which bring the run
    pipeline): scipy.special's t distribution, so that a worker started early pays it while the parent is still
    busy."""
    _worker_init()
    try:
        import scipy.special  # noqa: F401
    except ImportError:  # the first task will say what is missing
        pass


def _noop() -> None:
    return None


def worker_pool(workers: int, warm: bool = False):
    """The one way this tool starts a process pool (the sweep's, the planner's, fleet-day's): workers that die
    with the command (see _worker_init). End it with `stop_pool` on an error or Ctrl-C, not a `with` block,
    which would wait for the running tasks. `warm`: the workers start now and import what a simulation needs
    while the caller goes on (`_warm_worker_init`)."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, initializer=_warm_worker_init if warm else _worker_init)
    if warm:
        pool.submit(_noop)  # a pool starts its workers at the first submission (all of them, under fork)
    return pool


def by_size(tasks: list[SimTask], idx: list[int]) -> list[tuple[int, SimTask]]:
    """The tasks largest first (requests x replicas, the longest simulations: a frontier's closed loops of
    a thousand users), so that the last task to finish is a short one and no core idles through a long tail.
    The order tasks run in changes no result: each is its own seeded simulation, returned by index."""
    def size(t: SimTask) -> int:
        return int(t.workload.get("num_requests") or 0) * max(1, t.replicas)

    return sorted(zip(idx, tasks), key=lambda it: -size(it[1]))  # stable: equal sizes keep their order


def stop_pool(pool, wait: bool = False) -> None:
    """Shut a pool down; unless `wait`, cancel the queued tasks and end the running ones now, so that no worker
    outlives the command (a shut-down pool otherwise lets each running task finish)."""
    if wait:
        pool.shutdown(wait=True)
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())  # CPython's: the one handle on the workers
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        try:
            proc.terminate()
        except (OSError, AttributeError, ValueError):  # already gone
            pass
    for proc in procs:
        try:
            proc.join(5)
        except (OSError, AttributeError, ValueError, AssertionError):
            pass


class PoolExecutor(Executor):
    """A local process pool (the default): one simulation per core; workers end with the command."""

    def __init__(self, workers: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.workers = workers or os.cpu_count() or 1
        self._pool = None
        self._used = False  # whether a task went to the pool (a prestarted pool may have run none: cached)

    def _map(self, tasks, idx):
        from concurrent.futures import as_completed

        if len(tasks) == 1 or self.workers == 1:
            yield from SerialExecutor(progress=False, cache=False)._map(tasks, idx)
            return
        if self._pool is None:
            self._pool = worker_pool(self.workers)
        self._used = True
        futs: dict = {}
        try:
            with _bar(len(tasks), self.progress, self.phases.label) as bar:
                t = bar.add_task("", total=len(tasks)) if bar else None
                futs = {self._pool.submit(run_task, task): i for i, task in by_size(tasks, idx)}
                for f in as_completed(futs):
                    yield futs[f], f.result()  # re-raises the task's own error
                    if bar:
                        bar.advance(t)
        except BaseException:  # an error, Ctrl-C or a closed generator: stop the queued work, do not wait for it
            for f in futs:
                f.cancel()
            self.close(wait=False)
            raise

    def prestart(self) -> None:
        """Start the workers now, importing what a simulation needs while the caller sets up its first tasks
        (a plan's budgets, its first capacity loop, which runs here): the pool's start-up, a second or more of
        CPU per worker, is then off the plan's critical path."""
        if self._pool is None and self.workers > 1:
            self._pool = worker_pool(self.workers, warm=True)

    def close(self, wait: bool = True) -> None:
        self.phases.end()
        if self._pool is not None:
            stop_pool(self._pool, wait and self._used)  # workers that never got a task: end them, do not wait
            self._pool = None


class RayExecutor(Executor):
    """Ray tasks: `address=None` starts a local Ray; "auto" or ray://host:port joins a cluster."""

    def __init__(self, address: str | None = None, **kw) -> None:
        super().__init__(**kw)
        try:
            import ray
        except ImportError:
            raise CapacityError("Ray is not installed: pip install 'capacity[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        self._ray = ray
        self._remote = ray.remote(run_task)

    def _map(self, tasks, idx):
        refs = {self._remote.remote(task): i for i, task in zip(idx, tasks)}
        pending = list(refs)
        with _bar(len(tasks), self.progress, self.phases.label) as bar:
            t = bar.add_task("", total=len(tasks)) if bar else None
            while pending:
                done, pending = self._ray.wait(pending, num_returns=1)
                for r in done:
                    yield refs[r], self._ray.get(r)
                    if bar:
                        bar.advance(t)


def make_executor(kind: str = "pool", *, ray_address: str | None = None, progress: bool = True,
                  cache: bool = True, workers: int | None = None) -> Executor:
    if kind == "serial":
        return SerialExecutor(progress=progress, cache=cache)
    if kind == "pool":
        return PoolExecutor(workers, progress=progress, cache=cache)
    if kind == "ray":
        return RayExecutor(ray_address, progress=progress, cache=cache)
    raise ConfigError(f"executor {kind!r}: use serial, pool or ray")
