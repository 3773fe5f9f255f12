"""`capacity sweep` grids: any scenario field (a dotted path) over a list of values, as scenario variants."""
from __future__ import annotations

import itertools
import json
from typing import Any

from capacity.errors import ConfigError


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


# Scenario fields a sweep does not vary, and why: each would be replaced or unused, giving rows that look varied
# and are not (issue 49).
NOT_SWEPT: dict[str, str] = {
    "workload.num_requests": "a sweep point's requests are --requests",
    "workload.arrivals.rate_per_s": "a sweep's rate is --rate or target_rate_per_s (vary target_rate_per_s)",
    "headroom": "a plan's field: a sweep's rows do not depend on it",
    "price_per_gpu_hour": "a plan's field: a sweep's rows do not depend on it",
    "max_gpus": "a plan's field: a sweep's rows do not depend on it",
    "search": "the planner's search settings: a sweep's rows do not depend on them",
    "slo": "a plan's objectives: a sweep's rows report latencies, not a verdict",
}
# a sweep simulates open-loop arrivals at one rate (as the planner does): of workload.arrivals only these vary
ARRIVAL_FIELDS = ("kind", "cv")
OPEN_LOOP = ("poisson", "gamma", "constant")


def check_axes(axes: list[tuple[str, list[Any]]], rate_given: bool) -> None:
    """ConfigError for an axis the sweep would not apply, or a field given twice (the later would win)."""
    names = [n for n, _ in axes]
    for i, name in enumerate(names):
        for other in names[:i]:
            if other == name:
                raise ConfigError(f"--vary {name}: given twice; give all its values once ({name}=V1,V2,...)")
            if name.startswith(other + ".") or other.startswith(name + "."):
                raise ConfigError(f"--vary {name}: overlaps --vary {other}; vary one of them")
        for field, why in NOT_SWEPT.items():
            if name == field or name.startswith(field + "."):
                raise ConfigError(f"--vary {name}: not swept: {why}")
        if name == "target_rate_per_s" and rate_given:
            raise ConfigError("--vary target_rate_per_s: --rate fixes every point's rate; leave one of them out")
        if name in ("workload", "workload.arrivals"):
            raise ConfigError(f"--vary {name}: vary its fields (e.g. workload.arrivals.cv=0.5,2)")
        if name.startswith("workload.arrivals."):
            field = name[len("workload.arrivals."):]
            if field not in ARRIVAL_FIELDS:
                raise ConfigError(f"--vary {name}: not swept: a sweep runs open-loop arrivals at one rate; of "
                                  f"workload.arrivals it varies {', '.join(ARRIVAL_FIELDS)}")
            if field == "kind":
                for v in axes[i][1]:
                    if v not in OPEN_LOOP:
                        raise ConfigError(f"--vary {name}: {str(v)[:80]!r}: a sweep runs open-loop arrivals at one "
                                          f"rate: {', '.join(OPEN_LOOP)}")


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
