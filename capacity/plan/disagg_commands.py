"""The `capacity simulate` line that reproduces each tuned winner of `capacity disagg --tune` (capacity.plan.disagg's
`best_aggregated` / `best_disaggregated`), with each role's searched settings as flags."""
from __future__ import annotations

from typing import Any

FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens"}


def settings_text(settings: dict[str, dict[str, Any]]) -> str:
    """`prefill max_num_seqs=64, ...; decode ...` (empty: the settings as given)."""
    return "; ".join(f"{role} " + ", ".join(f"{k}={v}" for k, v in kv.items()) for role, kv in settings.items() if kv)


def simulate_command(r: dict[str, Any], args: str, link: str, decode_set: list[str]) -> str:
    """One tuned layout `r` as a `capacity simulate` command: `args` the model, GPU and lengths as given;
    `decode_set` the --decode-set KEY=VALUE pairs as given (checked), under the decode role's searched ones."""
    st = r["settings"]
    own = "".join(f" {FLAGS[k]} {v}" for k, v in st.get("engine", st.get("prefill", {})).items())
    n, tp = r["prefill"]
    if r["aggregated"]:
        return f"capacity simulate {args} --tp {tp} --replicas {n}{own} --rate {r['max_rate']:.2f}"
    d, tp_d = r["decode"]
    given = {k.strip(): v.strip() for k, v in (x.split("=", 1) for x in decode_set)}
    dec = "".join(f" --decode-set {k}={v}" for k, v in {**given, **st["decode"]}.items())
    return (f"capacity simulate {args} --tp {tp} --disagg {n}:{d} --decode-tp {tp_d} --link {link}"
            f"{own}{dec} --rate {r['max_rate']:.2f}")
