"""The calibration stack's kernels are right on every device this machine has (the CPU always; a CUDA GPU
when there is one): the padded, batched decode attention and the cached prefill chunk match plain
per-sequence attention, so does paged attention over a scattered pool (calibrate/paged.py: the reference
kernel on a CPU, FlashAttention varlen on a GPU), FP8 GEMMs (per tensor, and in blocks: calibrate/fp8.py)
match the product of their dequantised operands, and on a GPU the quick suite writes a profile tagged with
the GPU and a whole step replayed as a CUDA graph samples the same tokens as the eager step. On a machine without CUDA the GPU-only
tests are skipped; `bench/device_run.sh` runs this file on the GPU."""
import math

import pytest

from capacity.errors import ConfigError
from tests.conftest import MODELS

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda:0"] if CUDA else [])
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")


@pytest.fixture(scope="module")
def tiny():
    from capacity.model.card import load_model_card

    return load_model_card(MODELS / "tiny.yaml")


def reference_attention(q, k, v, q_positions):
    """Plain softmax attention in float64: q [n, Hq, d], k/v [T, Hk, d]; query i sees keys 0..q_positions[i]."""
    hq, hk = q.shape[1], k.shape[1]
    qf, kf, vf = q.double(), k.double().repeat_interleave(hq // hk, dim=1), v.double().repeat_interleave(hq // hk, dim=1)
    scores = torch.einsum("nhd,thd->hnt", qf, kf) / math.sqrt(q.shape[-1])
    t = torch.arange(k.shape[0], device=q.device)
    scores = scores.masked_fill(t[None, None, :] > q_positions[None, :, None], float("-inf"))
    return torch.einsum("hnt,thd->nhd", scores.softmax(-1), vf).reshape(q.shape[0], -1)


@pytest.mark.parametrize("dev", DEVICES)
def test_padded_decode_attention_matches_per_sequence_attention(dev, tiny):
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, dev, max_context=256)
    s = stack.s
    g = torch.Generator(device=dev).manual_seed(3)
    contexts = [5, 40, 17]  # each sequence's position; padded to the longest
    st = stack.prepare([], contexts, gen_seed=1)
    kv = st["decode_kv"]
    b = len(contexts)
    q = torch.randn(b, s.q_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    kn = torch.randn(b, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    vn = torch.randn(b, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    with torch.inference_mode():
        out = stack.attention_decode(q, kn, vn, kv, st["decode_pos"], st["decode_mask"])
        for i, pos in enumerate(contexts):
            k_i, v_i = kv[0, i, :, :pos + 1].transpose(0, 1), kv[1, i, :, :pos + 1].transpose(0, 1)
            assert torch.equal(k_i[pos], kn[i]) and torch.equal(v_i[pos], vn[i])  # the new token was written
            ref = reference_attention(q[i:i + 1], k_i, v_i, torch.tensor([pos], device=dev))
            assert torch.allclose(out[i].double(), ref[0], atol=3e-2, rtol=3e-2), (dev, i)


@pytest.mark.parametrize("dev", DEVICES)
def test_cached_prefill_chunk_matches_causal_attention_over_prefix(dev, tiny):
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, dev, max_context=256)
    s = stack.s
    g = torch.Generator(device=dev).manual_seed(4)
    c, cached = 12, 30
    kv = torch.randn(2, s.kv_heads, cached + c, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    q = torch.randn(c, s.q_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    kn = torch.randn(c, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    vn = torch.randn(c, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    with torch.inference_mode():
        out = stack.attention_prefill(q, kn, vn, kv, cached)
    k_all, v_all = kv[0].transpose(0, 1), kv[1].transpose(0, 1)
    assert torch.equal(k_all[cached:], kn) and torch.equal(v_all[cached:], vn)
    ref = reference_attention(q, k_all, v_all, torch.arange(cached, cached + c, device=dev))
    assert torch.allclose(out.double(), ref, atol=3e-2, rtol=3e-2)


# ---- paged attention (calibrate/paged.py): FlashAttention varlen on a GPU, the reference kernel on a CPU ----
MIXED_STEP = ([(30, 10), (17, 0)], [5, 40, 15, 16, 0])  # a chunk on cached keys, a whole prompt; decodes
# that end just before, on and after a 16-token page boundary, and one with no cached key


@pytest.mark.parametrize("dev", DEVICES)
def test_paged_attention_matches_per_sequence_attention(dev, tiny):
    """One call over a scattered paged pool gives every sequence plain causal attention over its own keys,
    after writing the new K/V to the slots its block table names (flash on a GPU, the reference on a CPU)."""
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, dev, max_context=256, attention="paged")
    assert stack.attn_kernel == ("flash" if dev.startswith("cuda") else "reference")
    s, (prefills, decodes) = stack.s, MIXED_STEP
    seqs = prefills + [(1, d) for d in decodes]
    st = stack.paged_step(seqs, torch.Generator(device=dev).manual_seed(5))
    n = sum(c for c, _ in seqs)
    g = torch.Generator(device=dev).manual_seed(6)
    q = torch.randn(n, s.q_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    kn = torch.randn(n, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    vn = torch.randn(n, s.kv_heads, s.head_dim, generator=g, device=dev, dtype=stack.dtype)
    owned = [p for i, (c, k) in enumerate(seqs) for p in st.block_table[i, :-(-(c + k) // st.page)].tolist()]
    assert len(owned) == len(set(owned)) == st.pool_k.shape[0]  # every page once, none shared
    with torch.inference_mode():
        out = stack.attention_paged(q, kn, vn, st)
    start = 0
    for i, (c, cached) in enumerate(seqs):
        pages = st.block_table[i, :-(-(c + cached) // st.page)].long()
        k_i = st.pool_k[pages].reshape(-1, s.kv_heads, s.head_dim)[:c + cached]
        v_i = st.pool_v[pages].reshape(-1, s.kv_heads, s.head_dim)[:c + cached]
        assert torch.equal(k_i[cached:], kn[start:start + c]) and torch.equal(v_i[cached:], vn[start:start + c])
        ref = reference_attention(q[start:start + c], k_i, v_i, torch.arange(cached, cached + c, device=dev))
        assert torch.allclose(out[start:start + c].double(), ref, atol=3e-2, rtol=3e-2), (dev, i)
        start += c


@pytest.mark.parametrize("dev", DEVICES)
def test_a_paged_step_computes_what_the_padded_step_computes_on_the_same_keys(dev, tiny):
    """The whole forward pass with paged attention equals the padded SDPA stack's, given the same weights and the
    same cached keys: positions, sequence order and slots line up end to end."""
    from calibrate.stack import DecoderStack

    prefills, decodes = MIXED_STEP
    padded = DecoderStack(tiny, dev, max_context=256, attention="sdpa")
    paged = DecoderStack(tiny, dev, max_context=256, attention="paged")
    sp, pp = padded.prepare(prefills, decodes, gen_seed=1), paged.prepare(prefills, decodes, gen_seed=1)
    pool_k = pp["paged"].pool_k.view(-1, padded.s.kv_heads, padded.s.head_dim)
    pool_v = pp["paged"].pool_v.view(-1, padded.s.kv_heads, padded.s.head_dim)
    table, page = pp["paged"].block_table, pp["paged"].page

    def copy(i, kv, positions):  # sequence i's cached keys (kv: [2, Hk, T, d]) into its pages
        for p in positions:
            slot = int(table[i, p // page]) * page + p % page
            pool_k[slot], pool_v[slot] = kv[0, :, p], kv[1, :, p]

    for i, ((_, cached), kv) in enumerate(zip(prefills, sp["prefill_kv"])):
        copy(i, kv, range(cached))
    for j, d in enumerate(decodes):
        copy(len(prefills) + j, sp["decode_kv"][:, j], range(d))
    finals = {}
    for name, stack, st in (("padded", padded, sp), ("paged", paged, pp)):
        stack.lm_head = lambda x, rows, name=name: finals.__setitem__(name, x.index_select(0, rows).float())
        with torch.inference_mode():
            stack.forward(st)
    assert finals["padded"].shape == finals["paged"].shape == (len(prefills) + len(decodes), padded.s.hidden)
    scale = finals["padded"].abs().max()
    assert (finals["paged"] - finals["padded"]).abs().max() <= 0.03 * scale


def test_the_attention_setting_on_a_cpu(tiny):
    from calibrate.paged import probe_flash
    from calibrate.stack import DecoderStack

    assert DecoderStack(tiny, "cpu", max_context=64).attention == "sdpa"
    auto = DecoderStack(tiny, "cpu", max_context=64, attention="auto")
    assert (auto.attention, auto.attn_kernel) == ("sdpa", "sdpa")  # no paged kernel on a CPU: keep the padded layout
    assert probe_flash(2, 8, 32, "cpu", torch.bfloat16) is None
    with pytest.raises(ConfigError, match="attention-kernel: auto, sdpa or paged"):
        DecoderStack(tiny, "cpu", max_context=64, attention="flash")


def test_the_flash_call_takes_the_pool_as_built(tiny):
    """On meta tensors torch's own argument checks of varlen_attn run without a GPU: the pool's KV heads sit
    where the paged form expects them, and the output has the queries' shape."""
    from calibrate.paged import PagedStep, flash_attention
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, "cpu", max_context=256, attention="paged")
    st = stack.paged_step([(30, 10), (1, 16), (1, 17)])
    meta = PagedStep(**{k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in vars(st).items()})
    q = torch.empty(32, stack.s.q_heads, stack.s.head_dim, device="meta", dtype=stack.dtype)
    assert flash_attention(q, meta).shape == q.shape
    bad = PagedStep(**{**vars(meta), "pool_k": meta.pool_k.transpose(1, 2), "pool_v": meta.pool_v.transpose(1, 2)})
    with pytest.raises(ValueError, match="multiple of kv heads"):
        flash_attention(q, bad)


@needs_cuda
def test_paged_cuda_graph_replay_samples_what_the_eager_step_samples(tiny):
    from calibrate.stack import DecoderStack
    from calibrate.timing import cuda_graph

    stack = DecoderStack(tiny, "cuda:0", max_context=512, attention="paged")
    st = stack.prepare([(64, 0), (16, 100)], [30, 200, 7, 90], gen_seed=2)
    out = {}
    with torch.inference_mode():
        eager = stack.forward(st).clone()
        replay = cuda_graph(lambda: out.__setitem__("tokens", stack.forward(st)), "cuda:0")
        replay()
        torch.cuda.synchronize()
    assert torch.equal(out["tokens"], eager)


@needs_cuda
def test_quick_suite_on_the_gpu_writes_a_profile_for_that_gpu(tiny, tmp_path):
    from calibrate.suite import run_suite
    from capacity.cost.profile import load_profile
    from capacity.model.gpus import match_gpu

    out = tmp_path / "tiny-gpu.json"
    run_suite(tiny, "cuda:0", out, quick=True, progress=False, command="pytest")
    prof = load_profile(out)
    expected = match_gpu(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
    assert prof.provenance.device == "cuda:0" and prof.provenance.gpu == expected
    assert prof.provenance.cuda_version == torch.version.cuda
    assert prof.provenance.cuda_graphs and not any("could not be captured" in n for n in prof.provenance.notes)
    vals = [v for row in prof.linear.values() for v in row] + [v for row in prof.decode_attn for v in row]
    assert vals and all(v is not None and 0 < v < 1.0 for v in vals)
    assert prof.fit is not None and len([st for st in prof.steps if st.role == "holdout"]) >= 3


@needs_cuda
def test_cuda_graph_replay_of_a_step_samples_what_the_eager_step_samples(tiny):
    from calibrate.stack import DecoderStack

    stack = DecoderStack(tiny, "cuda:0", max_context=512)
    st = stack.prepare([(64, 0), (16, 100)], [30, 200, 7, 90], gen_seed=2)
    with torch.inference_mode():
        eager = stack.forward(st).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            stack.forward(st)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = stack.forward(st)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(static_out, eager)


@pytest.mark.parametrize("dev", DEVICES)
def test_quick_suite_for_a_moe_card_fills_the_moe_tables(dev, tmp_path):
    """Every MoE code path of the stack (router, per-expert loop, MoE layer bodies) runs and is usable."""
    import warnings

    from calibrate.suite import run_suite
    from capacity.cost.calibrated import CalibratedCost
    from capacity.cost.profile import to_plan
    from capacity.model.card import load_model_card

    card = load_model_card(MODELS / "tiny-moe.yaml")
    prof = run_suite(card, dev, tmp_path / "moe.json", quick=True, progress=False, command="pytest")
    assert "elementwise" not in prof.linear  # no dense layer: its table is not measured
    grouped = any("grouped GEMMs" in n for n in prof.provenance.notes)
    assert grouped == (dev != "cpu" and prof.provenance.cuda_graphs)  # graphs on a GPU only with grouped GEMMs
    assert dev != "cpu" or not grouped  # the CPU keeps the per-expert loop
    assert not any("could not be captured" in n for n in prof.provenance.notes)
    for fam in ("router", "elementwise_moe", "layer_moe"):
        assert all(v is not None and v > 0 for v in prof.linear[fam]), fam
    assert prof.expert and all(v is not None and v > 0 for v in prof.expert)
    cost = CalibratedCost(prof, card, tp=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small, big = cost.step_s(to_plan([(8, 0)], [])), cost.step_s(to_plan([(256, 0)], [16] * 16))
    assert 0 < small < big


def test_graph_capture_falls_back_to_eager_and_never_hides_out_of_memory():
    from calibrate.timing import maybe_graph

    def fn():
        return 1

    def capture_ok(f, dev):
        return lambda: ("replay", f())

    def capture_fails(f, dev):
        raise RuntimeError("operation not permitted when stream is capturing")

    def capture_oom(f, dev):
        raise torch.OutOfMemoryError("CUDA out of memory")

    assert maybe_graph(fn, "cpu", False, capture_ok) == (fn, False)
    replay, fell_back = maybe_graph(fn, "cpu", True, capture_ok)
    assert replay() == ("replay", 1) and not fell_back
    assert maybe_graph(fn, "cpu", True, capture_fails) == (fn, True)
    with pytest.raises(torch.OutOfMemoryError):
        maybe_graph(fn, "cpu", True, capture_oom)


def test_cuda_graphs_on_a_cpu_is_a_clear_error(tiny):
    from calibrate.suite import run_suite
    from capacity.errors import ConfigError

    with pytest.raises(ConfigError, match="--cuda-graphs: needs a CUDA device"):
        run_suite(tiny, "cpu", None, quick=True, progress=False, cuda_graphs=True)


@pytest.mark.parametrize("dev", DEVICES)
def test_grouped_gemm_moe_equals_the_per_expert_loop(dev):
    """The capturable MoE path (on-device routing, two grouped GEMMs) computes what the loop computes."""
    from calibrate.stack import DecoderStack
    from capacity.model.card import load_model_card

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    stack = DecoderStack(load_model_card(MODELS / "tiny-moe.yaml"), dev, max_context=256)
    layer = stack.layers[0]
    r = torch.randn(37, stack.s.hidden, generator=torch.Generator(device=dev).manual_seed(5), device=dev,
                    dtype=stack.dtype)
    with torch.inference_mode():
        stack.set_moe_impl("loop")
        ref = layer.mlp(r)
        stack.set_moe_impl("grouped")
        got = layer.mlp(r)
        _, _, offs = layer.route_on_device(r)
    assert stack.capturable and int(offs[-1]) == 37 * stack.s.top_k  # every (token, expert) pair placed once
    err = (got.float() - ref.float()).abs().max() / ref.float().abs().max()
    assert err < 0.02, float(err)  # bf16 rounding of the same sums; a misrouted weight is off by ~100%
    with pytest.raises(Exception, match="loop or grouped"):
        stack.set_moe_impl("fused")


# ---- FP8 GEMMs (issue 25): the stack runs what engines run for FP8 checkpoints -----------------------------
@pytest.mark.parametrize("dev", DEVICES)
def test_fp8_projections_match_the_bf16_product_within_fp8_precision(dev, tiny):
    """Each dense projection of an FP8 card runs torch._scaled_mm on e4m3 weights and activations quantised per
    tensor; its output equals the float64 product of the same dequantised weights and the unquantised input to
    within e4m3's precision (3 mantissa bits: ~6% per element, far less after summing 256 products). The CPU
    runs the same code path (slowly) as a rehearsal of the GPU's."""
    from calibrate.stack import DecoderStack, stack_gemm_dtype

    card = tiny.with_overrides(weight_dtype="fp8")
    assert stack_gemm_dtype(card, dev) == "fp8"
    assert stack_gemm_dtype(card.with_overrides(gemm_dtype="bf16"), dev) == "bf16"  # weight-only asked for
    stack = DecoderStack(card, dev, max_context=64)
    lay = stack.layers[0]
    x = torch.randn(8, stack.s.hidden, device=dev, dtype=stack.dtype)
    w8, sw = lay.gate_up_w
    want = x.double() @ (w8.double() * sw.double())
    got = lay.gate_up(x).double()
    assert got.dtype == torch.float64 and lay.gate_up(x).dtype == stack.dtype
    rel = (got - want).norm() / want.norm()
    assert rel < 0.05, float(rel)
    with torch.inference_mode():  # a whole step runs and samples tokens in range
        out = stack.forward(stack.prepare([(8, 0)], [5, 9]))
    assert out.shape[0] == 3 and int(out.max()) < stack.s.vocab


@pytest.mark.parametrize("dev", DEVICES)
def test_fp8_block_projections_match_the_product_of_their_dequantised_operands(dev, tiny):
    """A card with FP8 blocks (quant_group_size 128, DeepSeek/Qwen3 style) runs block scales: 128 x 128 weight
    blocks, activations per token per 128 inputs (the block-scaled kernel on a GPU, the reference on a CPU); each
    projection equals the float64 product of the unquantised input and the dequantised weight to within e4m3's
    precision, and a whole step runs."""
    from calibrate.stack import DecoderStack

    card = tiny.with_overrides(weight_dtype="fp8", quant_group_size=128, intermediate_size=768)
    stack = DecoderStack(card, dev, max_context=64)
    assert stack.block_kernel == ("scaled_mm" if dev.startswith("cuda") else "reference")
    lay = stack.layers[0]
    w8, sw = lay.gate_up_w  # [256, 1536] e4m3 and [round_up(2, 4), 12] scales
    assert w8.shape == (256, 1536) and sw.shape == (4, 12) and sw.stride() == (1, 4)
    dequant = w8.double() * sw[:2].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    x = torch.randn(8, stack.s.hidden, device=dev, dtype=stack.dtype)
    want = x.double() @ dequant
    got = lay.gate_up(x)
    assert got.dtype == stack.dtype and float((got.double() - want).norm() / want.norm()) < 0.05
    with torch.inference_mode():
        out = stack.forward(stack.prepare([(8, 0)], [5, 9]))
    assert out.shape[0] == 3 and int(out.max()) < stack.s.vocab


def test_fp8_block_scales_are_laid_out_as_torchs_kernel_checks_them():
    """On meta tensors torch runs its own checks of the block-scaled kernel's arguments without a GPU: the scale
    shapes and strides the stack builds pass them (a wrong layout fails them, as the last call shows)."""
    import torch.nn.functional as F

    from calibrate.fp8 import quantize_act_blocks, quantize_weight_blocks

    w8, sw = quantize_weight_blocks(torch.randn(384, 640, dtype=torch.bfloat16))  # N 384, K 640: 5 blocks -> 8
    x8, sx = quantize_act_blocks(torch.randn(48, 640, dtype=torch.bfloat16))
    assert sw.shape == (8, 3) and sw.stride() == (1, 8) and sx.shape == (48, 5) and sx.stride() == (1, 48)
    meta = [t.to("meta") for t in (x8, sx, w8, sw)]
    assert [t.stride() for t in meta] == [t.stride() for t in (x8, sx, w8, sw)]
    a, sa, b, sb = meta
    out = F.scaled_mm(a, b, sa, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128,
                      output_dtype=torch.bfloat16)
    assert out.shape == (48, 384)
    with pytest.raises(RuntimeError, match="blockwise scaling"):
        F.scaled_mm(a, b, sa.contiguous(), F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128)


def test_fp8_blocks_that_do_not_divide_the_layer_are_one_error(tiny):
    from calibrate.stack import DecoderStack

    with pytest.raises(ConfigError, match="intermediate_size 688 on this rank is not a multiple of 128"):
        DecoderStack(tiny.with_overrides(weight_dtype="fp8", quant_group_size=128), "cpu", max_context=64)
    with pytest.raises(ConfigError, match="quant_group_size 64: .* 128 x 128 blocks only"):
        DecoderStack(tiny.with_overrides(weight_dtype="fp8", quant_group_size=64), "cpu", max_context=64)


@needs_cuda
def test_fp8_quick_suite_on_the_gpu_records_fp8_gemms_and_captures_graphs(tiny, tmp_path):
    from calibrate.suite import run_suite
    from capacity.cost.profile import load_profile

    out = tmp_path / "tiny-fp8-gpu.json"
    run_suite(tiny.with_overrides(weight_dtype="fp8"), "cuda:0", out, quick=True, progress=False, command="pytest")
    prof = load_profile(out)
    assert prof.provenance.gemm_dtype == "fp8" and prof.provenance.cuda_graphs
    assert not any("could not be captured" in n for n in prof.provenance.notes)


@needs_cuda
def test_nvml_samples_the_gpu_during_a_load_test():
    """On a GPU machine with nvidia-ml-py: SM utilisation, memory, power and clock of GPU 0 are sampled."""
    pytest.importorskip("pynvml")
    from capacity.truth.utilisation import Sampler

    s = Sampler()
    s.sample(0.0)
    row = s.close()["samples"][0]
    assert 0 <= row["gpu0_util_pct"] <= 100 and row["gpu0_mem_used_gib"] > 0 and row["gpu0_power_w"] > 0
