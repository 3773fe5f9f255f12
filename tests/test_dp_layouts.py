"""Attention-DP and expert layouts in `capacity plan --layouts` (capacity/plan/engine_layouts.py) and the lock-step
terms of `capacity step-cost --enable-dp-attention / --trtllm-attention-dp` (capacity/cli/step_lockstep.py).
The rate searches are stubbed where only the wiring is checked (a real search is minutes on two shared cores);
the memory and the lock-step figures are the engines' own, pinned by hand."""
from __future__ import annotations

import json

import pytest

from capacity.cost.step import StepPlan
from capacity.engine import get_engine
from capacity.engine.configs import AnyEngineConfig
from capacity.model.card import load_model_card
from capacity.model.gpus import get_gpu
from capacity.plan.engine_layouts import PlanLayout, layout_engine, parse_layouts
from capacity.plan.results import RateSearch
from tests.conftest import ROOT, run_cli, said

TQ = str(ROOT / "tests/data/tiny-qwen3-moe.yaml")  # qwen3_moe: SGLang shards its attention by attention TP
CARD = load_model_card(ROOT / "tests/data/tiny-qwen3-moe.yaml")


def engine(spec: str):
    from pydantic import TypeAdapter

    return TypeAdapter(AnyEngineConfig).validate_python({"engine": spec})


def labels(spec: str, gpus: int, eng: str, card=CARD) -> list[str]:
    return [lay.label for _, lay in parse_layouts(spec, gpus, card, eng)[0]]


def test_auto_offers_each_engine_its_own_layouts():
    assert labels("auto", 4, "vllm") == ["tp4", "tp4-ep", "tp2-dp2-ep", "tp1-dp4-ep"]  # unchanged for vLLM
    assert labels("auto", 4, "sglang") == ["tp4", "tp4-ep", "tp4-adp2", "tp4-adp2-ep", "tp4-adp4", "tp4-adp4-ep"]
    assert labels("auto", 4, "trtllm") == ["tp4", "tp4-adp4"]  # enable_attention_dp: one rank per GPU
    dense = load_model_card(ROOT / "models/tiny.yaml")
    assert labels("auto", 4, "sglang", dense) == ["tp4"]  # attention DP and EP: MoE models only
    assert parse_layouts("tp,adp2", 2, CARD, "sglang")[1] is False and parse_layouts("auto", 2, CARD, "sglang")[1]


def test_each_layout_is_the_engines_own_configuration():
    sg = layout_engine(engine("sglang@0.5.5"), PlanLayout(4, 1, True, 2))
    assert (sg.tensor_parallel_size, sg.data_parallel_size, sg.enable_dp_attention, sg.ep_size) == (4, 2, True, 4)
    assert sg.dp_size() == 1  # the attention ranks share the 4 GPUs of one replica
    tr = layout_engine(engine("trtllm"), PlanLayout(4, 1, False, 4))
    assert tr.trtllm_attention_dp and tr.tensor_parallel_size == 4 and tr.moe_expert_parallel_size is None
    vl = layout_engine(engine("vllm"), PlanLayout(2, 2, True))
    assert (vl.tensor_parallel_size, vl.data_parallel_size, vl.enable_expert_parallel) == (2, 2, True)
    assert PlanLayout(4, 1, True, 2).kv_pools == 2 and PlanLayout(2, 2, True).kv_pools == 2


def test_layout_memory_by_hand():
    """tiny-qwen3-moe, bf16: per layer q 256x256, k and v 256x64, o 256x256 (8 heads of 32, 2 KV heads); 4 layers:
    attention 4 x 163,840 x 2 B = 1,310,720 B; embedding and LM head 2048 x 256 x 2 B = 1,048,576 B each.
    SGLang tp2 -> tp2 with DP attention 2: attention at attention TP 1 (+ 1,310,720 / 2) and the embedding
    replicated (+ 1,048,576 / 2), the LM head and experts still over 2: + 1,179,648 B per rank.
    TensorRT-LLM tp2 -> attention DP: everything but the routed experts whole: + (1,310,720 + 2 x 1,048,576) / 2
    = + 1,703,936 B per rank (router, norms and rope cache are whole either way)."""
    gpu = get_gpu("h100")

    def weights(spec: str, lay: PlanLayout) -> float:
        cfg = layout_engine(engine(spec).model_copy(update={"max_model_len": 4096}), lay)
        return get_engine(spec).budget(CARD, gpu, cfg).weights_bytes

    assert weights("sglang@0.5.5", PlanLayout(2, 1, False, 2)) - weights("sglang@0.5.5", PlanLayout(2)) == 1_179_648
    assert weights("trtllm", PlanLayout(2, 1, False, 2)) - weights("trtllm", PlanLayout(2)) == 1_703_936


@pytest.fixture
def stub_search(monkeypatch):
    """Planner.rate_search replaced by a hand rule: 10 req/s per KV pool, + 1 with expert parallelism (only the
    wiring around the search is under test here)."""
    from capacity.engine.lockstep import attention_dp_ranks
    from capacity.plan.planner import Planner

    def fake(self, eng, tp, max_num_seqs):
        ep = bool(getattr(eng, "ep_size", 1) > 1 or getattr(eng, "enable_expert_parallel", False))
        rate = 10.0 * attention_dp_ranks(eng) * eng.dp_size() + ep
        return RateSearch(tp, rate, rate * 1.1, rate * 1.2, source="stub")

    monkeypatch.setattr(Planner, "rate_search", fake)


def plan_json(*args: str) -> dict:
    r = run_cli("plan", "-m", TQ, "--gpu", "h100", "--input-len", "500", "--output-len", "50", "--json", *args)
    assert r.returncode == 0, r.stderr[-800:]
    return json.loads(r.stdout)


def test_sglang_auto_compares_attention_dp_and_names_the_winner(stub_search):
    out = plan_json("--engine", "sglang@0.5.5", "--layouts", "auto", "--layout-gpus", "2")
    rows = {x["layout"]: x for x in out["layouts"]}
    assert list(rows) == ["tp2", "tp2-ep", "tp2-adp2", "tp2-adp2-ep"]
    assert [rows[k]["max_rate_req_per_s"] for k in rows] == [10.0, 11.0, 20.0, 21.0]
    assert out["winner"] == "tp2-adp2-ep" and out["not_offered"] == []
    a = rows["tp2-adp2-ep"]
    assert a["kv_pools"] == 2 and a["attention_dp"] == 2 and a["kv_tokens_total"] == 2 * a["kv_tokens_per_rank"]
    assert "--tp 2" in a["command"] and "--dp 2" in a["command"] and "--enable-dp-attention" in a["command"]
    assert "--ep-size 2" in a["command"]
    assert rows["tp2"]["kv_pools"] == 1 and "--enable-dp-attention" not in rows["tp2"]["command"]


def test_auto_leaves_out_what_the_release_lacks(stub_search):
    """SGLang up to 0.4.4 forces dp = tp with DP attention (server_args.py, sglang/dpattn.py): on 4 GPUs adp2 is
    left out with its reason, adp4 stays."""
    out = plan_json("--engine", "sglang@0.4.3", "--layouts", "auto", "--layout-gpus", "4")
    got = [x["layout"] for x in out["layouts"]]
    assert "tp4-adp4" in got and "tp4-adp2" not in got
    assert any(n.startswith("tp4-adp2: not offered") and "0.4.4 sets dp_size = tp_size" in n for n in out["not_offered"])


@pytest.mark.parametrize("args, line", [
    (["--engine", "sglang", "--layouts", "adp3", "--layout-gpus", "4"],
     "--layouts adp3: attention DP 3 must be > 1 and divide the 4 GPUs"),
    (["--engine", "vllm", "--layouts", "tp,adp2", "--layout-gpus", "2"],
     "--layouts adp2: attention DP inside the TP group is SGLang's"),
    (["--engine", "sglang@0.4.3", "--layouts", "adp2", "--layout-gpus", "4"],
     "--layouts adp2: enable_dp_attention: data_parallel_size 2: SGLang up to 0.4.4 sets dp_size = tp_size"),
    (["--engine", "trtllm", "--layouts", "adp2", "--layout-gpus", "4"],
     "--layouts adp2: TensorRT-LLM's enable_attention_dp runs one attention rank per GPU (adp4 on 4 GPUs)"),
    (["--engine", "trtllm", "--layouts", "ep", "--layout-gpus", "2"], "--layouts ep: TensorRT-LLM's --ep_size"),
    (["--engine", "sglang", "--layouts", "dp2", "--layout-gpus", "2"], "--layouts dp2: sglang's data parallelism"),
])
def test_bad_layouts_are_one_line(args, line):
    r = run_cli("plan", "-m", TQ, "--gpu", "h100", *args)
    lines = said(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and line in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_layouts_of_other_models_are_one_line():
    r = run_cli("plan", "-m", "tiny-moe", "--gpu", "h100", "--engine", "sglang", "--layouts", "adp2", "--layout-gpus", "2")
    assert r.returncode == 1 and "--layouts adp2: enable_dp_attention: SGLang's mixtral model shards attention" in r.stderr
    r = run_cli("plan", "-m", "tiny", "--gpu", "h100", "--engine", "sglang", "--layouts", "adp2", "--layout-gpus", "2")
    assert r.returncode == 1 and "--layouts adp2: the model is dense" in r.stderr


# ---- step-cost ------------------------------------------------------------------------------------------------
def step_json(*args: str) -> dict:
    model = [] if "-m" in args else ["-m", TQ]
    r = run_cli("step-cost", *model, "--gpu", "h100", "--json", *args)
    assert r.returncode == 0, r.stderr[-800:]
    return json.loads(r.stdout)


def test_step_cost_deals_the_step_to_the_ranks_and_prints_the_lock_step():
    # 3 decodes over 2 ranks, round robin: [2, 1]; decode with CUDA graphs pads every rank to the largest: 2 x 2 rows
    d = step_json("--engine", "sglang@0.5.5", "--tp", "2", "--dp", "2", "--enable-dp-attention", "--decode", "3x100")
    lk = d["lock_step"]
    assert lk["rank_tokens"] == [2, 1] and lk["gathered_tokens"] == 4
    assert d["step_s"] == pytest.approx(lk["rest_over_gathered_s"] + max(lk["rank_attention_s"]), rel=1e-12)
    assert "attention DP x2 in lock step" in d["source"]
    # a prefill of 6 then a decode: [6, 1]; a rank extends, so the sum (SUM_LEN): 7 rows
    d = step_json("--engine", "sglang@0.5.5", "--tp", "2", "--dp", "2", "--enable-dp-attention", "--prefill", "6",
                  "--decode", "1x100")
    assert d["lock_step"]["rank_tokens"] == [6, 1] and d["lock_step"]["gathered_tokens"] == 7
    # TensorRT-LLM: one rank per GPU (D = tp 4): 5 decodes as [2, 1, 1, 1] -> 4 x 2 rows
    d = step_json("--engine", "trtllm", "--tp", "4", "--trtllm-attention-dp", "--decode", "5x100")
    assert d["lock_step"]["rank_tokens"] == [2, 1, 1, 1] and d["lock_step"]["gathered_tokens"] == 8


def test_each_rank_attention_is_at_the_attention_tp():
    """SGLang tp 4 with DP attention 2: each rank's attention at attention TP 4 / 2 = 2, with its all-reduce over
    those 2 (RooflineAttention of a tp-2 roofline built here on its own); 4 decodes dealt [2, 2]."""
    from capacity.cost.roofline import RooflineCost
    from capacity.engine.lockstep import RooflineAttention

    d = step_json("--engine", "sglang@0.5.5", "--tp", "4", "--dp", "2", "--enable-dp-attention", "--decode", "4x100")
    want = RooflineAttention(RooflineCost(CARD, get_gpu("h100"), 2, kv_dtype="bf16"), with_allreduce=True)
    assert d["lock_step"]["rank_attention_s"] == pytest.approx([want.part_s(StepPlan((), (100, 100)))] * 2,
                                                               rel=1e-12)


@pytest.mark.parametrize("args, line", [
    (["--engine", "sglang", "--tp", "2", "--dp", "3", "--enable-dp-attention"],
     "enable_dp_attention: data_parallel_size 3 must be > 1 and divide tensor_parallel_size 2"),
    (["--tp", "2", "--dp", "2", "--enable-dp-attention"], "--enable-dp-attention: SGLang's setting; give --engine sglang"),
    (["--engine", "sglang@0.4.3", "--tp", "4", "--dp", "2", "--enable-dp-attention"],
     "SGLang up to 0.4.4 sets dp_size = tp_size"),
    (["--engine", "trtllm", "--tp", "2", "--dp", "2", "--trtllm-attention-dp"], "--dp 2: TensorRT-LLM has no"),
    (["-m", "tiny", "--engine", "trtllm", "--tp", "2", "--trtllm-attention-dp"],
     "trtllm_attention_dp true: modelled for MoE models"),
    (["-m", "tiny-moe", "--engine", "sglang", "--tp", "2", "--dp", "2", "--enable-dp-attention"],
     "SGLang's mixtral model shards attention over the whole TP group"),
])
def test_step_cost_bad_values_are_one_line(args, line):
    model = [] if "-m" in args else ["-m", TQ]
    r = run_cli("step-cost", *model, "--gpu", "h100", *args, "--decode", "2x100")
    assert r.returncode == 1 and len(said(r.stderr)) == 1 and line in r.stderr, r.stderr


# ---- hybrid (state-space) models under SGLang's DP attention ---------------------------------------------------
QNEXT = str(ROOT / "tests/data/startup_v3/hf/qwen3-next-80b-a3b-thinking.json")


def test_hybrid_states_are_kept_at_the_attention_tp():
    """Qwen3-Next (36 gated-DeltaNet layers; 32 value heads of 128, 16 key heads of 128, conv kernel 4): at
    attention TP 2 (tp 4, DP attention 2) a request's state per layer is 16 heads x 128 x 128 x 4 B (fp32 SSM)
    + (2 x 16 x 128 + 32 x 128) / 2 channels x 3 x 2 B (bf16 conv) = 1,048,576 + 24,576 B; x 36 = 36.8 MiB (SGLang's
    mamba2_cache_params: Mamba2StateShape.create(tp_world_size=get_attention_tp_size()))."""
    r = run_cli("memory", "-m", QNEXT, "-g", "h100", "--engine", "sglang@0.5.5", "--tp", "4", "--dp", "2",
                "--enable-dp-attention")
    assert r.returncode == 0, r.stderr[-600:]
    assert "(36.8 MiB per request)" in " ".join(r.stdout.split())


def test_hybrid_state_mixers_run_in_the_ranks_part():
    """The lock step no longer refuses a hybrid: its state layers' scan and projections count in each rank's part
    (at attention TP), not in the rest over the gathered rows."""
    from capacity.cost.roofline import RooflineCost
    from capacity.engine.lockstep import RooflineAttention

    card = load_model_card(QNEXT)
    full = RooflineCost(card, get_gpu("h100"), 4)
    p = StepPlan((), (2000,) * 8)
    parts = full.breakdown(p)
    assert RooflineAttention(full).part_s(p) > parts["state"] + parts["attention"] > parts["attention"] > 0
    d = step_json("-m", QNEXT, "--engine", "sglang@0.5.5", "--tp", "4", "--dp", "2", "--enable-dp-attention",
                  "--decode", "8x2000")
    assert d["lock_step"]["rank_tokens"] == [4, 4] and d["lock_step"]["gathered_tokens"] == 8
