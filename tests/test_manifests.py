"""`capacity plan ... --emit TARGET DIR` (capacity.io.manifests): the manifests validate against the published
schemas, offline (Kubernetes: the `kubernetes-validate` package's bundled API schemas; KServe, production-stack and
llm-d: the schemas stored in tests/data/manifests/, each with its source URL and commit), and the model server's
arguments, read back as each target's chart or controller assembles them, carry the flags of the launch command
the plan printed."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from capacity.engine.launch import parse_launch_command
from capacity.io.manifests import DEPLOY_FLAGS, TARGETS, write_manifests
from capacity.plan.results import Plan
from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "manifests"
K8S_VERSIONS = ("1.29", "1.33")  # an older and a recent API: autoscaling/v2, apps/v1 and v1 hold in both
FAST_PLAN = ("plan", "-m", "qwen2.5-7b", "-g", "l40s", "--target-rate", "2", "--seeds", "1", "--requests", "100")


def _strict(schema):
    """The API server's strict field validation (kubectl --validate=strict): an object schema that lists its
    properties and says nothing of others rejects unknown fields (a CRD only prunes them, silently)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


def _schema(name: str) -> dict:
    return json.loads((DATA / name).read_text())["schema"]


def _load(folder: Path) -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))}


def _k8s_valid(obj: dict) -> None:
    for v in K8S_VERSIONS:
        kubernetes_validate.validate(obj, v, strict=True)


def _flags(words: list[str]) -> list[tuple[str, str | None]]:
    """`--flag value` / `--switch` pairs, in order, leaving out what only a deployment adds (DEPLOY_FLAGS)."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        assert w.startswith("--"), (w, words)
        val = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        i += 2 if val is not None else 1
        if w not in DEPLOY_FLAGS:
            out.append((w, val))
    return out


def _printed(plan: Plan) -> tuple[list[str], list[str]]:
    """The printed launch command: (program + model words, flag words), environment words left out."""
    line = [ln for ln in plan.vllm_command.splitlines() if not ln.startswith("#")][-1]
    words = [w for w in shlex.split(line) if not ("=" in w and not w.startswith("-"))]
    return words[:3], words[3:]  # vllm serve MODEL | python -m sglang.launch_server


# The argv each target runs, assembled as its own templates do (cited), from the emitted files.
def _argv_k8s(files: dict) -> list[str]:
    c = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    return c["command"] + c["args"]


def _argv_kserve(files: dict) -> list[str]:
    c = files["inferenceservice.yaml"]["spec"]["predictor"]["containers"][0]
    return c["command"] + c["args"]


def _argv_production_stack(files: dict) -> list[str]:
    # helm/templates/deployment-vllm-multi.yaml (vllm-project/production-stack a6c01db): vllm serve MODEL --host
    # --port, --enable-lora if enableLoRA, then vllmConfig's keys in this order, then vllmConfig.extraArgs
    m = files["values.yaml"]["servingEngineSpec"]["modelSpec"][0]
    cfg = m["vllmConfig"]
    argv = ["vllm", "serve", m["modelURL"], "--host", "0.0.0.0", "--port", "8000"]
    if m.get("enableLoRA"):
        argv.append("--enable-lora")
    if "enableChunkedPrefill" in cfg:
        argv.append("--enable-chunked-prefill" if cfg["enableChunkedPrefill"] else "--no-enable-chunked-prefill")
    argv.append("--enable-prefix-caching" if cfg.get("enablePrefixCaching") else "--no-enable-prefix-caching")
    for key, flag in (("maxModelLen", "--max-model-len"), ("dtype", "--dtype"),
                      ("tensorParallelSize", "--tensor-parallel-size"), ("maxNumSeqs", "--max-num-seqs"),
                      ("gpuMemoryUtilization", "--gpu_memory_utilization"), ("maxLoras", "--max_loras")):
        if key in cfg:
            argv += [flag, str(cfg[key])]
    return argv + cfg.get("extraArgs", [])


def _argv_llm_d(files: dict) -> list[str]:
    # charts/llm-d-modelservice/templates/_helpers.tpl, vllmServeModelCommand (llm-d-modelservice 3051935):
    # vllm serve MODEL --port 8000 [--tensor-parallel-size T if T > 1] --served-model-name NAME, then args
    v = files["values.yaml"]
    d, c = v["decode"], v["decode"]["containers"][0]
    assert c["modelCommand"] == "vllmServe" and v["modelArtifacts"]["uri"].startswith("hf://")
    argv = ["vllm", "serve", v["modelArtifacts"]["uri"][5:], "--port", "8000"]
    if d["parallelism"]["tensor"] > 1:
        argv += ["--tensor-parallel-size", str(d["parallelism"]["tensor"])]
    return argv + ["--served-model-name", v["modelArtifacts"]["name"]] + c["args"]


ARGV = {"k8s": _argv_k8s, "kserve": _argv_kserve, "production-stack": _argv_production_stack, "llm-d": _argv_llm_d}


def check_same_flags(plan: Plan, target: str, files: dict) -> None:
    """The emitted server runs the printed command: same program and model, the same flags with the same values
    (a `--flag value` list compared as a multiset: a chart may put a flag earlier), and the project's own reader
    of launch commands reads both back into the same engine settings."""
    argv = ARGV[target](files)
    head, flags = _printed(plan)
    if head[0] == "python":  # the container runs python3 (the image's interpreter), the command says python
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        argv = head + argv[3:]
    else:
        assert argv[:3] == head, (argv[:3], head)
    got = _flags(argv[3:])
    assert sorted(got, key=str) == sorted(_flags(flags), key=str), (target, got, _flags(flags))
    kept = " ".join(shlex.quote(w) for w in argv[:3] + [w for f in got for w in f if w is not None])
    a, b = parse_launch_command(kept), parse_launch_command(" ".join(head + flags))
    assert (a.engine, a.model, a.tp, a.settings, a.quantization) == (b.engine, b.model, b.tp, b.settings, b.quantization)


def check_valid(target: str, files: dict) -> None:
    if target in ("k8s", "llm-d"):
        for name in ("deployment.yaml", "service.yaml", "hpa.yaml"):
            if name in files:
                _k8s_valid(files[name])
    if target == "kserve":
        isvc = files["inferenceservice.yaml"]
        jsonschema.validate(isvc, _strict(_schema("kserve_inferenceservice_v1beta1.schema.json")))
        # the predictor's container is a core/v1 Container: the Kubernetes schema of it too, by way of a Pod
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
               "spec": {k: isvc["spec"]["predictor"][k] for k in ("containers", "volumes")}}
        _k8s_valid(pod)
    if target == "production-stack":
        schema = _schema("production_stack_values.schema.json")
        keda = schema["properties"]["servingEngineSpec"]["properties"]["modelSpec"]["items"]["properties"]["keda"]
        # the chart's schema types keda.triggers as one object (made from the values.yaml example), but its template
        # (scaledobject-vllm.yaml) writes it under a ScaledObject's `triggers:`, a list, and its own tests
        # (helm/tests/keda_test.yaml) give a list: a list of that object is what the chart takes
        keda["properties"]["triggers"] = {"type": "array", "items": keda["properties"]["triggers"]}
        jsonschema.validate(files["values.yaml"], _strict(schema))
    if target == "llm-d":
        jsonschema.validate(files["values.yaml"], _schema("llm_d_modelservice_values.schema.json"))
        c = files["values.yaml"]["decode"]["containers"][0]
        core = {k: v for k, v in c.items() if k != "modelCommand"}  # the chart's own key; the rest is a Container
        _k8s_valid({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [core]}})


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    """A real plan (Qwen2.5-7B on an L40S at 2 req/s, a short search: seconds) with --emit k8s, and its JSON."""
    out = tmp_path_factory.mktemp("emit")
    r = run_cli(*FAST_PLAN, "--json", "--emit", "k8s", str(out / "k8s"), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return Plan.from_dict(json.loads(r.stdout)), out


def test_the_cli_writes_k8s_manifests_that_validate_and_run_the_printed_command(fast):
    plan, out = fast
    files = _load(out / "k8s")
    assert set(files) == {"deployment.yaml", "service.yaml", "hpa.yaml", "prometheus-adapter-values.yaml"}
    check_valid("k8s", files)
    check_same_flags(plan, "k8s", files)
    c = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == plan.tp == 1
    assert files["deployment.yaml"]["spec"]["replicas"] == plan.replicas
    assert c["image"] == "vllm/vllm-openai:v" + plan.budget.release.split("@")[1]


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_validates_and_carries_the_printed_flags(fast, target, tmp_path):
    plan = fast[0]
    write_manifests(plan, target, tmp_path)
    files = _load(tmp_path)
    check_valid(target, files)
    check_same_flags(plan, target, files)


def test_the_autoscalers_metric_and_target_are_the_simulations(fast, tmp_path):
    plan = fast[0]
    # concurrency: Little's law at the planned load, in flight = rate per replica x mean E2E
    e2e = plan.recommended.stats["e2e"].mean
    want = round(plan.target_rate / plan.replicas * e2e, 1)
    write_manifests(plan, "k8s", tmp_path / "c")
    hpa = _load(tmp_path / "c")["hpa.yaml"]["spec"]
    assert float(hpa["metrics"][0]["external"]["target"]["averageValue"]) == pytest.approx(want)
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, plan.replicas)
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300  # the simulation's cooldown_s
    q = _load(tmp_path / "c")["prometheus-adapter-values.yaml"]["rules"]["external"][0]["metricsQuery"]
    assert "vllm:num_requests_running" in q and "vllm:num_requests_waiting" in q and "[60s]" in q
    # kv: the share of the cache, default 0.8 (AutoscaleConfig's kv target), on the release's KV gauge
    write_manifests(plan, "kserve", tmp_path / "k", "kv")
    m = _load(tmp_path / "k")["inferenceservice.yaml"]["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]
    assert m["target"]["value"] == "0.8" and "vllm:kv_cache_usage_perc" in m["metric"]["query"]
    old = dataclasses.replace(plan, budget=dataclasses.replace(plan.budget, release="vllm@0.9.2"))
    write_manifests(old, "kserve", tmp_path / "o", "kv", 0.7)
    m = _load(tmp_path / "o")["inferenceservice.yaml"]["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]
    assert m["target"]["value"] == "0.7" and "vllm:gpu_cache_usage_perc" in m["metric"]["query"]
    # queue: ready + waiting / (target x ready) against 1: with 3 ready and 10 waiting at target 4, the HPA's
    # ceil(3 + 10 / 12) = 4 replicas, the simulation's 3 + ceil(10 / (4 x 3)) = 4
    write_manifests(plan, "production-stack", tmp_path / "q", "queue", 4)
    trig = _load(tmp_path / "q")["values.yaml"]["servingEngineSpec"]["modelSpec"][0]["keda"]["triggers"][0]["metadata"]
    assert trig["threshold"] == "1" and "(4 * count(vllm:num_requests_waiting" in trig["query"]


def test_an_sglang_plan_deploys_on_k8s_and_kserve_with_its_own_metrics(fast, tmp_path):
    plan = fast[0]
    sg = dataclasses.replace(plan, vllm_command=plan.sglang_command,
                             budget=dataclasses.replace(plan.budget, release="sglang@0.5.20"))
    for target in ("k8s", "kserve"):
        write_manifests(sg, target, tmp_path / target, "kv")
        files = _load(tmp_path / target)
        check_valid(target, files)
        check_same_flags(sg, target, files)
    c = _load(tmp_path / "k8s")["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "lmsysorg/sglang:v0.5.20" and c["args"][-2:] == ["--host", "0.0.0.0"]
    assert "sglang:token_usage" in (tmp_path / "k8s" / "prometheus-adapter-values.yaml").read_text()


def test_only_its_own_files_are_replaced(fast, tmp_path):
    (tmp_path / "notes.yaml").write_text("mine: 1\n")
    (tmp_path / "hpa.yaml").write_text("stale: 1\n")
    write_manifests(fast[0], "k8s", tmp_path)
    assert (tmp_path / "notes.yaml").read_text() == "mine: 1\n"
    assert yaml.safe_load((tmp_path / "hpa.yaml").read_text())["kind"] == "HorizontalPodAutoscaler"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("args, names", [
    (("--emit", "helm", "out"), "--emit 'helm'"),
    (("--emit", "k8s", "README.md"), "README.md: is a file"),
    (("--emit", "k8s", "no/such/dir"), "the folder no/such does not exist"),
    (("--emit", "k8s", "out", "--emit-autoscale", "predictive"), "--emit-autoscale 'predictive'"),
    (("--emit", "k8s", "out", "--emit-autoscale", "kv=1.5"), "--emit-autoscale 'kv=1.5'"),
    (("--emit-autoscale", "kv"), "--emit-autoscale: needs --emit"),
    (("-g", "h100-sxm,h200", "--emit", "k8s", "out"), "--emit k8s: deploys one plan"),
])
def test_bad_emit_input_is_one_line_before_any_simulation(args, names):
    r = run_cli("plan", "-m", "qwen2.5-7b", *args, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and names in lines[0], lines


def test_plans_the_targets_cannot_express_are_one_line(fast, tmp_path):
    from capacity.errors import ConfigError

    plan = fast[0]
    cases = [
        (dataclasses.replace(plan, recommended=None), "k8s", "no recommended configuration"),
        (dataclasses.replace(plan, verification=dataclasses.replace(plan.verification, passed=False)), "k8s",
         "missed the SLO"),
        (dataclasses.replace(plan, vllm_command="# put the folder in place of <...>\nvllm serve <folder-of-x> --tp 1"),
         "kserve", "placeholder model"),
        (dataclasses.replace(plan, vllm_command=plan.sglang_command,
                             budget=dataclasses.replace(plan.budget, release="sglang@0.5.20")),
         "production-stack", "--emit production-stack: the plan's engine is sglang"),
        (dataclasses.replace(plan, vllm_command=plan.sglang_command,
                             budget=dataclasses.replace(plan.budget, release="sglang@0.5.20")),
         "llm-d", "--emit llm-d: the plan's engine is sglang"),
        (dataclasses.replace(plan, vllm_command="echo '{a: 1}' > extra.yaml && trtllm-serve m --tp_size 1",
                             budget=dataclasses.replace(plan.budget, release="trtllm@1.2.0")),
         "k8s", "engine trtllm@1.2.0"),
    ]
    for p, target, says in cases:
        with pytest.raises(ConfigError, match=None) as e:
            write_manifests(p, target, tmp_path / target)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="queue: give its target"):
        write_manifests(plan, "k8s", tmp_path / "q", "queue")


README_70B = ("plan", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--target-rate", "20", "--slo-ttft-ms", "2000",
              "--slo-tpot-ms", "50", "--price-per-gpu-hour", "2.5")


@pytest.mark.slow
def test_the_readme_70b_plan_deploys_on_every_target(tmp_path):
    """README.md's first question (16 H100s: 4 replicas of TP 4): each target's manifests validate and run the
    command the plan prints, with 4 GPUs a replica."""
    r = run_cli(*README_70B, "--json", "--emit", "kserve", str(tmp_path / "kserve"), timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = Plan.from_dict(json.loads(r.stdout))
    assert (plan.tp, plan.replicas) == (4, 4)
    for target in TARGETS:
        if target != "kserve":
            write_manifests(plan, target, tmp_path / target)
        files = _load(tmp_path / target)
        check_valid(target, files)
        check_same_flags(plan, target, files)
    c = _load(tmp_path / "k8s")["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert _load(tmp_path / "production-stack")["values.yaml"]["servingEngineSpec"]["modelSpec"][0]["requestGPU"] == 4


def test_the_schemas_catch_a_misspelt_field(fast, tmp_path):
    """The validation above can fail: one misspelt key in each target's main object is rejected."""
    plan = fast[0]
    for target, file, path in (("k8s", "hpa.yaml", ("spec",)), ("kserve", "inferenceservice.yaml", ("spec", "predictor")),
                               ("production-stack", "values.yaml", ("servingEngineSpec", "modelSpec", 0)),
                               ("llm-d", "values.yaml", ("modelArtifacts",))):
        write_manifests(plan, target, tmp_path / target)
        files = _load(tmp_path / target)
        node = files[file]
        for k in path:
            node = node[k]
        node["replicsa"] = 2
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            check_valid(target, files)
