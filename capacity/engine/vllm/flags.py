"""Which vLLM release has which engine flag: the settings capacity exposes that a pinned release (`vllm@0.6`) may
lack, each with the last release known WITHOUT it, the first known WITH it and where that comes from (a pull
request, a release's notes, a release's own engine-arguments page). `check` refuses a setting the pinned release
lacks in one line naming the field, the value, the release and the flag (`async_scheduling true: vllm@0.6.6 has
no --async-scheduling (added in 0.10.0, vllm-project/vllm#19970)`). docs/vllm-releases.md has the table
and the settings left unchecked.

Only absence with evidence is refused: a flag is refused on releases up to `absent_through` (a release whose
engine arguments are known to lack it, or one released before the pull request adding it was opened); a flag
added later is taken to stay (the choice lists below only grew). Between `absent_through` and the first release
known to have it the setting is accepted: the gap is written in `since`. `vllm` without a version (the current
release, 0.33) is refused one value only: `kv_cache_dtype: int8`, which no release read has (not even the current
main's `CacheDType`); every other gate ends by 0.13.

Launch-command spelling that changed with the release (`spelling_*` below) is decided here too and used by
capacity/engine/vllm/engine.py's launch_command and capacity/engine/speculative.py's launch_flags.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capacity.engine.vllm.release import NEWEST, Release, Version, fmt
from capacity.errors import ConfigError

# Release dates the sources below are compared with (PyPI's release history of vllm; 0.9.2 and 0.10.0 as their
# release notes date them).
RELEASED = {(0, 4, 0): "2024-03-30", (0, 6, 2): "2024-09-25", (0, 7, 3): "2025-02-20", (0, 9, 2): "2025-07-07",
            (0, 10, 0): "2025-07-23"}
DOCS = "https://docs.vllm.ai/en"


@dataclass(frozen=True)
class Gate:
    """One setting value a release may lack."""

    field: str  # the configuration field (as the one-line error names it)
    value: str  # its value as printed (`true`, `64`, `eagle3`)
    flag: str  # vLLM's flag (the spelling of the releases that have it)
    absent_through: Version  # the newest release known to lack it
    since: str  # the first release known to have it (a range where not pinned)
    source: str  # where both come from
    applies: Callable[[Any], bool]  # whether a VllmConfig sets this value
    runner: str | None = None  # only this engine (V1) of a release lacks it
    hint: str = ""  # what to do instead, appended to the error
    ref: str = ""  # the short citation the error names (default: the source's first words)
    absent_from: Version = (0, 0, 0)  # for a flag removed and later restored: the first release without it

    def why(self) -> str:
        """The parenthesis of the one-line error: where the flag starts and the evidence."""
        ref = self.ref or self.source.split(" (")[0]
        if self.since == "none known" or self.absent_from > (0, 0, 0):
            return ref
        return f"added in {self.since}, {ref}"


def _block(size: int) -> Callable[[Any], bool]:
    return lambda c: c.block_size == size


def _spec(*methods: str) -> Callable[[Any], bool]:
    return lambda c: c.speculative is not None and c.speculative.method in methods


ASYNC_ABSENT_THROUGH: Version = (0, 9, 2)
NOTES = "https://github.com/vllm-project/vllm/releases/tag"
GATES: tuple[Gate, ...] = (
    Gate("async_scheduling", "true", "--async-scheduling", ASYNC_ABSENT_THROUGH, "0.10.0",
         f"{NOTES}/v0.10.0 (Engine Core: 'Experimental async scheduling `--async-scheduling` flag ... (#19970)'; "
         "not in 0.9.2's notes of 2025-07-07; vllm-project/vllm#19970 opened 2025-06-23)",
         lambda c: c.async_scheduling is True, ref="vllm-project/vllm#19970"),
    Gate("policy", "priority", "--scheduling-policy priority", (0, 6, 2), "0.6.3",
         "vllm-project/vllm#8956 (EngineArgs.scheduling_policy, opened 2024-09-30, after 0.6.2's release on "
         "2024-09-25; the priority policy itself #5958); xorbitsai/inference#2700: 'since version 0.6.3'",
         lambda c: c.policy == "priority", ref="vllm-project/vllm#8956"),
    Gate("policy", "priority", "--scheduling-policy priority", (0, 9, 1), "0.9.2 (V1)",
         f"{NOTES}/v0.9.2 (Engine Core: 'Priority Scheduling is now implemented in V1 engine (#19057)')",
         lambda c: c.policy == "priority", runner="v1",
         hint="; its V0 engine has it (e.g. vllm@0.8.5:v0)", ref="vllm-project/vllm#19057"),
    *(Gate("block_size", str(bs), f"--block-size {bs}", (0, 6, 3), "0.6.4 to 0.9.0 (not pinned)",
           f"{DOCS}/v0.6.3.post1/models/engine_args.html (--block-size {{8,16,32}}, as in v0.4.2 and v0.5.3); "
           f"{DOCS}/v0.9.0/api/vllm/config.html (BlockSize = Literal[1, 8, 16, 32, 64, 128])",
           _block(bs), ref="0.6.3's --block-size choices are 8, 16, 32")
      for bs in (1, 64, 128)),
    Gate("block_size", "256", "--block-size 256", (0, 10, 0), "a release after 0.10.0 (not pinned)",
         f"{DOCS}/v0.10.0/api/vllm/config.html (BlockSize = Literal[1, 8, 16, 32, 64, 128])",
         _block(256), ref="0.10.0's BlockSize is 1 to 128"),
    Gate("kv_cache_dtype", "int8", "--kv-cache-dtype int8", NEWEST, "none known",
         f"not a choice in any release checked: {DOCS}/v0.4.2/models/engine_args.html ({{auto,fp8}}), v0.5.3, "
         "v0.6.3.post1, v0.6.6.post1, v0.8.1, v0.8.4 ({auto,fp8,fp8_e5m2,fp8_e4m3}), v0.9.0, v0.10.0 (CacheDType); "
         "vllm/config/cache.py `CacheDType` on main at commit 002f10e (2026, after 0.33: auto, float16, bfloat16, "
         "fp8*, nvfp4*, turboquant_*, int4/int8/fp8_per_token_head; no plain int8, and int8_per_token_head keeps "
         "per-token scales capacity does not model)",
         lambda c: c.kv_cache_dtype == "int8", hint="; use fp8",
         ref="not a vLLM --kv-cache-dtype choice in any release checked, 0.4.2 to the current main"),
    Gate("speculative.method", "eagle3", "--speculative-config '{\"method\":\"eagle3\",...}'", (0, 8, 4), "0.8.5",
         "vLLM v0.8.5 release notes, V1 Engine: 'EAGLE-3 Support (#16937)'", _spec("eagle3"),
         ref="vllm-project/vllm#16937"),
    *(Gate("speculative.method", m, "--speculative-config", (0, 7, 3), "0.8.0",
           "vllm-project/vllm#14434 (--speculative-config, opened 2025-03-07, after 0.7.3's release on 2025-02-20); "
           "before it --speculative-model / --num-speculative-tokens (vllm-project/vllm#3706), which capacity "
           "writes for draft_model only", _spec(m), ref="vllm-project/vllm#14434",
           hint="; capacity writes the older --speculative-model spelling for method draft_model only")
      for m in ("eagle", "mtp")),
    Gate("speculative.method", "draft_model", "--speculative-model", (0, 4, 0), "0.4.1",
         "vllm-project/vllm#3706 (--speculative-model, --num-speculative-tokens; merged 2024-04-03, after 0.4.0's "
         "release on 2024-03-30)", _spec("draft_model"), ref="vllm-project/vllm#3706"),
    Gate("speculative.method", "draft_model", "a draft-model proposer", (0, 13, 0),
         "a release after 0.13.0 (vllm-project/vllm#24322)",
         f"{NOTES}/v0.10.0 (V0's 'Spec Decode workers (#21152)' removed); vllm-project/vllm#22047 (0.10.0 raises "
         "NotImplementedError for a draft model, 0.9.2 ran it); vllm-project/vllm#31883 (0.13.0: 'Speculative decoding "
         "with draft model is not supported yet'); vllm-project/vllm#24322 brings it to V1", _spec("draft_model"),
         absent_from=(0, 10, 0), ref="removed in 0.10.0 with V0's spec-decode workers, vllm-project/vllm#21152, "
         "#22047; still missing in 0.13.0, #31883; back with #24322",
         hint="; pin 0.9.2 or older, or a release after 0.13"),
)


def check(rel: Release, cfg: Any) -> None:
    """Refuse, in one line, a setting of `cfg` (a VllmConfig) that release `rel` lacks (the current release only for
    kv_cache_dtype int8, which no vLLM has)."""
    for g in GATES:
        if (g.absent_from <= rel.version <= g.absent_through and (g.runner is None or g.runner == rel.runner)
                and g.applies(cfg)):
            engine = f"the V1 engine of {rel.label}" if g.runner else rel.label
            raise ConfigError(f"{g.field} {g.value}: {engine} has no {g.flag} ({g.why()}){g.hint}")


# ---- launch-command spelling by release ----------------------------------------------------------------------
# --no-enable-prefix-caching: 0.6.3.post1's engine arguments have `--enable-prefix-caching` only (store_true, off by
# default in V0); 0.8.4's list has --no-enable-prefix-caching (Cloudera AI's supported-arguments page for 0.8.4).
NO_PREFIX_CACHING_ABSENT_THROUGH: Version = (0, 6, 3)
# --speculative-model / --num-speculative-tokens until vllm-project/vllm#15466 removed them (opened 2025-03-25,
# "after the next release" that shipped #14434): 0.8.2 and older still take them.
LEGACY_SPECULATIVE_THROUGH: Version = (0, 8, 2)
# The V1 engine before 0.8 is opt-in (VLLM_USE_V1=1; release.py: the V1 engine starts with 0.7); V1 is the default
# from 0.8 (docs.vllm.ai/en/v0.10.0/usage/v1_guide.html: "To disable V1 ... VLLM_USE_V1=0").
V1_DEFAULT_FROM: Version = (0, 8, 0)


def spelling_async(rel: Release) -> bool:
    """Whether the launch command may write --async-scheduling / --no-async-scheduling for this release (a release
    before the flag schedules synchronously, so `false` needs no flag there)."""
    return rel.version > ASYNC_ABSENT_THROUGH


def spelling_no_prefix_caching(rel: Release) -> bool:
    """Whether prefix caching off is written --no-enable-prefix-caching (else left out: off is the default)."""
    return rel.version > NO_PREFIX_CACHING_ABSENT_THROUGH


def spelling_legacy_speculative(rel: Release) -> bool:
    """Whether a draft model is written --speculative-model/--num-speculative-tokens (not --speculative-config)."""
    return rel.version <= LEGACY_SPECULATIVE_THROUGH


def v1_env(rel: Release) -> list[str]:
    """The environment a release's engine needs: VLLM_USE_V1=1 for V1 before 0.8, VLLM_USE_V1=0 for V0 after."""
    if rel.runner == "v1" and rel.version < V1_DEFAULT_FROM:
        return ["VLLM_USE_V1=1"]
    if rel.runner == "v0" and rel.version >= V1_DEFAULT_FROM:
        return ["VLLM_USE_V1=0"]
    return []


def describe() -> list[tuple[str, str, str, str, str]]:
    """(setting, flag, absent through, first release, source) for every gate: the docs' table."""
    return [(f"{g.field} {g.value}" + (" (V1)" if g.runner else ""), g.flag, fmt(g.absent_through), g.since, g.source)
            for g in GATES]


__all__ = ["GATES", "Gate", "check", "describe", "spelling_async", "spelling_legacy_speculative",
           "spelling_no_prefix_caching", "v1_env"]
