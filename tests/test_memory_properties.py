"""Property tests: random valid cards never crash the budget and keep its invariants."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity.engine import memory as mem
from capacity.engine.config import EngineConfig
from capacity.errors import CapacityError
from capacity.model.card import ModelCard
from capacity.model.gpus import get_gpu


@st.composite
def cards(draw):
    kv = draw(st.sampled_from([1, 2, 4, 8, 16]))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    hd = draw(st.sampled_from([64, 128]))
    heads = kv * group
    moe = None
    if draw(st.booleans()):
        e = draw(st.integers(2, 64))
        moe = {"num_experts": e, "experts_per_token": draw(st.integers(1, e)),
               "moe_intermediate_size": draw(st.integers(64, 8192))}
    return ModelCard(
        name="random", num_layers=draw(st.integers(1, 96)), hidden_size=heads * hd, num_attention_heads=heads,
        num_kv_heads=kv, intermediate_size=draw(st.integers(64, 32768)), vocab_size=draw(st.integers(256, 262144)),
        max_position_embeddings=draw(st.sampled_from([2048, 8192, 32768])),
        weight_dtype=draw(st.sampled_from([None, "fp8", "int8"])), moe=moe)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(card=cards(), util=st.floats(0.3, 0.95), gpu=st.sampled_from(["h100-sxm", "l4", "h200"]),
       tp=st.sampled_from([1, 2, 4, 8]))
def test_budget_never_crashes_and_is_consistent(card, util, gpu, tp):
    cfg = EngineConfig(tensor_parallel_size=tp, gpu_memory_utilization=util, max_model_len=2048)
    try:
        b = mem.budget(card, get_gpu(gpu), cfg)
    except CapacityError as exc:  # a clear, one-line refusal is a valid outcome
        assert str(exc) and "\n" not in str(exc)
        return
    terms = (b.weights_bytes + b.activation_bytes + b.non_torch_bytes + b.runner_buffers_bytes
             + (b.cuda_graph_bytes if b.cuda_graphs_in_budget else 0.0))
    assert abs(b.usable_bytes - terms - b.kv_budget_bytes) < 1.0
    assert b.num_blocks * b.block_bytes <= b.kv_budget_bytes
    lo, hi = b.ranges["kv_budget"]
    assert lo <= b.kv_budget_bytes <= hi and b.num_blocks_range[0] <= b.num_blocks <= b.num_blocks_range[1]
    assert b.planning_blocks == b.num_blocks_range[0]  # the conservative end by default
    assert b.kv_tokens >= b.max_model_len
    more = mem.budget(card, get_gpu(gpu), cfg.model_copy(update={"gpu_memory_utilization": min(1.0, util + 0.04)}))
    assert more.num_blocks >= b.num_blocks
