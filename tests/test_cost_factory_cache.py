"""`capacity.cost.factory.roofline_cost`: one RooflineCost per process for equal inputs, a new one for any input
that differs (a cache keyed wrongly would hand a simulation another model's, GPU's or TP size's step times), and
a shared one prices every step as a fresh one does."""
from capacity.cost import factory
from capacity.cost.factory import make_step_cost
from capacity.cost.roofline import RooflineCost
from capacity.cost.roofline_params import RooflineParams
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu


def _plans() -> list[StepPlan]:
    return [StepPlan(prefills=(PrefillChunk(512),)),
            StepPlan(decode_contexts=(1000,) * 64),
            StepPlan(prefills=(PrefillChunk(256, 128),), decode_contexts=(300, 4000))]


def test_equal_inputs_share_one_cost_even_from_equal_copies():
    card, gpu = load_named_card("llama-3.1-8b"), get_gpu("h100-sxm")
    a = make_step_cost(card, gpu, 1)
    # a worker unpickles a new card and GPU for each task: equal by value, not the same objects
    b = make_step_cost(card.model_copy(deep=True), get_gpu("h100-sxm").model_copy(deep=True), 1)
    assert a is b
    assert make_step_cost(card, "h100-sxm", 1, kv_dtype="auto") is a  # "auto": the card's dtype, as None


def test_any_differing_input_misses():
    card, gpu = load_named_card("llama-3.1-8b"), get_gpu("h100-sxm")
    base = make_step_cost(card, gpu, 1)
    others = [make_step_cost(card, gpu, 2),  # TP
              make_step_cost(card, get_gpu("a100-80gb"), 1),  # GPU
              make_step_cost(load_named_card("llama-3.1-70b"), gpu, 1),  # model
              make_step_cost(card.model_copy(update={"max_position_embeddings": 4096}), gpu, 1),  # one card field
              make_step_cost(card, gpu.model_copy(update={"mem_bw_bytes_per_s": gpu.mem_bw_bytes_per_s / 2}), 1),
              make_step_cost(card, gpu, 1, kv_dtype="fp8"),  # KV dtype
              make_step_cost(card, gpu, 1, step_overhead_s=0.004),  # the engine's step overhead
              make_step_cost(card, gpu, 1, step_overhead_s=0.0)]
    assert len({id(c) for c in [base, *others]}) == 1 + len(others)
    # and each prices as its own inputs say: half the bandwidth, a slower decode step
    decode = StepPlan(decode_contexts=(1000,) * 64)
    assert others[4].step_s(decode) > base.step_s(decode)
    assert others[0].step_s(decode) < base.step_s(decode)  # TP 2: half the weights per rank


def test_shared_cost_prices_every_step_as_a_fresh_one():
    card, gpu = load_named_card("llama-3.1-70b"), get_gpu("h100-sxm")
    shared = make_step_cost(card, gpu, 4, step_overhead_s=0.003)
    for p in _plans():  # fill its memo
        shared.step_s(p)
    again = make_step_cost(card, gpu, 4, step_overhead_s=0.003)
    assert again is shared
    fresh = RooflineCost(card, gpu, 4, params=RooflineParams(step_overhead_s=0.003))
    for p in _plans():
        assert again.step_s(p) == fresh.step_s(p)


def test_cache_is_bounded():
    card, gpu = load_named_card("llama-3.1-8b"), get_gpu("h100-sxm")
    first = make_step_cost(card, gpu, 1, step_overhead_s=0.0123)
    for i in range(factory.ROOFLINES_KEPT):
        make_step_cost(card, gpu, 1, step_overhead_s=0.001 * (i + 1))
    assert len(factory._ROOFLINES) <= factory.ROOFLINES_KEPT
    assert make_step_cost(card, gpu, 1, step_overhead_s=0.0123) is not first  # the least recently used went
