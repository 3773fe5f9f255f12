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
