"""A measured floor under a hybrid model's state-layer kernels: never faster than NVIDIA measured them (issue 47).

capacity/cost/state_space.py prices the conv + chunked scan of a prefill with an assumed scan efficiency
(`RooflineParams.state_scan_flops_eff`) and a decode step's conv + state update as memory-bound. NVIDIA's
aiconfigurator measured the kernels themselves, per GPU, engine and layer shape on one rank
(capacity/data/state_space_latency.json, written by bench/state_space_latency.py, which names the tables and the
kernels). Where a table exists for the run's GPU and engine (`RooflineParams.allreduce_engine`, the engine the
run simulates; TensorRT-LLM's engine backend reads the PyTorch backend's table), one state layer's
- prefill (causal_conv1d_fn + the chunked scan, gated DeltaNet; the conv alone, Mamba-2) is never faster than the
  table at (batch = the step's prefill chunks, seq_len = their mean new tokens): the engines run both kernels once
  over all chunks (varlen, cu_seqlens), which is what the table's [batch][seq_len] rows time;
- decode (causal_conv1d_update + the recurrent update; the conv alone, Mamba-2) is never faster than the table at
  batch = the decoding sequences (a speculative verify step does at least a decode step's work: same batch).

Lookup, all on the safe side for a floor:
- shape: the exact per-rank shape, else the largest measured shape the run's shape contains (no more heads of
  either kind, same head dims and conv width: the kernels do at least that work), else no floor;
- grid: piecewise linear between grid points; below the first point, the first point; above the last, the last
  point scaled by the ratio (time proportional to work: more than a kernel's fixed cost allows, so conservative).
GPUs and engines without a table (H20, A100, consumer cards; Mamba-2 outside TensorRT-LLM; Mamba-1, short convs,
KDA) keep state_space.py's model alone. docs/fidelity.md, "Measured state-layer kernels", has the numbers.

Also here: the kernels one state layer launches in a decode step, counted from the engines' model code, for the
step's kernel-count floor ((b) of capacity/cost/kernels.py), which counted attention layers only.
"""
from __future__ import annotations

import json
from pathlib import Path

from capacity.model.card import ModelCard

_DATA: dict = {}
TABLE_ENGINE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "trtllm-engine": "trtllm"}


def state_latency_data() -> dict:
    """capacity/data/state_space_latency.json, read once."""
    if not _DATA:
        path = Path(__file__).resolve().parent.parent / "data" / "state_space_latency.json"
        _DATA.update(json.loads(path.read_text()))
    return _DATA


def _interp(xs: list[int], ys: list, x: float) -> float | None:
    """Piecewise-linear in x over the points whose y is known; clamped below, proportional above."""
    pts = [(float(a), float(b)) for a, b in zip(xs, ys) if b is not None]
    if not pts:
        return None
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1] * x / pts[-1][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]  # not reached


def grid_us(entry: dict, batch_axis: list[int], seq_axis: list[int], batch: float, seq: float) -> float | None:
    """The prefill grid [batch][seq_len] at (batch, seq): over seq_len in each batch row, then over batch."""
    per_b = [_interp(seq_axis, row, seq) for row in entry["prefill"]]
    return _interp(batch_axis, per_b, batch)


def _key(k: str) -> tuple[int, ...]:
    return tuple(int(x) for x in k.split("/"))


def pick_shape(shapes: dict, key: tuple[int, ...], kind: str) -> str | None:
    """The exact shape, else the largest measured shape contained in `key` (module docstring), else None.
    Gated DeltaNet keys are (num_k_heads, head_k_dim, num_v_heads, head_v_dim, d_conv); Mamba-2's (conv_dim, d_conv)."""
    exact = "/".join(str(x) for x in key)
    if exact in shapes:
        return exact
    best: tuple[tuple[int, ...], str] | None = None
    for k in shapes:
        t = _key(k)
        if kind == "gated_deltanet":
            ok = t[1] == key[1] and t[3] == key[3] and t[4] == key[4] and t[0] <= key[0] and t[2] <= key[2]
            size = (t[2] * t[3] + 2 * t[0] * t[1], t[2])
        else:
            ok = t[1] == key[1] and t[0] <= key[0]
            size = (t[0], 0)
        if ok and (best is None or size > best[0]):
            best = (size, k)
    return best[1] if best else None


class StateFloor:
    """The measured time of one state layer's conv + scan (prefill) and conv + state update (decode) on one rank."""

    def __init__(self, entry: dict, batch_prefill: list[int], seq: list[int], batch_decode: list[int],
                 label: str) -> None:
        self.entry = entry
        self.label = label  # e.g. "h200 sglang 0.5.14 gated_deltanet 2/128/4/128/4"
        self._bp, self._seq, self._bd = batch_prefill, seq, batch_decode
        self._decode_memo: dict[int, float] = {}

    def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
        """One layer's measured conv + scan of a step's prefill chunks ((new, cached) each)."""
        new = [n for n, _ in chunks if n > 0]
        if not new:
            return 0.0
        us = grid_us(self.entry, self._bp, self._seq, float(len(new)), sum(new) / len(new))
        return 0.0 if us is None else us * 1e-6

    def decode_s(self, seqs: int) -> float:
        """One layer's measured conv update + state update for `seqs` decoding sequences."""
        if seqs <= 0:
            return 0.0
        got = self._decode_memo.get(seqs)
        if got is None:
            us = _interp(self._bd, self.entry["decode"], float(seqs))
            got = self._decode_memo[seqs] = 0.0 if us is None else us * 1e-6
        return got


def rank_key(card: ModelCard, tp: int) -> tuple[str, tuple[int, ...]] | None:
    """(table kind, shape key on one rank) of the card's state layers, or None where no table measures its kind."""
    st = card.state
    if st is None:
        return None
    if st.kind == "gated_deltanet":  # heads: value heads (dv = head_dim); groups: key heads (dk = state_size)
        if st.groups % tp or st.heads % tp:
            return None
        return "gated_deltanet", (st.groups // tp, st.state_size, st.heads // tp, st.head_dim, st.conv_kernel)
    if st.kind == "mamba2":  # as StateSpaceCost: groups padded up to tp where tp does not divide them
        ng = st.groups + (0 if st.groups % tp == 0 else tp - st.groups)
        conv_dim = (st.heads // tp) * st.head_dim + 2 * (ng // tp) * st.state_size
        return "mamba2", (conv_dim, st.conv_kernel)
    return None


def state_floor(card: ModelCard, gpu_name: str, tp: int, engine: str) -> StateFloor | None:
    """The measured floor of the card's state layers on `gpu_name` (catalogue name) under `engine`, or None where
    aiconfigurator has no table for them (state_space.py's model alone)."""
    rk = rank_key(card, tp)
    data = state_latency_data()
    tables = data["gpus"].get(gpu_name, {}).get(TABLE_ENGINE.get(engine, engine))
    if rk is None or tables is None or rk[0] not in tables:
        return None
    kind, key = rk
    shape = pick_shape(tables[kind], key, kind)
    if shape is None:
        return None
    return StateFloor(tables[kind][shape], data["batch_prefill"], data["seq"], data["batch_decode"],
                      f"{gpu_name} {TABLE_ENGINE.get(engine, engine)} {tables['version']} {kind} {shape}")


def state_layer_kernels(card: ModelCard) -> int:
    """Kernels one state layer launches in a decode step (its input norm included; its MLP is counted apart), from
    the engines' model code (docs/fidelity.md, "Measured state-layer kernels"):
    - gated DeltaNet (vLLM model_executor/models/qwen3_next.py Qwen3NextGatedDeltaNet.forward and _forward_core,
      SGLang srt/models/qwen3_next.py Qwen3GatedDeltaNet.forward + GDNAttnBackend.forward_decode): the input norm,
      in_proj_qkvz, in_proj_ba, the split/reorder of q, k, v, z, b, a (SGLang's fused_qkvzba_split_reshape_cat),
      causal_conv1d_update, the gated recurrent update (fused_sigmoid_gating_delta_rule_update), the gated
      RMSNorm (RMSNormGated) and out_proj: 8. (SGLang runs in_proj_ba on a second stream below 1,024 tokens; it is
      still launched.) KDA (Kimi Linear) is counted as gated DeltaNet, a lower count than its extra projections;
    - Mamba-2 (model_executor/layers/mamba/mamba_mixer2.py MambaMixer2.forward): the input norm, in_proj,
      causal_conv1d_update, selective_state_update, the gated RMSNorm (Mixer2RMSNormGated), out_proj: 6;
    - Mamba-1 (mamba_mixer.py MambaMixer.forward): the input norm, in_proj, causal_conv1d_update, x_proj, dt_proj,
      selective_state_update, out_proj: 7;
    - short convolutions (LFM2, models/lfm2.py ShortConv): the input norm, in_proj, the B x gate, the conv update,
      the C x gate, out_proj: 6."""
    st = card.state
    if st is None:
        return 0
    return {"gated_deltanet": 8, "kda": 8, "mamba2": 6, "mamba": 7}.get(st.kind, 6)


def state_eager_ops(card: ModelCard) -> tuple[int, int]:
    """(kernel-launching calls, view ops) of one state layer's eager custom op in a vLLM V1 piecewise step, or (0, 0)
    for a card without state layers. vLLM's piecewise graphs split at the state layers' ops as at attention
    (config/compilation.py `_attention_ops`: vllm::mamba_mixer2, mamba_mixer, short_conv, linear_attention,
    gdn_attention(_core), kda_attention), so each runs eagerly between two graph replays. Counted as the decode path's
    two kernels (the conv update and the state update: causal_conv1d_update and selective_state_update /
    fused_recurrent_gated_delta_rule) and 3 views, FlashAttention's count (capacity/cost/piecewise.py): a lower
    count than the op's Python holds (its metadata slicing, the gating kernel of some releases)."""
    return (2, 3) if card.state is not None else (0, 0)

