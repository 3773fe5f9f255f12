"""SGLang's memory defaults and pool terms, release line by release line: the default `--mem-fraction-static` F,
`--chunked-prefill-size`, `--cuda-graph-max-bs`, the vision-language cut of F, the speculative-decoding reserve,
the multimodal reservation taken from the pool (0.5.18+), and the dtype of the rotary cos/sin cache that loads
with the weights. Read in the PyPI wheels (`python/sglang/srt/server_args.py` `__post_init__`, from 0.5.3
`_handle_gpu_memory_settings`, from 0.5.19 `arg_groups/memory_hook.py`; `model_executor/model_runner.py`
`profile_max_num_token`, from 0.5.9 `model_runner_kv_cache_mixin.py`, from 0.5.17 `mem_cache/kv_cache_configurator.py`
`_profile_available_bytes`; `layers/rotary_embedding.py`) of 0.3.0, 0.3.1, 0.3.2, 0.3.4, 0.3.5, 0.3.6,
0.3.6.post3, 0.4.0, 0.4.1, 0.4.2.post4, 0.4.3, 0.4.4, every 0.4.x patch from 0.4.5, 0.4.9.post3, 0.4.10, 0.5.1-0.5.6,
0.5.8-0.5.10, 0.5.12, 0.5.15, 0.5.17-0.5.20 and 0.5.23; docs/sglang.md has the table of terms per line.

A release takes the rules of the latest line (`RELEASES`, each named by its first release) at or before it. GPU
memory (`gpu_mem`) is what SGLang reads with nvidia-smi (`get_nvgpu_memory_capacity`, MiB, the smallest GPU of
the host); capacity passes the catalogue's total, a little below it, so F comes out 0.001-0.003 low (the safe side).
"""
from __future__ import annotations

import re

from capacity.engine.served import version_key as served_version_key
from capacity.errors import ConfigError
from capacity.model.card import ModelCard
from capacity.model.families.registry import traits
from capacity.units import DTYPE_BYTES

RELEASES = ("0.3.0", "0.3.1", "0.3.2", "0.3.6", "0.4.0", "0.4.2", "0.4.3", "0.4.4.post1", "0.4.5", "0.4.5.post3", "0.4.6",
            "0.4.6.post2", "0.4.7", "0.4.7.post1", "0.4.9", "0.4.9.post3", "0.5.2", "0.5.3", "0.5.5", "0.5.8", "0.5.10",
            "0.5.15", "0.5.18", "0.5.20")  # 0.4.4.post1, 0.5.8: sglang/dpattn.py, swa.py
NEWEST_READ = "0.5.23"
CURRENT = "0.5.20"  # `sglang` without a version: the rules of the newest release read
MiB = 1 << 20
Line = tuple[int, int, int, int]
# ServerArgs' TP table (0.3.0-0.4.6.post1; 0.4.6-0.4.7 up to 80 GiB): F by tp (x pp from 0.4.6), largest first
_TP_TABLE = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
_TP8 = {(0, 3, 0, 0): 0.83, (0, 3, 6, 0): 0.82}  # 0.3.0-0.3.5: 0.83 at TP 8; 0.3.6.x: 0.82; 0.81 from 0.4.0
# SGLang's --speculative-algorithm of each capacity method (capacity.engine.speculative.launch_flags)
SPEC_ALGORITHM = {"eagle": "EAGLE", "mtp": "EAGLE", "eagle3": "EAGLE3", "draft_model": "STANDALONE"}
VLM_CACHE_MIB = 100  # SGLANG_VLM_CACHE_SIZE_MB's default (environ.py, 0.5.9-0.5.23)


def version_key(v: str) -> Line:
    """'0.4.6.post2' -> (0, 4, 6, 2): the one release parser (capacity.engine.served.version_key)."""
    return served_version_key(v)


def parse_release(spec: str) -> str:
    """`sglang` (the newest rules read) or `sglang@X.Y[.Z][.postN]`: the release line whose rules apply (the
    latest line at or before it)."""
    if spec == "sglang":
        return CURRENT
    m = re.fullmatch(r"sglang@(\d+\.\d+(?:\.\d+)?(?:\.?post\d+)?)", spec)
    if not m:
        raise ConfigError(f"engine {spec!r}: use sglang or sglang@X.Y[.Z][.postN]")
    v = version_key(m[1])
    if v < (0, 3, 0, 0):
        raise ConfigError(f"engine {spec!r}: SGLang releases before 0.3 are not modelled (their memory code was not "
                          "read)")
    if v > version_key(NEWEST_READ) and v[:2] > version_key(NEWEST_READ)[:2]:
        raise ConfigError(f"engine {spec!r}: newer than the newest SGLang release read ({NEWEST_READ}); use sglang "
                          "for its rules")
    return max((r for r in RELEASES if version_key(r) <= v), key=version_key)


def _line(release: str) -> Line:
    return version_key(release)


def default_chunked_prefill_size(gpu_mem_mib: float, release: str = CURRENT) -> int:
    """SGLang's default --chunked-prefill-size for a GPU of this much memory: 8,192 on any GPU to 0.3.5; 2,048
    under 25,000 MiB from 0.3.6 (16,384 over 180,000 MiB in 0.4.7); from 0.4.7.post1 2,048 under 35 GiB, 8,192
    under 160 GiB, 16,384 above; from 0.5.3 4,096 for 35-60 GiB; from 0.5.20 4,096 for 20-35 GiB too."""
    gib, line = gpu_mem_mib / 1024, _line(release)
    if line < (0, 3, 6, 0):
        return 8192
    if line < (0, 4, 7, 0):
        return 2048 if gpu_mem_mib < 25000 else 8192
    if line < (0, 4, 7, 1):
        return 16384 if gpu_mem_mib > 180_000 else 2048 if gpu_mem_mib < 25000 else 8192
    if line < (0, 5, 3, 0):
        return 2048 if gib < 35 else 8192 if gib < 160 else 16384
    if gib < 20:
        return 2048
    if gib < 35:
        return 4096 if line >= (0, 5, 20, 0) else 2048
    if gib < 60:
        return 4096
    if gib < 160:
        return 8192
    return 16384


def default_cuda_graph_max_bs(gpu_mem_mib: float, tp: int, release: str = CURRENT) -> int:
    """SGLang's default --cuda-graph-max-bs (the decode graph's max_bs from 0.5.20): 160 to 0.3.5; from 0.3.6 4
    under 25,000 MiB; from 0.4.0 8 (80 at TP >= 4) under 25,000 MiB, from 0.4.7.post1 under 35 GiB; from 0.5.3 by
    GPU class (16 / 24 from 0.5.5 / 48 from 0.5.20 at 20-35 GiB and TP < 4; 256 / 512 over 60 GiB)."""
    gib, line = gpu_mem_mib / 1024, _line(release)
    if line < (0, 3, 6, 0):
        return 160
    if line < (0, 4, 0, 0):
        return 4 if gpu_mem_mib < 25000 else 160
    if line < (0, 5, 3, 0):
        small = gpu_mem_mib < 25000 if line < (0, 4, 7, 1) else gib < 35
        return (8 if tp < 4 else 80) if small else 160
    if gib < 20:
        return 8
    if gib < 35:
        if line >= (0, 5, 20, 0):
            return 48 if tp < 4 else 160
        return (24 if line >= (0, 5, 5, 0) else 16) if tp < 4 else 80
    if gib < 60:
        return 32 if tp < 4 else 160
    if gib < 160:
        return 256 if tp < 4 else 512
    return 512


def piecewise_graph_tokens(max_tokens: int) -> list[int]:
    """The prefill (piecewise) CUDA graph's capture sizes up to max_tokens (server_args.py
    `_generate_piecewise_cuda_graph_tokens`, 0.5.10): 58 sizes at 8,192, 42 at 2,048."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [x for x in sizes if x <= max_tokens]


def vlm_fraction_factor(card: ModelCard, release: str) -> float:
    """How SGLang lowers F for a vision-language model: x 0.90 in 0.4.9-0.4.9.post2; from 0.4.9.post3
    `adjust_mem_fraction_for_vlm`: x 0.95 x clamp(1 - 0.1 (L H^2 / (24 x 1024^2) - 1), 0.8, 1.05), with L and H
    the config's vision_config.num_hidden_layers (24 when absent: Qwen2.5-VL says `depth`) and hidden_size.
    Gemma-3 and Llama-4 run text-only unless --enable-multimodal (mm_disabled_models): no change."""
    v = card.vision
    if v is None or _line(release) < (0, 4, 9, 0) or traits(card.architecture).sglang_text_only:
        return 1.0
    if _line(release) < (0, 4, 9, 3):
        return 0.90
    layers = v.config_layers or 24
    ratio = layers * v.hidden_size ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def spec_reserve_mib(algorithm: str | None, line: Line) -> float:
    """MiB the default F reserves for speculative decoding (`algorithm`: SGLang's --speculative-algorithm): none
    before 0.4.7.post1 (0.4.7 cuts F instead: `spec_fraction`); 2 GiB for any algorithm in 0.4.7.post1-0.5.1;
    from 0.5.2 STANDALONE 6 GiB, NGRAM none, the EAGLE family 2 GiB (4 GiB in 0.5.10-0.5.12, read; 0.5.13-0.5.14
    take that line's rule, the larger); none from 0.5.15 (read in 0.5.15, 0.5.17-0.5.23)."""
    if algorithm is None or line < (0, 4, 7, 1) or line >= (0, 5, 15, 0):
        return 0.0
    if line < (0, 5, 2, 0):
        return 2048.0
    if algorithm == "STANDALONE":
        return 6144.0
    if algorithm == "NGRAM":
        return 0.0
    return 4096.0 if line >= (0, 5, 10, 0) else 2048.0


def _table(n: int, line: Line) -> float:
    f = next(f for k, f in _TP_TABLE if n >= k)
    if f == 0.81 and line < (0, 4, 0, 0):
        return _TP8[(0, 3, 6, 0) if line >= (0, 3, 6, 0) else (0, 3, 0, 0)]
    return f


def default_mem_fraction_static(gpu_mem_mib: float, tp: int = 1, release: str = CURRENT, pp: int = 1,
                                chunked_prefill_size: int | None = None, cuda_graph_max_bs: int | None = None,
                                *, mla: bool = False, piecewise: bool = True, dp: int = 1,
                                vlm_factor: float = 1.0, amd: bool = False, speculative: str | None = None,
                                deepep: bool = False) -> float:
    """SGLang's default --mem-fraction-static for a GPU with this much memory (nvidia-smi's total, MiB), as each
    release line chooses it. `dp` > 1: DP attention over dp ranks; `piecewise`: whether the prefill CUDA graph is
    on (0.5.10+; off for vision models, DP attention, PP and AMD); `vlm_factor`: `vlm_fraction_factor`;
    `speculative`: SGLang's --speculative-algorithm (EAGLE, EAGLE3, STANDALONE, NGRAM) or None; `deepep`:
    --moe-a2a-backend deepep, whose buffers 0.5.15+ reserve 2 GiB for (`deepep_reserve_mib`)."""
    gib = gpu_mem_mib / 1024
    line, tpp = _line(release), tp * pp
    if line < (0, 4, 5, 3):
        return _table(tp, line)
    if line < (0, 4, 6, 2):
        return _table(tp, line) if gpu_mem_mib <= 81920 else (gpu_mem_mib - 13 * 1024) / gpu_mem_mib
    if line < (0, 4, 7, 1):
        f = _table(tpp, line) if gpu_mem_mib <= 81920 else 0.88
        if line >= (0, 4, 7, 0) and gpu_mem_mib > 180_000 and not amd:
            return 0.79
        if gpu_mem_mib > 96 * 1024:
            top = 20 if line >= (0, 4, 7, 0) and speculative else 18  # 0.4.7: 20 GiB with speculative decoding
            return min(f + 48 * 1024 * (1 - f) / gpu_mem_mib, (gpu_mem_mib - top * 1024) / gpu_mem_mib)
        return f * 0.95 if line >= (0, 4, 7, 0) and speculative else f
    spec = spec_reserve_mib(speculative, line)
    if line < (0, 5, 3, 0):
        reserved_gib = (2.8 + tpp / 10 if gib < 35 else 9.5 + tpp / 2 if gib < 90 else 12 + tpp / 2 if gib < 160 else 32)
        if dp > 1:
            reserved_gib += 4
        return round((gpu_mem_mib - reserved_gib * 1024 - spec) / gpu_mem_mib, 3) * vlm_factor
    chunk = chunked_prefill_size or default_chunked_prefill_size(gpu_mem_mib, release)
    graph_bs = cuda_graph_max_bs or default_cuda_graph_max_bs(gpu_mem_mib, tp, release)
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tpp / 8 * 1024
    if dp > 1:
        reserved += graph_bs * dp * 3 + (graph_bs * dp * 1.5 if graph_bs > 300 else 0)
    if line >= (0, 5, 10, 0) and piecewise and dp <= 1 and pp <= 1 and not amd and vlm_factor == 1.0:
        reserved += 1.5 * 1024 if mla else len(piecewise_graph_tokens(chunk)) * 8
    if gib > 60:
        reserved = max(reserved, 10 * 1024)
    reserved += deepep_reserve_mib(deepep, line)  # on top of the 10 GiB floor
    return round((gpu_mem_mib - reserved - spec) / gpu_mem_mib, 3) * vlm_factor


def deepep_reserve_mib(deepep: bool, line: Line) -> float:
    """MiB the default F keeps for DeepEP's all-to-all buffers: 2 GiB from 0.5.15 with --moe-a2a-backend deepep
    (`ServerArgs._handle_gpu_memory_settings` in the 0.5.15 wheel, `reserve_for_deepep_a2a_mb` in 0.5.17's
    server_args.py and 0.5.23's `arg_groups/memory_hook.py`: "DeepEP all-to-all buffers captured in the decode
    graph are real extra allocations, so reserve them on top of the floor", added after the 10 GiB floor when the
    decode CUDA graph is not disabled and the node is not a prefill-only one; absent in 0.5.14). 0.5.17+ add 1 GiB
    more with DeepEP when the prefill graph is the BREAKABLE backend, which only embedding models take by default:
    not counted.
    `_handle_a2a_moe`, which turns the CUDA graphs off for --deepep-mode normal, runs after it, so the normal mode
    keeps the 2 GiB too. capacity does not pass --disable-cuda-graph to the default F: with it SGLang keeps 2 GiB
    less than counted here (the safe side)."""
    return 2048.0 if deepep and line >= (0, 5, 15, 0) else 0.0


def mm_reservation_bytes(card: ModelCard, release: str) -> float:
    """Bytes 0.5.18+ takes from the pool's budget for a multimodal model's embedding cache, allocated after the
    pool (`kv_cache_configurator.py` `mm_runtime_reservation_gb`: SGLANG_VLM_CACHE_SIZE_MB, 100 by default, plus
    SGLANG_MM_FEATURE_CACHE_MB with the cuda_ipc / cuda_vmm feature transport, not the default): rest = A - T0 (1
    - F) - 100 MiB. None for a text model, for one run text-only (Gemma-3, Llama-4) and before 0.5.18 (0.5.17 read)."""
    if card.vision is None or _line(release) < (0, 5, 18, 0) or traits(card.architecture).sglang_text_only:
        return 0.0
    return VLM_CACHE_MIB * MiB


def rope_cache_factor(card: ModelCard, release: str, amd: bool = False) -> float:
    """What SGLang's rotary cos/sin cache weighs against the card's (max positions x rotary dim in the compute
    dtype, vLLM's): from 0.4.2 (0.4.2.post4 read; 0.4.1 uses vLLM's get_rope) `layers/rotary_embedding.py` keeps
    it in float32 on CUDA ("cache needs to be in FP32 for numerical stability"), so 4 / dtype bytes; on ROCm
    the dtype's. Gemma-3 (0.4.4.post2-0.5.9; no earlier release loads it) runs transformers-style `Gemma3RotaryEmbedding` (inv_freq only, no
    cache): 0; from 0.5.10 its attention takes `get_rope` again (float32)."""
    line = _line(release)
    if card.architecture == "gemma3" and line < (0, 5, 10, 0):  # every release that loads it (0.4.4.post2+)
        return 0.0
    return 1.0 if line < (0, 4, 2, 0) or amd else 4 / DTYPE_BYTES[card.dtype]


def refusal(release: str) -> str:
    """What SGLang says when the weights leave no pool: `init_memory_pool`'s RuntimeError when the token count is
    <= 0 (0.3.0-0.5.12), from 0.5.15 first `_profile_available_bytes`' ValueError when the rest is <= 0."""
    if _line(release) >= (0, 5, 15, 0):
        return "'Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=...'"
    return "'Not enough memory. Please try to increase --mem-fraction-static'"


__all__ = ["CURRENT", "NEWEST_READ", "RELEASES", "SPEC_ALGORITHM", "default_chunked_prefill_size",
           "deepep_reserve_mib", "default_cuda_graph_max_bs", "default_mem_fraction_static",
           "mm_reservation_bytes", "parse_release",
           "piecewise_graph_tokens", "refusal", "rope_cache_factor", "spec_reserve_mib", "version_key", "vlm_fraction_factor"]
