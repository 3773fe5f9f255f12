"""What changes between vLLM releases, as far as start-up memory and engine defaults go: one `Release` per
version, read from each release's code (the released wheels, `vllm/worker`, `vllm/v1/worker`,
`vllm/engine/arg_utils.py`, `vllm/v1/sample`) and checked against the real start-up logs in
`tests/data/vllm_startup/logs.yaml`. `docs/memory.md` has the derivation of every rule with its file and line.

An engine string is `vllm` (the current release), `vllm@0.11` (the last patch of 0.11), `vllm@0.11.0` (that
release) or `vllm@0.9.2:v0` (the V0 engine of a release that still ships it: T4/V100 and bitsandbytes fall
back to it in 0.8-0.10).

The accounting families (how `determine_available_memory` / `determine_num_available_blocks` counts):
  free-delta  V0 <= 0.6.3   peak = free memory at init - free after profiling (no empty_cache): weights, the
                            torch pool at the peak and everything non-torch since init
  absolute    V0 0.6.4, V1 0.7.0-0.9.0   absolute torch peak (weights + buffers + activation) + device-wide
                            non-torch memory (the CUDA context included)
  snapshot    V0 0.6.5-0.10, V1 0.9.1-0.26   weights + torch peak increase during profiling + non-torch
                            increase since a snapshot; buffers made before profiling are not counted
  consumed    V1 0.27+      free memory consumed since the snapshot (weights, buffers, non-torch) + the
                            transient part of the torch peak
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from capacity.errors import ConfigError

Version = tuple[int, int, int]
Accounting = Literal["free-delta", "absolute", "snapshot", "consumed"]

# The last patch of every minor release the model knows (from PyPI's release list); `vllm@0.6` means 0.6.6.
LAST_PATCH: dict[tuple[int, int], int] = {
    (0, 4): 3, (0, 5): 5, (0, 6): 6, (0, 7): 3, (0, 8): 5, (0, 9): 2, (0, 10): 2, (0, 11): 2,
    **{(0, m): 0 for m in range(12, 34)},
}
OLDEST: Version = (0, 4, 0)
NEWEST: Version = (0, 33, 0)
# The release `vllm` means without a version: the newest release whose code this model was read from.
CURRENT: Version = NEWEST
# Releases whose accounting was checked against real start-up logs (the rest is read from code only and
# carries wider ranges): see bench/memory_logs.py.
# (major, minor, runner) of every release line with a scored log in tests/data/vllm_startup.
LOG_CHECKED = {(0, 6, "v0"), (0, 7, "v0"), (0, 8, "v0"), (0, 10, "v1"), (0, 11, "v1"), (0, 19, "v1")}


def fmt(v: Version) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True)
class Release:
    """One vLLM release and engine (V0/V1), with every version-dependent rule the memory model uses."""

    version: Version
    runner: Literal["v0", "v1"]

    @property
    def label(self) -> str:
        return f"vllm@{fmt(self.version)}" + (":v0" if self.runner == "v0" and self.version >= (0, 8, 0) else "")

    @property
    def checked(self) -> bool:
        """Whether this release's accounting was compared with real start-up logs."""
        return (*self.version[:2], self.runner) in LOG_CHECKED

    # ---- accounting ------------------------------------------------------------------------------
    @property
    def accounting(self) -> Accounting:
        v = self.version
        if self.runner == "v0":
            if v <= (0, 6, 3):
                return "free-delta"
            return "absolute" if v == (0, 6, 4) else "snapshot"
        if v <= (0, 9, 0):
            return "absolute"
        return "snapshot" if v < (0, 27, 0) else "consumed"

    @property
    def hybrid_kv(self) -> bool:
        """Sliding-window layers get their own KV groups (the hybrid allocator, V1 0.9.1+); before, and in V0,
        every layer holds every token."""
        return self.runner == "v1" and self.version >= (0, 9, 1)

    @property
    def encoder_output_padded(self) -> bool:
        """0.11.0-0.11.2 pad each dummy encoder output to the whole encoder budget."""
        return self.runner == "v1" and (0, 11, 0) <= self.version < (0, 12, 0)

    @property
    def cuda_graphs_in_budget_default(self) -> bool:
        """VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20 (V1 only)."""
        return self.runner == "v1" and self.version >= (0, 20, 0)

    @property
    def cuda_graphs_in_budget_possible(self) -> bool:
        return self.runner == "v1" and self.version >= (0, 18, 0)

    @property
    def model_runner_v2(self) -> bool:
        """Model Runner V2 (`vllm/v1/worker/gpu/`) for dense models: the default from 0.26 (0.22-0.25 for a few
        architectures only, modelled as V1)."""
        return self.runner == "v1" and self.version >= (0, 26, 0)

    # ---- the dummy sampler run -------------------------------------------------------------------
    def sampler_rows(self, max_num_seqs: int, mnbt: int) -> int:
        """Rows of full-vocabulary logits in the profiling run's sampler phase."""
        if self.runner == "v0":
            return min(max_num_seqs, mnbt)  # one prompt group per sequence, the last token of each sampled
        if self.version <= (0, 7, 2):
            return mnbt  # logits of every token, no sampler (gpu_model_runner.profile_run)
        if self.version == (0, 7, 3):
            return max_num_seqs
        return min(max_num_seqs, mnbt)

    def sampler_bytes_per_logit(self, d: float, rows: int, dense: bool) -> tuple[float, float]:
        """(bytes per logit at the sampler peak, the optimistic end where the path depends on the install).

        d: the model dtype's bytes (the raw logits). The sort path (PyTorch top-k/top-p) holds the raw logits,
        an fp32 copy, the sorted values (fp32) and indices (int64), and the sort's temporaries: for >= 128 rows
        torch's segmented sort allocates reverse indices (int64) and CUB a third keys and values buffer
        (fp32 + int64) = d + 36; for fewer rows the full-sort fallback costs d + 48. FlashInfer and the Triton
        top-k/top-p kernel mask in place: raw, fp32, masked/probs, noise = d + 12.
        """
        v, small = self.version, rows < 128
        sort = d + (48 if small else 36)
        if self.runner == "v0":
            if v < (0, 5, 5):
                return 3 * d + 24, 3 * d + 24  # no fp32 copy: raw, sorted, alternate keys in the model dtype
            if v < (0, 6, 3):
                return d + 38, d + 38  # the post-sort phase (gather and inverse index) is the larger
            return sort, sort
        if v <= (0, 7, 3):
            return d, d  # logits only
        if self.model_runner_v2 and dense:
            return (d + 12, d + 4) if v >= (0, 33, 0) else (d + 4, d + 4)  # Gumbel-max in Triton; 0.33 adds FlashInfer
        if v < (0, 9, 0):
            return sort, sort
        if v <= (0, 11, 0):
            return sort, d + 12  # FlashInfer's sampler when flashinfer is installed (the Docker image), else sort
        if v < (0, 17, 0):
            return sort, sort  # FlashInfer opt-in only (VLLM_USE_FLASHINFER_SAMPLER)
        if rows >= 8:
            return d + 12, d + 12  # Triton top-k/top-p (0.17+), FlashInfer by default (0.21+)
        return sort, sort

    def triton_topk_buffer(self, rows: int, vocab: int, sm_count: int) -> int:
        """The persistent fp32 scratch of the Triton top-k/top-p kernel (0.17+): min(pow2(min(N, SMs)), SMs) x V."""
        if self.runner != "v1" or self.version < (0, 17, 0) or rows < 8 or self.model_runner_v2:
            return 0
        size = 1 << max(0, (min(rows, sm_count) - 1).bit_length())
        return min(size, sm_count) * vocab * 4

    def output_bin_counts(self, max_num_seqs: int, vocab: int, dense: bool) -> int:
        """Model Runner V2's persistent penalty state: int32 [max_num_seqs, V]; counted from 0.27."""
        if self.model_runner_v2 and dense and self.version >= (0, 27, 0):
            return 4 * max_num_seqs * vocab
        return 0

    @property
    def hidden_states_alive_in_sampler(self) -> bool:
        """Whether the profile's [max_num_batched_tokens, hidden] output stays referenced during the sampler."""
        return self.runner == "v0" or self.version >= (0, 9, 2)

    def fused_moe_chunk(self, configured: int) -> int | None:
        """Tokens the fused-MoE kernel processes at once (VLLM_FUSED_MOE_CHUNK_SIZE): none before 0.5.5 (None),
        32768 to 0.11, 16384 0.12-0.17, no chunking from 0.18 (None). A configured value other than the default
        wins."""
        if configured != 32768:
            return configured
        if self.version >= (0, 18, 0) or self.version < (0, 5, 5):  # fused_moe.py chunks from 0.5.5
            return None
        return 16384 if self.version >= (0, 12, 0) else 32768

    @property
    def moe_workspace_persistent(self) -> bool:
        """Whether the fused-MoE workspaces stay allocated after the forward pass (a cached workspace) and so
        coexist with the sampler phase."""
        return self.runner == "v1" and self.version >= MOE_WORKSPACE_PERSISTENT_FROM

    # ---- defaults --------------------------------------------------------------------------------
    def default_chunked_prefill(self, max_model_len: int, multimodal: bool = False, sliding: bool = False) -> bool:
        """V1 always chunks; V0 switches chunked prefill on by itself for contexts over 32k (from 0.5.5), but
        not for multimodal models or models with a sliding window."""
        if self.runner == "v1":
            return True
        return self.version >= (0, 5, 5) and max_model_len > 32768 and not multimodal and not sliding

    @property
    def default_async_scheduling(self) -> bool:
        """Async scheduling on a GPU unless asked otherwise, from 0.14.0: its release notes, "Async scheduling is
        now enabled by default" (vllm-project/vllm pull request 27614; 0.13 and earlier need --async-scheduling,
        which arrived in 0.10.0: capacity/engine/vllm/flags.py). 0.32's VllmConfig, read line by line, turns it on
        when nothing incompatible is set (pooling models, some speculative methods, PP on the V1 runner)."""
        return self.runner == "v1" and self.version >= (0, 14, 0)

    def default_prefix_caching(self) -> bool:
        return self.runner == "v1"

    def default_limits(self, *, chunked: bool, max_model_len: int, usage: str, gpu_gib: float,
                       device_name: str, large: bool | None, multimodal: bool = False) -> tuple[int, int, bool]:
        """(max_num_seqs, max_num_batched_tokens, whether the large-GPU rule applied), as arg_utils picks them.
        `large` forces the rule (None: the release's own test on the GPU's memory and device name)."""
        name = device_name.lower()
        v = self.version
        if self.runner == "v0":
            # without chunking a multimodal model's budget is at least _MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS
            # (config.py: 4096 in 0.6.0-0.6.2, 5120 from 0.6.3; none in 0.5)
            floor = (5120 if v >= (0, 6, 3) else 4096 if v >= (0, 6, 0) else 2048) if multimodal else 2048
            mnbt = (512 if v <= (0, 6, 4) else 2048) if chunked else max(max_model_len, floor)
            return 256, mnbt, False
        if large is None:
            if v < (0, 8, 0):
                large = False
            elif v < (0, 8, 5):
                large = "h100" in name or "h200" in name
            elif v < (0, 9, 0):
                large = gpu_gib >= 70
            else:
                large = gpu_gib >= 70 and "a100" not in name
        huge = v >= (0, 28, 0) and gpu_gib >= 160
        if v < (0, 8, 0):
            seqs = 1024
        elif v < (0, 8, 4):
            seqs = 1024
        else:
            seqs = 1024 if (large or huge) else 256
        if huge:
            mnbt = 16384
        else:
            mnbt = {("serve", True): 8192, ("llm", True): 16384, ("serve", False): 2048, ("llm", False): 8192}[
                (usage, bool(large))]
        if not chunked:
            mnbt = max(max_model_len, 2048)
        return seqs, mnbt, bool(large or huge)


# From 0.14 the default unquantised MoE path is a modular kernel whose buffers live in the worker's
# WorkspaceManager (created in init_device, sized by the first forward, never freed); 0.10.2-0.13 allocate the
# intermediate caches per call (fused_experts_impl) and free them before the sampler runs.
MOE_WORKSPACE_PERSISTENT_FROM: Version = (0, 14, 0)

_SPEC = re.compile(r"^(?P<name>[a-z][a-z0-9_-]*)(?:@(?P<ver>[^:]+))?(?::(?P<runner>v0|v1))?$")


def parse_engine(spec: str) -> tuple[str, str | None, str | None]:
    """'vllm@0.11.0:v0' -> ('vllm', '0.11.0', 'v0'); a malformed string is an error naming it."""
    m = _SPEC.match(spec.strip().lower())
    if not m:
        raise ConfigError(f"engine {spec!r}: expected NAME, NAME@VERSION or NAME@VERSION:v0 (e.g. vllm@0.11)")
    return m["name"], m["ver"], m["runner"]


def release(version: str | None, runner: str | None = None) -> Release:
    """The Release for a version string ('0.11', '0.11.0', 'current' or None = the current release)."""
    if version in (None, "current", "latest"):
        v = CURRENT
    else:
        m = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?(?:\.?post\d+|rc\d+|\.dev.*)?", version)
        if not m:
            raise ConfigError(f"engine version {version!r}: expected MAJOR.MINOR or MAJOR.MINOR.PATCH (e.g. 0.11)")
        major, minor = int(m[1]), int(m[2])
        if (major, minor) not in LAST_PATCH:
            raise ConfigError(f"engine version vllm@{version}: not modelled; known releases are "
                              f"{fmt(OLDEST)} to {fmt(NEWEST)} (use e.g. vllm@0.11, or vllm for the current one)")
        patch = int(m[3]) if m[3] is not None else LAST_PATCH[(major, minor)]
        v = (major, minor, patch)
    default_runner = "v1" if v >= (0, 8, 0) else "v0"
    r = runner or default_runner
    if r == "v0" and v >= (0, 11, 0):
        raise ConfigError(f"engine vllm@{fmt(v)}:v0: the V0 engine was removed in 0.11")
    if r == "v1" and v < (0, 7, 0):
        raise ConfigError(f"engine vllm@{fmt(v)}:v1: the V1 engine starts with 0.7 (VLLM_USE_V1=1)")
    return Release(v, r)  # type: ignore[arg-type]
