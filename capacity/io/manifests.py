"""Manifests that deploy a plan's recommendation (`capacity plan ... --emit TARGET DIR`): the model server with
the arguments of the launch command the plan prints (split as a shell would, nothing re-derived), its GPUs (TP x
PP x DP), the replicas, and an autoscaler on the metric and target of one of the autoscale simulation's policies
(capacity.sim.autoscale), read from the engine's own Prometheus metrics.

Targets, each from its project's own source (read where cited, not guessed):
- `k8s`: a Deployment, a Service and an autoscaling/v2 HorizontalPodAutoscaler on an External metric, with the
  prometheus-adapter rule (Helm values, `rules.external`) that serves that metric from Prometheus;
- `kserve`: a serving.kserve.io/v1beta1 InferenceService (custom predictor container, RawDeployment, KEDA
  autoscaler class: `autoScaling.metrics` External/prometheus, which KServe turns into a KEDA trigger whose
  `threshold` is `target.value`: pkg/controller/v1beta1/inferenceservice/reconcilers/keda/keda_reconciler.go);
- `production-stack`: vLLM production-stack's Helm values (helm/values.yaml, servingEngineSpec.modelSpec[] with
  its `keda` block, rendered by helm/templates/deployment-vllm-multi.yaml and scaledobject-vllm.yaml); vLLM only;
- `llm-d`: llm-d-modelservice's Helm values (charts/llm-d-modelservice/values.yaml: modelArtifacts, decode with
  modelCommand vllmServe, prefill off), with the same HPA and adapter rule as `k8s` on the chart's `NAME-decode`
  Deployment (the chart makes no autoscaler; decode.autoscaling.enabled leaves it the replica count); vLLM only.

The autoscaler's rule is the simulation's, as an HPA computes it (desired = ceil(metric / per-replica target),
AverageValue; KEDA's prometheus trigger defaults to AverageValue): `concurrency` sums running + waiting requests
(ceil(in flight / target)), `kv` sums the KV-cache share in use (ceil(used / target)), `queue` is
ready + waiting / (target x ready) against 1 (ready + ceil(waiting / (target x ready))). Each metric is averaged
over the simulation's 60 s window (avg_over_time), the controller polls every 15 s, and scales down after 300 s
(the HPA's scale-down stabilization window). `predictive` reads a forecast no cluster metric carries: not emitted.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity.errors import ConfigError
from capacity.files import write_atomic

TARGETS = ("k8s", "kserve", "production-stack", "llm-d")
POLICIES = ("concurrency", "queue", "kv")
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"  # prometheus-operator's service (production-stack's default)
WINDOW_S, INTERVAL_S, COOLDOWN_S = 60, 15, 300  # AutoscaleConfig's defaults: metric window, period, scale-down wait
KV_TARGET = 0.8  # the kv policy's default share of the cache (capacity.sim.autoscale)

# The engines' Prometheus gauges (running, waiting, KV share in use, a 0-1 fraction), labelled model_name:
# - vLLM: vllm/v1/metrics/loggers.py (and vllm/engine/metrics.py for the V0 engine). `vllm:kv_cache_usage_perc`
#   replaced `vllm:gpu_cache_usage_perc` (vllm-project/vllm PR #18354, mid-2025, kept both for a deprecation
#   period; the old name is hidden by default from 0.11): the old name below 0.10, the new one from 0.10.
# - SGLang: python/sglang/srt/metrics/collector.py (`sglang:token_usage` = used / total KV tokens).
_METRICS = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
            "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")}
_IMAGES = {"vllm": "vllm/vllm-openai:v{v}", "sglang": "lmsysorg/sglang:v{v}"}  # the release the plan modelled
_PORTS = {"vllm": 8000, "sglang": 30000}  # the servers' default ports
# Flags a deployment adds that the plan's command leaves to the engine's defaults (where it listens, the name it
# serves under): everything else in the emitted arguments is the printed command's.
DEPLOY_FLAGS = ("--host", "--port", "--served-model-name")


@dataclass(frozen=True)
class Server:
    """The model server of the printed launch command: program, arguments (model first for vLLM), environment."""
    engine: str  # vllm | sglang
    version: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    model: str
    tp: int
    gpus: int  # per replica: TP x PP x DP
    port: int

    @property
    def image(self) -> str:
        return _IMAGES[self.engine].format(v=self.version)

    @property
    def metrics(self) -> tuple[str, str, str]:
        running, waiting, kv = _METRICS[self.engine]
        if self.engine == "vllm" and _version(self.version) < (0, 10):
            kv = "vllm:gpu_cache_usage_perc"
        return running, waiting, kv

    @property
    def selector(self) -> str:
        return f'{{model_name="{self.model}"}}'  # both engines label their gauges with the served model's name

    def flags(self) -> list[str]:
        """The arguments after the model (vLLM names it first; SGLang as --model-path)."""
        return self.args[1:] if self.engine == "vllm" else list(self.args)


@dataclass(frozen=True)
class Autoscale:
    policy: str
    target: float  # concurrency: requests per replica; queue: waiting per ready replica; kv: cache share
    min_replicas: int
    max_replicas: int
    why: str = ""  # where the default target comes from

    def query(self, server: Server) -> tuple[str, float]:
        """The PromQL over the whole pool and the per-replica threshold an AverageValue rule divides it by."""
        running, waiting, kv = server.metrics
        sel = server.selector
        avg = lambda m: f"sum(avg_over_time({m}{sel}[{WINDOW_S}s]))"
        if self.policy == "concurrency":
            return f"{avg(running)} + {avg(waiting)}", self.target
        if self.policy == "kv":
            return avg(kv), self.target
        ready = f"count({waiting}{sel})"
        return f"{ready} + {avg(waiting)} / ({_num(self.target)} * {ready})", 1.0


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _num(x: float) -> str:
    return f"{x:.6g}"


def check_request(target: str, folder: str) -> Path:
    """Before the plan's simulations: a known target and a folder (made if missing) that is not a file."""
    if target not in TARGETS:
        raise ConfigError(f"--emit {target!r}: use one of {', '.join(TARGETS)}")
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--emit {target} {folder}: is a file, not a folder")
    if not p.exists() and not p.parent.is_dir():
        raise ConfigError(f"--emit {target} {folder}: the folder {p.parent} does not exist")
    return p


def parse_autoscale(spec: str | None) -> tuple[str, float | None]:
    """`concurrency`, `queue=4`, `kv=0.8` -> (policy, target or None for the default)."""
    policy, _, val = (spec or "concurrency").partition("=")
    if policy not in POLICIES:
        raise ConfigError(f"--emit-autoscale {spec!r}: use {', '.join(POLICIES)}, optionally =TARGET (e.g. queue=4)")
    if not val:
        return policy, None
    try:
        target = float(val)
    except ValueError:
        target = math.nan
    if not (math.isfinite(target) and target > 0) or (policy == "kv" and target > 1):
        raise ConfigError(f"--emit-autoscale {spec!r}: the target must be a number > 0"
                          + (" and <= 1 (a share of the cache)" if policy == "kv" else ""))
    return policy, target


def server_of(plan) -> Server:
    """The printed launch command (`plan.vllm_command`: the planned engine's own) as a container's command."""
    text = plan.vllm_command
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    words = shlex.split(lines[-1])
    placeholder = next((w for w in words if w.startswith("<")), None)
    if placeholder:
        raise ConfigError(f"--emit: the launch command names a placeholder model {placeholder}: no published "
                          "checkpoint of the plan's weight format is known (the plan's note says what to put there)")
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    engine, _, version = plan.budget.release.partition("@")
    version = version.split(":")[0]
    if words[:2] == ["vllm", "serve"]:
        command, args, model = ["vllm", "serve"], words[2:], words[2]
    elif words[:3] == ["python", "-m", "sglang.launch_server"]:
        command, args = ["python3", "-m", "sglang.launch_server"], words[3:]
        model = args[args.index("--model-path") + 1]
        args += ["--host", "0.0.0.0"]  # SGLang listens on 127.0.0.1 unless told
    else:
        raise ConfigError(f"--emit: engine {plan.budget.release}: its launch command ({' '.join(words[:2])} with an "
                          "options file) is not one these manifests carry; plan on vllm or sglang")
    size = lambda flag: int(args[args.index(flag) + 1]) if flag in args else 1
    gpus = plan.tp * size("--pipeline-parallel-size") * size("--data-parallel-size")
    return Server(engine, version, command, args, env, model, plan.tp, gpus, _PORTS[engine])


def autoscale_of(plan, policy: str, target: float | None) -> Autoscale:
    """The policy's target (the given one, else its default) between 1 replica and the plan's count.
    concurrency's default is Little's law at the planned load: (target rate / replicas) x mean E2E of the
    recommended configuration, so that at the plan's rate the autoscaler holds the plan's replicas."""
    why = "as given"
    if target is None:
        if policy == "kv":
            target, why = KV_TARGET, "the kv policy's default share"
        elif policy == "queue":
            raise ConfigError("--emit-autoscale queue: give its target, requests waiting per ready replica "
                              "(e.g. queue=4)")
        else:
            e2e = plan.recommended.stats.get("e2e") if plan.recommended else None
            if e2e is None or not e2e.mean:
                raise ConfigError("--emit-autoscale concurrency: the plan has no mean E2E to size it from; give "
                                  "its target, e.g. concurrency=32")
            per_replica = plan.target_rate / plan.replicas
            target = max(1.0, round(per_replica * e2e.mean, 1))
            why = (f"Little's law at the plan's load: {per_replica:.3g} req/s per replica x "
                   f"{e2e.mean:.3g} s mean E2E")
    return Autoscale(policy, target, 1, max(1, plan.replicas), why)


def name_of(model: str) -> str:
    """A DNS-1035 label from the model id: lowercase letters, digits and dashes, a letter first, <= 40 chars."""
    s = re.sub(r"[^a-z0-9]+", "-", model.split("/")[-1].lower()).strip("-")
    s = s if s[:1].isalpha() else f"m-{s}"
    return s[:40].rstrip("-")


# ---- the objects ------------------------------------------------------------------------------------------
def _container(s: Server, name: str, args: list[str] | None = None, command: bool = True) -> dict:
    gpus = {"nvidia.com/gpu": s.gpus}
    c: dict[str, Any] = {"name": name, "image": s.image}
    if command:
        c["command"] = list(s.command)
    c["args"] = list(s.args if args is None else args)
    if s.env:
        c["env"] = [{"name": k, "value": v} for k, v in s.env.items()]
    c["ports"] = [{"containerPort": s.port, "name": "http", "protocol": "TCP"}]
    c["resources"] = {"limits": dict(gpus), "requests": dict(gpus)}
    return c


def _shm(pod: dict, container: dict) -> None:
    """Shared memory for the TP workers' NCCL (the container default of 64 MiB is too small)."""
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]


def _hpa(name: str, target_name: str, a: Autoscale, metric: str, threshold: float) -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target_name},
                     "minReplicas": a.min_replicas, "maxReplicas": a.max_replicas,
                     "metrics": [{"type": "External", "external": {
                         "metric": {"name": metric},
                         "target": {"type": "AverageValue", "averageValue": _num(threshold)}}}],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": COOLDOWN_S}}}}


def _adapter(metric: str, query: str, series: str) -> dict:
    """prometheus-adapter's Helm values (`rules.external`, its docs/externalmetrics.md): the External metric
    the HPA reads, as the whole pool's value of the query (the HPA divides it by the per-replica target)."""
    return {"rules": {"external": [{"seriesQuery": series, "resources": {"namespaced": False},
                                    "name": {"as": metric}, "metricsQuery": query}]}}


def _k8s(s: Server, a: Autoscale, name: str, replicas: int) -> dict[str, Any]:
    query, threshold = a.query(s)
    labels = {"app.kubernetes.io/name": name}
    c = _container(s, s.engine)
    c["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    pod: dict[str, Any] = {"containers": [c]}
    _shm(pod, c)
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
              "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                       "template": {"metadata": {"labels": labels}, "spec": pod}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
           "spec": {"selector": labels, "ports": [{"name": "http", "port": s.port, "targetPort": "http"}]}}
    metric = f"{name}-{a.policy}"
    return {"deployment.yaml": deploy, "service.yaml": svc, "hpa.yaml": _hpa(name, name, a, metric, threshold),
            "prometheus-adapter-values.yaml": _adapter(metric, query, s.metrics[1] + s.selector)}


def _kserve(s: Server, a: Autoscale, name: str, replicas: int) -> dict[str, Any]:
    query, threshold = a.query(s)
    c = _container(s, "kserve-container")
    c["ports"] = [{"containerPort": s.port, "protocol": "TCP"}]
    predictor: dict[str, Any] = {
        "minReplicas": a.min_replicas, "maxReplicas": a.max_replicas,
        "autoScaling": {"metrics": [{"type": "External", "external": {
            "metric": {"backend": "prometheus", "serverAddress": PROMETHEUS, "query": query},
            "target": {"type": "Value", "value": _num(threshold)}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": COOLDOWN_S}}},
        "containers": [c]}
    _shm(predictor, c)
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment",
                                                       "serving.kserve.io/autoscalerClass": "keda"}},
            "spec": {"predictor": predictor}}
    return {"inferenceservice.yaml": isvc}


def _vllm_only(s: Server, target: str) -> None:
    if s.engine != "vllm":
        raise ConfigError(f"--emit {target}: the plan's engine is {s.engine}; {target} deploys vLLM only "
                          "(emit k8s or kserve, or plan with --engine vllm)")


def _production_stack(s: Server, a: Autoscale, name: str, replicas: int) -> dict[str, Any]:
    """helm/templates/deployment-vllm-multi.yaml runs `vllm serve MODEL --host 0.0.0.0 --port 8000`, then one of
    --enable-prefix-caching/--no-enable-prefix-caching from vllmConfig.enablePrefixCaching (always), then
    --tensor-parallel-size from vllmConfig.tensorParallelSize, then vllmConfig.extraArgs: every other flag of the
    command, in its order."""
    _vllm_only(s, "production-stack")
    query, threshold = a.query(s)
    flags = s.flags()
    prefix = "--enable-prefix-caching" in flags
    extra = [f for f in flags if f not in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
    cfg: dict[str, Any] = {"enablePrefixCaching": prefix}
    if "--tensor-parallel-size" in extra:  # from vllmConfig, the template also mounts a memory /dev/shm (for NCCL)
        i = extra.index("--tensor-parallel-size")
        cfg["tensorParallelSize"] = int(extra[i + 1])
        extra = extra[:i] + extra[i + 2:]
    cfg["extraArgs"] = extra
    repo, tag = s.image.split(":")
    spec: dict[str, Any] = {
        "name": name, "repository": repo, "tag": tag, "modelURL": s.model, "replicaCount": replicas,
        "requestGPU": s.gpus,
        "vllmConfig": cfg,
        "keda": {"enabled": True, "minReplicaCount": a.min_replicas, "maxReplicaCount": a.max_replicas,
                 "pollingInterval": INTERVAL_S,
                 "triggers": [{"type": "prometheus", "metadata": {
                     "serverAddress": PROMETHEUS, "metricName": f"{name}-{a.policy}", "query": query,
                     "threshold": _num(threshold)}}],
                 "advanced": {"horizontalPodAutoscalerConfig": {
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": COOLDOWN_S}}}}}}
    if s.env:
        spec["env"] = [{"name": k, "value": v} for k, v in s.env.items()]
    return {"values.yaml": {"servingEngineSpec": {"modelSpec": [spec]}}}


def _llm_d(s: Server, a: Autoscale, name: str, replicas: int) -> dict[str, Any]:
    """charts/llm-d-modelservice: modelCommand vllmServe runs `vllm serve MODEL --port 8000`, then
    --tensor-parallel-size from decode.parallelism.tensor (only when > 1: at 1 the args keep the command's),
    --served-model-name modelArtifacts.name, then the container's args: every other flag, in its order."""
    _vllm_only(s, "llm-d")
    query, threshold = a.query(s)
    flags = s.flags()
    if s.tp > 1 and "--tensor-parallel-size" in flags:  # the chart passes it from parallelism.tensor when > 1
        i = flags.index("--tensor-parallel-size")
        flags = flags[:i] + flags[i + 2:]
    c = _container(s, "vllm", flags, command=False)
    c["modelCommand"] = "vllmServe"
    del c["ports"]  # the chart names the port (routing.servicePort) and the --port it passes
    values = {"fullnameOverride": name,
              "modelArtifacts": {"name": s.model, "uri": f"hf://{s.model}"},
              "routing": {"proxy": {"enabled": False}},  # the P/D sidecar: a plan serves prefill and decode together
              "decode": {"create": True, "replicas": replicas, "autoscaling": {"enabled": True},
                         "parallelism": {"tensor": s.tp}, "containers": [c]},
              "prefill": {"create": False}}
    metric = f"{name}-{a.policy}"
    return {"values.yaml": values, "hpa.yaml": _hpa(f"{name}-decode", f"{name}-decode", a, metric, threshold),
            "prometheus-adapter-values.yaml": _adapter(metric, query, s.metrics[1] + s.selector)}


_BUILD = {"k8s": _k8s, "kserve": _kserve, "production-stack": _production_stack, "llm-d": _llm_d}


def manifests(plan, target: str, policy: str = "concurrency", autoscale_target: float | None = None,
              ) -> dict[str, Any]:
    """{file name: object} for `target`: what deploys the plan's recommendation (see the module docstring)."""
    if target not in TARGETS:
        raise ConfigError(f"--emit {target!r}: use one of {', '.join(TARGETS)}")
    if plan.recommended is None:
        raise ConfigError("--emit: the plan has no recommended configuration (no configuration met the SLOs): "
                          "nothing to deploy")
    if not plan.verification.passed:
        raise ConfigError(f"--emit: the plan's verification at {plan.target_rate:g} req/s missed the SLO on "
                          f"{plan.replicas} replicas: nothing verified to deploy")
    s = server_of(plan)
    a = autoscale_of(plan, policy, autoscale_target)
    return _BUILD[target](s, a, name_of(s.model), plan.replicas)


def header(plan, target: str, policy: str, a_why: str) -> str:
    return (f"# written by `capacity plan --emit {target}`: {plan.model} on {plan.gpu}, {plan.replicas} replica(s) "
            f"x tp={plan.tp} for {plan.target_rate:g} req/s\n# launch command: {plan.vllm_command.splitlines()[-1]}\n"
            f"# autoscaler: the simulation's {policy} policy ({a_why})\n")


def write_manifests(plan, target: str, folder: str | Path, policy: str = "concurrency",
                    autoscale_target: float | None = None) -> list[Path]:
    """Write the target's files into `folder` (made if missing), each atomically; other files there are left
    alone, the target's own files replaced."""
    import yaml

    p = check_request(target, str(folder))
    objs = manifests(plan, target, policy, autoscale_target)
    a = autoscale_of(plan, policy, autoscale_target)
    head = header(plan, target, policy, a.why)
    p.mkdir(exist_ok=True)

    class Dumper(yaml.SafeDumper):  # no &anchors/*aliases for the dicts used twice (labels): plain YAML
        def ignore_aliases(self, data: Any) -> bool:
            return True

    out = []
    for fname, obj in objs.items():
        text = head + yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=1000)
        out.append(write_atomic(p / fname, text, f"--emit {target}"))
    return out


def check_emit(emit: tuple[str, str] | None, autoscale: str | None, several: bool) -> None:
    """`--emit TARGET DIR` and `--emit-autoscale`, before the plan's simulations: one line naming what is wrong."""
    if emit is None:
        raise ConfigError("--emit-autoscale: needs --emit TARGET DIR (the manifests whose autoscaler it sets)")
    if several:
        raise ConfigError(f"--emit {emit[0]}: deploys one plan; give one --gpu and one --engine")
    check_request(*emit)
    parse_autoscale(autoscale)


def emit_plan(plan, emit: tuple[str, str], autoscale: str | None) -> str:
    """Write the manifests of `plan`; the line to print."""
    policy, target = parse_autoscale(autoscale)
    paths = write_manifests(plan, emit[0], emit[1], policy, target)
    a = autoscale_of(plan, policy, target)
    return (f"wrote {', '.join(p.name for p in paths)} in {emit[1]}\n  {emit[0]}: {plan.replicas} replica(s); "
            f"autoscaler: {a.policy}, target {_num(a.target)}, {a.min_replicas}-{a.max_replicas} replicas")


__all__ = ["check_emit", "emit_plan", "DEPLOY_FLAGS", "POLICIES", "TARGETS", "Autoscale", "Server", "autoscale_of", "check_request",
           "manifests", "name_of", "parse_autoscale", "server_of", "write_manifests"]
