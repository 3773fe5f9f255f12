"""Running many simulations: executors (serial, local process pool, Ray) behind one `run(tasks)` call, a
disk cache keyed by each task's hash (re-runs, the dashboard and exports are instant; a stopped sweep
resumes), a progress bar with ETA, and `capacity sweep` grids over scenario fields.

Ray is imported only by `RayExecutor` (`pip install 'capacity[ray]'`); `--ray` starts a local Ray,
`--ray-address` joins a cluster. A failed task is an error for the whole run, never a silently missing point.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any, Iterable

from capacity.errors import CapacityError, ConfigError

CACHE_ENV = "CAPACITY_CACHE_DIR"


def cache_dir() -> Path | None:
    v = os.environ.get(CACHE_ENV, str(Path.home() / ".cache" / "capacity"))
    return None if v in ("", "0", "off") else Path(v)


class Executor:
    """Base: cache lookups, progress, and a `_map` the subclasses implement."""

    def __init__(self, progress: bool = False, cache: Path | None | bool = True) -> None:
        self.progress = progress
        self.cache = cache_dir() if cache is True else (cache or None)
        self.hits = self.misses = 0

    def _get(self, key: str):
        if self.cache is None:
            return None
        p = self.cache / f"{key}.json"
        if p.is_file():
            try:
                return json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                return None  # a torn write from a killed run: recompute
        return None

    def _put(self, key: str, value: dict) -> None:
        if self.cache is None:
            return
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = self.cache / f"{key}.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(value, default=float))
        tmp.replace(self.cache / f"{key}.json")

    def run(self, tasks: list) -> list[dict]:
        keys = [t.key() for t in tasks]
        out: list[dict | None] = [self._get(k) for k in keys]
        todo = [i for i, v in enumerate(out) if v is None]
        self.hits += len(tasks) - len(todo)
        self.misses += len(todo)
        if todo:
            for i, res in self._map([tasks[i] for i in todo], todo):
                out[i] = res
                self._put(keys[i], res)
        return out  # type: ignore[return-value]

    def _map(self, tasks: list, idx: list[int]) -> Iterable[tuple[int, dict]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _bar(total: int, enabled: bool):
    from contextlib import nullcontext

    if not enabled or total < 2:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), transient=True)


class SerialExecutor(Executor):
    def _map(self, tasks, idx):
        from capacity.planner import run_task

        with _bar(len(tasks), self.progress) as bar:
            t = bar.add_task("", total=len(tasks)) if bar else None
            for i, task in zip(idx, tasks):
                yield i, run_task(task)
                if bar:
                    bar.advance(t)


class PoolExecutor(Executor):
    """A local process pool (the default): one simulation per core."""

    def __init__(self, workers: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.workers = workers or os.cpu_count() or 1
        self._pool = None

    def _map(self, tasks, idx):
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from capacity.planner import run_task

        if len(tasks) == 1 or self.workers == 1:
            yield from SerialExecutor(progress=False, cache=False)._map(tasks, idx)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers)
        with _bar(len(tasks), self.progress) as bar:
            t = bar.add_task("", total=len(tasks)) if bar else None
            futs = {self._pool.submit(run_task, task): i for i, task in zip(idx, tasks)}
            for f in as_completed(futs):
                yield futs[f], f.result()  # re-raises the task's own error
                if bar:
                    bar.advance(t)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
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
        from capacity.planner import run_task

        self._ray = ray
        self._remote = ray.remote(run_task)

    def _map(self, tasks, idx):
        refs = {self._remote.remote(task): i for i, task in zip(idx, tasks)}
        pending = list(refs)
        with _bar(len(tasks), self.progress) as bar:
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


# ---- sweeps -------------------------------------------------------------------------------------------
def parse_axis(spec: str) -> tuple[str, list[Any]]:
    """'workload.input_len.value=512,1024,2048' -> ('workload.input_len.value', [512, 1024, 2048])."""
    if "=" not in spec:
        raise ConfigError(f"--vary {spec!r}: expected FIELD=V1,V2,... (e.g. engine.max_num_seqs=64,128)")
    name, vals = spec.split("=", 1)
    out: list[Any] = []
    for v in vals.split(","):
        v = v.strip()
        if not v:
            raise ConfigError(f"--vary {spec!r}: empty value")
        try:
            out.append(json.loads(v))
        except json.JSONDecodeError:
            out.append(v)
    return name.strip(), out


def set_path(data: dict, path: str, value: Any) -> dict:
    """A copy of `data` with the dotted field set (creating mappings on the way)."""
    import copy

    d = copy.deepcopy(data)
    cur = d
    parts = path.split(".")
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--vary {path}: {p} is not a mapping")
        cur = nxt
    cur[parts[-1]] = value
    return d


def grid(base: dict, axes: list[tuple[str, list[Any]]]) -> list[tuple[dict[str, Any], dict]]:
    if not axes:
        raise ConfigError("the sweep grid is empty: give at least one --vary FIELD=V1,V2")
    points = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        d = base
        point = {}
        for (name, _), v in zip(axes, combo):
            d = set_path(d, name, v)
            point[name] = v
        points.append((point, d))
    return points
