"""Step cost of a hybrid model's state layers (Mamba-2, Mamba, gated DeltaNet, short convolutions) on one TP rank.

The roofline (capacity/cost/roofline.py) costs attention only on a hybrid's attention layers and calls this for
the rest: per state layer, every op is max(flops / (peak x efficiency), bytes / (bandwidth x mem_bw_eff)) +
a kernel launch, as the roofline's own ops. Terms, and the vLLM code each comes from (docs/hybrid.md):

- in_proj / out_proj GEMMs (mamba_mixer2.py MambaMixer2.forward; gdn_linear_attn.py / qwen3_next.py
  Qwen3NextGatedDeltaNet): 2 FLOPs per weight element per token, weights read once, the attention family's
  dtype and efficiency (the loader files these tensors under "attention": capacity/model/weights.py).
- the causal depthwise conv1d (ops/causal_conv1d.py causal_conv1d_fn on prefill, causal_conv1d_update on
  decode): 2 x kernel FLOPs per channel per token; decode reads and writes the conv state (kernel - 1 columns).
- prefill, Mamba-2: the SSD chunked scan (ops/ssd_combined.py _mamba_chunk_scan_combined_fwd) in chunks of the
  config's chunk_size: _bmm_chunk_fwd (C B^T, 2 x groups x l^2 x N per chunk of l tokens), _chunk_state_fwd
  (B^T x, 2 x heads x P x N per token), _state_passing_fwd (elementwise), _chunk_scan_fwd (C x states,
  2 x heads x P x N per token, and the causal intra-chunk product, 2 x heads x P x l(l+1)/2 per chunk).
- prefill, gated DeltaNet: fla/ops/chunk.py chunk_gated_delta_rule_fwd in chunks of 64, per value head and chunk
  of l: chunk_scaled_dot_kkt_fwd (2 l^2 dk), solve_tril (l^3 / 3), recompute_w_u_fwd (2 l^2 (dk + dv)),
  chunk_gated_delta_rule_fwd_h (4 l dk dv), chunk_fwd_o (2 l dk dv + 2 l^2 (dk + dv)).
- prefill, Mamba (Jamba): ops/mamba_ssm.py selective_scan_fn, ~9 FLOPs per (channel, state) per token.
- decode: the state update reads and writes the whole per-sequence state once per token (ops/mamba_ssm.py
  selective_state_update; fla/ops/fused_recurrent.py fused_recurrent_gated_delta_rule): memory-bound.

The scan kernels are Triton kernels whose achieved fraction of the tensor-core peak is not measured here:
`RooflineParams.state_scan_flops_eff` is an assumption (0.3, plausible 0.15-0.6); decode is bandwidth-bound and
does not depend on it. Where NVIDIA's aiconfigurator measured the kernels for the GPU and engine, neither runs
faster than measured (`RooflineParams.measured_state_floor`; capacity/cost/state_space_floor.py). Plain typed Python (called from the compiled roofline; no pydantic, no third-party base).
"""
from __future__ import annotations

from capacity.cost.roofline_params import RooflineParams
from capacity.cost.state_space_floor import StateFloor, state_floor
from capacity.model.card import ModelCard
from capacity.model.gpus import GPU
from capacity.model.weights import weight_bytes_per_rank
from capacity.units import DTYPE_BYTES

GDN_CHUNK = 64  # fla/ops/chunk.py chunk_gated_delta_rule_fwd: chunk_local_cumsum(g, chunk_size=64)


class StateSpaceCost:
    """The state layers of one hybrid model on one GPU at one TP size (all of them together, per rank)."""

    def __init__(self, card: ModelCard, gpu: GPU, tp: int, params: RooflineParams, gemm_peak: float,
                 gemm_eff: float, gemm_format: str) -> None:
        st = card.state
        assert st is not None
        self.card = card
        self.tp = tp
        self.params = params
        self.layers = st.num_layers
        self.kind = "gated_deltanet" if st.kind == "kda" else st.kind  # KDA: a gated delta rule, per-channel decay
        self._bw = gpu.mem_bw_bytes_per_s * params.mem_bw_eff
        self._peak = gpu.peak_flops(card.dtype)
        self._gemm_peak = gemm_peak
        self._gemm_eff = gemm_eff
        self._b = DTYPE_BYTES[card.dtype]  # activations and the conv state (vLLM's mamba_cache_dtype auto)
        self.ssm_b = DTYPE_BYTES[st.ssm_dtype] if st.ssm_dtype else self._b  # the SSM / recurrent state
        w = weight_bytes_per_rank(card, tp)
        n = max(1, st.num_layers)
        self._proj_w = (w.get("state_in_proj", 0.0) + w.get("state_x_proj", 0.0) + w.get("state_dt_proj", 0.0)
                        + w.get("state_out_proj", 0.0)) / n
        self._proj_elems = self._proj_w / DTYPE_BYTES[gemm_format]
        conv_el, ssm_el = st.state_elements(tp)
        k = st.conv_kernel - 1
        self.conv_dim = conv_el // k if k else st.inner // tp  # channels of the depthwise conv on this rank
        self.conv_state_bytes = float(conv_el) * self._b
        self.ssm_state_bytes = float(ssm_el) * self.ssm_b
        h = card.hidden_size
        if st.kind == "mamba2":
            self._heads, self._p, self._n = st.heads // tp, st.head_dim, st.state_size
            ng = st.groups + (0 if st.groups % tp == 0 else tp - st.groups)
            self._groups = ng // tp
            self._inner = self._heads * self._p
            self._proj_act = h + (2 * self._inner + 2 * self._groups * self._n + self._heads) + self._inner + h
            self._chunk = st.chunk_size
        elif self.kind == "gated_deltanet":
            self._heads, self._p, self._n = st.heads // tp, st.head_dim, st.state_size  # value heads, dv, dk
            self._groups = st.groups // tp
            self._inner = self._heads * self._p
            qk = self._groups * self._n
            self._proj_act = h + (2 * qk + 2 * self._inner + 2 * self._heads) + self._inner + h
            self._chunk = GDN_CHUNK
        else:  # mamba (Mamba1), short_conv
            self._heads, self._p, self._n = 1, st.inner // tp, st.state_size if st.kind == "mamba" else 0
            self._groups = 0
            self._inner = st.inner // tp
            self._proj_act = h + 3 * self._inner + h
            self._chunk = 1
        self._prefill_memo: dict[int, tuple[float, float]] = {}
        # never faster than NVIDIA measured these kernels on this GPU and engine (capacity/cost/state_space_floor.py)
        self.floor: StateFloor | None = (state_floor(card, gpu.name, tp, params.allreduce_engine)
                                         if params.measured_state_floor else None)

    # ---- primitives -------------------------------------------------------------------------------
    def _op(self, flops: float, bytes_: float, peak: float, eff: float) -> float:
        return max(flops / (peak * eff), bytes_ / self._bw) + self.params.kernel_launch_s

    # ---- per layer ----------------------------------------------------------------------------------
    def gemm_flops(self, tokens: int) -> float:
        """FLOPs of one state layer's projections over `tokens` rows (2 per weight element per token)."""
        return 2.0 * tokens * self._proj_elems

    def gemm_s(self, tokens: int) -> float:
        """The projections of one state layer over `tokens` rows."""
        if not tokens or not self._proj_w:
            return 0.0
        return self._op(self.gemm_flops(tokens), self._proj_w + tokens * self._proj_act * self._b,
                        self._gemm_peak, self._gemm_eff)

    def scan_flops(self, new: int) -> float:
        """FLOPs of the chunked scan (and conv) of one sequence's `new` prefill tokens in one state layer."""
        if new <= 0:
            return 0.0
        conv = 2.0 * (self.card.state.conv_kernel if self.card.state else 0) * self.conv_dim * new
        full, rest = divmod(new, self._chunk)
        scan = full * self._chunk_flops(self._chunk) + self._chunk_flops(rest)
        if self.kind == "mamba":
            scan = 9.0 * self._inner * self._n * new
        return conv + scan

    def _chunk_flops(self, ln: int) -> float:
        """The chunked scan's FLOPs for one chunk of `ln` tokens (module docstring; 0 for Mamba-1 and short convs)."""
        H, P, N, G = self._heads, self._p, self._n, self._groups
        if ln <= 0:
            return 0.0
        if self.kind == "mamba2":
            return 2.0 * G * ln * ln * N + 4.0 * H * P * N * ln + 2.0 * H * P * ln * (ln + 1) / 2
        if self.kind == "gated_deltanet":
            return H * (6.0 * ln * ln * N + 4.0 * ln * ln * P + ln ** 3 / 3 + 6.0 * ln * N * P)
        return 0.0

    def scan_bytes(self, new: int, cached: int) -> float:
        """Bytes the conv and scan of one prefill chunk move: the conv's input and output, the scan's inputs (x, B,
        C, dt / q, k, v, g, beta), its output, the per-chunk intermediates and the final state (read first where the
        sequence has cached tokens). Mamba-2: the chunk states in fp32, written by _chunk_state_fwd, read and
        written by _state_passing_fwd, read by _chunk_scan_fwd (4 passes), and C B^T in fp32 (_bmm_chunk_fwd writes,
        _chunk_scan_fwd reads). Gated DeltaNet: h per chunk in the activation dtype, written by
        chunk_gated_delta_rule_fwd_h and read by chunk_fwd_o. Mamba-1's selective_scan_fn keeps its states on chip."""
        chunks = -(-new // self._chunk)
        act = new * (2 * self.conv_dim + self.conv_dim + self._inner + self._heads) * self._b
        states = float(chunks * self._heads * self._p * self._n)
        inter = 0.0
        if self.kind == "mamba2":
            inter = 4 * states * 4 + 2.0 * chunks * self._groups * self._chunk * self._chunk * 4
        elif self.kind == "gated_deltanet":
            inter = 2 * states * self._b
        state = (self.ssm_state_bytes + self.conv_state_bytes) * (2 if cached else 1)
        return act + inter + state

    def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
        """One state layer's conv + scan of a step's prefill chunks ((new, cached) each): vLLM runs each kernel once
        over all of them (varlen, cu_seqlens), so FLOPs and bytes add up and the launches (conv, scan, gated
        norm) are paid once."""
        if not chunks:
            return 0.0
        flops = bytes_ = 0.0
        for new, cached in chunks:
            key = new * 2 + (1 if cached else 0)
            got = self._prefill_memo.get(key)
            if got is None:
                got = self._prefill_memo[key] = (self.scan_flops(new), self.scan_bytes(new, cached))
            flops += got[0]
            bytes_ += got[1]
        model = (max(flops / (self._peak * self.params.state_scan_flops_eff), bytes_ / self._bw)
                 + 3.0 * self.params.kernel_launch_s)
        return model if self.floor is None else max(model, self.floor.prefill_s(chunks))

    def decode_state_bytes(self) -> float:
        """Bytes one decoding sequence moves in one state layer: the SSM state and conv state each read and written
        once, plus the token's activations (conv in/out, scan inputs and output)."""
        act = (2 * self.conv_dim + self.conv_dim + self._inner + self._heads) * self._b
        return 2.0 * (self.ssm_state_bytes + self.conv_state_bytes) + act

    def decode_flops(self) -> float:
        """FLOPs of one decoding sequence in one state layer: ~5 per SSM state element (decay, B x, C h), 7 for
        gated DeltaNet (decay, k^T h, the rank-1 update, q h), 2 x kernel per conv channel."""
        k = self.card.state.conv_kernel if self.card.state else 0
        per_el = 7.0 if self.kind == "gated_deltanet" else 5.0
        return per_el * self.ssm_state_bytes / self.ssm_b + 2.0 * k * self.conv_dim

    def decode_s(self, seqs: int, queries: int = 1) -> float:
        """One state layer's conv update + state update for `seqs` decoding sequences (one batched kernel each)."""
        if seqs <= 0:
            return 0.0
        model = self._op(seqs * queries * self.decode_flops(), seqs * self.decode_state_bytes(), self._peak,
                         self.params.attn_flops_eff) + self.params.kernel_launch_s
        return model if self.floor is None else max(model, self.floor.decode_s(seqs))

    # ---- the step -----------------------------------------------------------------------------------
    def scan_step_s(self, prefills: list[tuple[int, int]], decodes: int, queries: int = 1) -> float:
        """All state layers' conv + scan for a step's prefill chunks ((new, cached) each) and decoding sequences."""
        return self.layers * (self.prefill_s(prefills) + self.decode_s(decodes, queries))

    def gemm_step_s(self, tokens: int) -> float:
        return self.layers * self.gemm_s(tokens)


def state_note(card: ModelCard, profile: str | None = None) -> list[str]:
    """What a roofline run of a hybrid assumes about its state layers (printed with every simulation of one)."""
    st = card.state
    if st is None or profile is not None:
        return []
    eff = RooflineParams().state_scan_flops_eff
    return [f"hybrid: {st.num_layers} {st.kind} state layers costed as docs/hybrid.md derives from vLLM's kernels "
            f"(prefill scan at {eff:g} of the GPU's peak, an assumption: 0.15-0.6 plausible; decode reads and writes "
            f"each sequence's state, bandwidth-bound), never faster than NVIDIA's measured kernels where "
            f"capacity/data/state_space_latency.json has the GPU, engine and shape (gated DeltaNet on H100 SXM, H200, "
            f"B200, L40S; Mamba-2's conv under TensorRT-LLM), the model alone elsewhere; attention on "
            f"{card.num_kv_layers} layers only"]
