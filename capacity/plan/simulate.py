"""One simulated deployment, computed for the surface: what `capacity simulate` prints (as JSON, CSV, Markdown or
tables), run through the one run pipeline (capacity.pipeline.run). The command translates its flags into the
deployment and workload and renders what `simulation_report` returns."""
from __future__ import annotations

from typing import Any

from capacity.engine.offload import Offloading
from capacity.engine.vllm.config import VllmConfig
from capacity.errors import CapacityError
from capacity.pipeline import Deployment, Disagg, RunOptions, RunResult, disagg_report, prepare, run
from capacity.workload import WorkloadSpec


def simulation_report(dep: Deployment, spec: WorkloadSpec, opts: RunOptions,
                      disagg: Disagg | None = None) -> tuple[RunResult, dict[str, Any]]:
    """The run and its JSON form: the pipeline's result (`RunResult.as_dict`) with the model, GPU, TP, replicas
    (both pools' with `disagg`) and requests; `kv_offload` (the CPU tier's counters) when the engine offloads KV,
    `disaggregated` (capacity.pipeline.disagg_report) for a prefill pool (`dep`) beside a decode pool."""
    prep = None
    if isinstance(dep.engine, VllmConfig) and dep.engine.kv_offloading_size is not None:  # prepared here, so that its tier's counters can be read after
        if disagg is not None:
            raise CapacityError("--kv-offload-gb: not modelled with --disagg")
        prep = prepare(dep)
    res = run(dep, spec, opts, prepared=prep, disagg=disagg)
    out = res.as_dict()
    out.update(model=dep.card.name, gpu=dep.gpu.name, tp=dep.engine.tensor_parallel_size, replicas=dep.replicas,
               requests=spec.num_requests)
    if prep is not None and isinstance(prep.make_scheduler, Offloading):
        out["kv_offload"] = prep.make_scheduler.report(dep.replicas)
    if disagg is not None:
        out["replicas"] = dep.replicas + disagg.decode.replicas
        out["disaggregated"] = disagg_report(res, dep, disagg)
    return res, out
