"""SGLang's DeepEP buffers (`--moe-a2a-backend deepep`, 0.4.x `--enable-deepep-moe`; `--deepep-mode`): the bytes
DeepEP's `Buffer` takes on one rank, and when SGLang allocates them.

SGLang (read in the PyPI wheels of 0.4.10, 0.5.3, 0.5.6 and 0.5.23: `layers/moe/token_dispatcher/deepep.py`
`DeepEPBuffer.get_deepep_buffer`, 0.4.10 `layers/moe/ep_moe/token_dispatcher.py`): the buffer is made once, lazily,
by the first dispatch (`_get_buffer`), i.e. in the first forward after the KV pool is sized (CUDA-graph capture or
the first batch): it comes out of SGLang's reserve T0 x (1 - F), not out of the pool. Its sizes:

- normal (or auto) mode: num_nvl_bytes = max over the dispatch and combine configs (`Buffer.get_dispatch_config` /
  `get_combine_config(group size)`, or --deepep-config) of `Config.get_nvl_buffer_size_hint(hidden x 2, ranks)`;
  num_rdma_bytes of `get_rdma_buffer_size_hint` (0 within one node of <= 8 ranks);
- low-latency (or auto) mode: num_rdma_bytes = max(that, `Buffer.get_low_latency_rdma_size_hint(
  num_max_dispatch_tokens_per_rank, hidden, ranks, num_experts)`), num_max_dispatch_tokens_per_rank =
  SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128 by default, at most 1024);
- the group is the tensor-parallel group, and --moe-a2a-backend deepep sets ep_size = tp_size
  (server_args.py `_handle_a2a_moe`).

DeepEP (deepseek-ai/DeepEP, `csrc/config.hpp` read at commit 030cdf0; `deep_ep/buffer.py`: `Buffer.num_sms = 20`,
intranode configs `Config(num_sms, 6, 256, 6, 128)`; `csrc/kernels/configs.cuh` NUM_MAX_NVL_PEERS 8,
NUM_BUFFER_ALIGNMENT_BYTES 128; `internode.cu` SourceMeta 8 bytes):

- NVL hint: channels = num_sms / 2, nvl ranks = min(ranks, 8), rdma ranks = max(ranks / 8, 1), recv = the config's
  num_max_nvl_chunked_recv_tokens (256 within a node): channels x nvl x [(2 rdma + 3) x 4 + recv x (hidden bytes +
  8 + 128 x 8 + 128 x 4 + 128 x 4)], rounded up to 128;
- low-latency hint: scales = hidden / 128; dispatch message 16 + max(2 hidden, hidden + 4 scales); combine message
  4 scales + 2 hidden; send = max(T x dispatch, E x T x combine); recv = max(E x T x dispatch, E x T x combine);
  signalling = align(E x 8 + E / ranks x 4, 128); total 2 x (send + recv + signalling), rounded up to 128. (Older
  DeepEP releases have a combine message of 2 hidden and E x 4 signalling bytes: a little less.)

The RDMA bytes live in NVSHMEM's symmetric heap (`internode::alloc`, `nvshmem_align`). DeepEP's `Buffer` sets
NVSHMEM_CUMEM_GRANULARITY to 2^29 before `nvshmem_init` (`deep_ep/buffer.py`: "NVSHMEM initialization requires
at least 256 MiB"; also NVSHMEM's documented default), and NVSHMEM maps its heap with cuMemCreate in granules of
that size, so the RDMA buffer occupies whole 512 MiB granules (`nvshmem_heap_bytes`; DeepSeek-V3's 1,820 MiB
low-latency buffer takes 2,048). NVSHMEM's own symmetric objects (its g_buf, teams, psync) share the heap and can
push a buffer that ends near a granule's edge into one more; the 32 MiB of DeepEP's workspace and its pinned host
counters are not counted. Normal and auto modes over more than one node (> 8 ranks) are refused.
"""
from __future__ import annotations

from capacity.errors import ConfigError
from capacity.model.card import ModelCard

NUM_SMS = 20  # deep_ep Buffer.num_sms
NVL_PEERS = 8  # NUM_MAX_NVL_PEERS
NVL_RECV_TOKENS = 256  # Config(num_sms, 6, 256, 6, 128): num_max_nvl_chunked_recv_tokens within a node
ALIGN = 128  # NUM_BUFFER_ALIGNMENT_BYTES and the hints' rounding
SOURCE_META = 8  # sizeof(SourceMeta)
MAX_TOPK = MAX_SCALES = 128  # kNumMaxTopK, kNumMaxScales
DEFAULT_DISPATCH_TOKENS = 128  # SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK
MODES = ("auto", "normal", "low_latency")
NVSHMEM_GRANULE = 2**29  # NVSHMEM_CUMEM_GRANULARITY as deep_ep/buffer.py sets it


def _round(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def nvl_bytes(hidden_bytes: int, ranks: int, num_sms: int = NUM_SMS, recv: int = NVL_RECV_TOKENS) -> int:
    """Config.get_nvl_buffer_size_hint (see the module docstring)."""
    channels, nvl, rdma = num_sms // 2, min(ranks, NVL_PEERS), max(ranks // NVL_PEERS, 1)
    per_token = hidden_bytes + SOURCE_META + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4
    return _round(channels * nvl * ((2 * rdma + 3) * 4 + recv * per_token))


def low_latency_bytes(tokens: int, hidden: int, ranks: int, experts: int) -> int:
    """Buffer.get_low_latency_rdma_size_hint: LowLatencyLayout.total_bytes, rounded to 128."""
    scales = hidden // 128
    dispatch_msg = 16 + max(hidden * 2, hidden + scales * 4)
    combine_msg = scales * 4 + hidden * 2
    send = max(tokens * dispatch_msg, experts * tokens * combine_msg)
    recv = max(experts * tokens * dispatch_msg, experts * tokens * combine_msg)
    signal = _round(experts * 8 + experts // ranks * 4)
    return (2 * (send + recv + signal) + ALIGN) // ALIGN * ALIGN


def nvshmem_heap_bytes(rdma_bytes: int) -> int:
    """What NVSHMEM's symmetric heap maps for DeepEP's RDMA buffer: whole granules of 2^29 bytes (none without
    one)."""
    return -(-rdma_bytes // NVSHMEM_GRANULE) * NVSHMEM_GRANULE


def deepep_buffer_bytes(card: ModelCard, ranks: int, mode: str, tokens: int = DEFAULT_DISPATCH_TOKENS) -> float:
    """num_nvl_bytes + the NVSHMEM heap num_rdma_bytes maps, of SGLang's DeepEPBuffer on one rank (ranks: the tp
    group)."""
    if card.moe is None:
        raise ConfigError(f"moe_a2a_backend deepep: {card.name} has no MoE layers")
    if mode not in MODES:
        raise ConfigError(f"deepep_mode {mode!r}: SGLang's are {', '.join(MODES)}")
    if not 0 < tokens <= 1024:
        raise ConfigError(f"deepep_max_dispatch_tokens_per_rank {tokens}: SGLang asserts 1 to 1024")
    nvl = rdma = 0
    if mode != "low_latency":
        if ranks > NVL_PEERS:
            raise ConfigError(f"deepep_mode {mode}: DeepEP's normal buffers over {ranks} ranks (more than one node) are "
                              "not modelled; use low_latency")
        nvl = nvl_bytes(card.hidden_size * 2, ranks)  # params_bytes 2 (bf16 activations)
    if mode != "normal":
        if card.moe.num_experts % ranks:
            raise ConfigError(f"moe_a2a_backend deepep: {card.moe.num_experts} experts do not divide over {ranks} ranks "
                              "(SGLang asserts num_experts % group size == 0)")
        rdma = max(rdma, low_latency_bytes(tokens, card.hidden_size, ranks, card.moe.num_experts))
    return float(nvl + nvshmem_heap_bytes(rdma))


def deepep_note(b: float, reserve: float, mode: str) -> str:
    """Where the buffers go (the reserve, at the first forward) and how much of it they take."""
    return (f"DeepEP ({mode}): {b / 2**30:.2f} GiB of buffers a rank made at the first MoE dispatch, after the pool is "
            f"sized: out of the reserve T0 x (1 - F) = {reserve / 2**30:.2f} GiB (the RDMA part in NVSHMEM's 512 MiB granules)")


__all__ = ["DEFAULT_DISPATCH_TOKENS", "MODES", "NVSHMEM_GRANULE", "deepep_buffer_bytes", "deepep_note", "low_latency_bytes",
           "nvl_bytes", "nvshmem_heap_bytes"]
