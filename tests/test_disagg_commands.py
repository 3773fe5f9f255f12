"""`capacity disagg --tune`'s simulate lines, built in capacity.plan.disagg_commands (issue 50 item 4)."""
from __future__ import annotations


def test_the_tuned_disagg_winner_is_one_simulate_line():
    """`capacity disagg --tune` prints each winner as the `capacity simulate` line that runs it: the prefill role's
    searched settings as flags, the decode role's as --decode-set over the ones given."""
    from capacity.plan.disagg_commands import settings_text, simulate_command

    r = {"aggregated": False, "prefill": (2, 1), "decode": (1, 2), "max_rate": 3.456,
         "settings": {"prefill": {"max_num_batched_tokens": 8192}, "decode": {"max_num_seqs": 512}}}
    assert simulate_command(r, "-m llama-3.1-8b", "ib-400", ["max_num_seqs = 256", "block_size=32"]) == (
        "capacity simulate -m llama-3.1-8b --tp 1 --disagg 2:1 --decode-tp 2 --link ib-400 "
        "--max-num-batched-tokens 8192 --decode-set max_num_seqs=512 --decode-set block_size=32 --rate 3.46")
    agg = {"aggregated": True, "prefill": (4, 2), "max_rate": 10.0, "settings": {"engine": {"max_num_seqs": 64}}}
    assert simulate_command(agg, "-m x", "nvlink", []) == "capacity simulate -m x --tp 2 --replicas 4 --max-num-seqs 64 --rate 10.00"
    assert settings_text(r["settings"]) == "prefill max_num_batched_tokens=8192; decode max_num_seqs=512"
    assert settings_text({"engine": {}}) == ""
