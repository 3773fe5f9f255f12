"""The check both unseen serving rounds (tests/test_serving_unseen_v2.py, _v3.py) make of every transcribed run:
its `capacity simulate` arguments parse and type-check, or the run says why capacity cannot express it."""
import pytest

from bench import serving_unseen as su


def check_command_parses_or_reason_given(run: dict) -> None:
    if not run["expressible"]:
        assert run.get("reason"), "a run capacity cannot express says why"
        with pytest.raises(ValueError, match="not expressible"):
            su.simulate_args(run)
        return
    args = su.simulate_args(run)
    from typer.main import get_command

    from capacity.cli import app

    cmd = get_command(app)
    assert args[0] == "simulate"
    sub = cmd.get_command(cmd.make_context("capacity", ["simulate", "--help"], resilient_parsing=True), "simulate")
    sub_ctx = sub.make_context("simulate", list(args[1:]))  # parses (and type-checks) every option, runs nothing
    assert sub_ctx.params["model"] == str(run["card"])
    assert sub_ctx.params["requests"] == run["num_prompts"]
