"""Issue 50 item 1: an engine setting is declared once, on EngineConfig or its engine's class (capacity/engine/settings.py: its
description, bounds, CLI flag, the engines' launch flags and dashboard control), and the commands' options, the
dashboard's controls, the launch commands and docs/schema.md are generated from it. The acceptance test declares
one more setting in a fixture, and nowhere else, and finds it on all four surfaces."""
from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field, create_model

from capacity.engine import config as config_mod
from capacity.engine.config import EngineConfig
from capacity.engine.settings import ENGINE_COMMANDS, declared, in_command, setting
from tests.conftest import run_cli


@pytest.fixture
def prefill_boost(monkeypatch):
    """One more shared setting, `prefill_boost`, declared only here (flag, bounds, engines' flags, control) and
    given to each engine's configuration class; the fixture is `EngineConfig` (which builds the engine's class)."""
    boost = (Annotated[int, Field(ge=1, le=64)] | None, setting(
        None, description="A what-if setting declared only in this test", flag="--prefill-boost",
        help="Prefill boost (declared in a test)", vllm="--prefill-boost", sglang="--prefill-boost-sg",
        trtllm="--prefill_boost", ui={"label": "prefill boost", "kind": "number", "step": 1}))
    classes = tuple(create_model(f"{c.__name__}Plus", __base__=c, prefill_boost=boost)
                    for c in config_mod.settings_classes())
    monkeypatch.setattr(config_mod, "SETTINGS_CLASSES", classes)
    return EngineConfig


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_a_new_setting_is_an_option_of_every_engine_command(prefill_boost, command):
    r = run_cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "--prefill-boost" in r.stdout and "Prefill boost (declared in a test)" in r.stdout


def test_a_new_setting_reaches_the_command_and_its_bounds_hold(prefill_boost):
    ok = run_cli("memory", "-m", "llama-3.1-8b", "--prefill-boost", "4", "--json")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("memory", "-m", "llama-3.1-8b", "--prefill-boost", "0")  # below the declared bound (>= 1)
    assert bad.returncode == 1 and "prefill_boost" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_without_the_declaration_the_option_does_not_exist():
    r = run_cli("memory", "-m", "llama-3.1-8b", "--prefill-boost", "4")
    assert r.returncode != 0 and "--prefill-boost" in r.stderr


def test_a_new_setting_is_a_dashboard_control(prefill_boost):
    from capacity.io.controls import engine_controls

    c = engine_controls()["prefill_boost"]
    assert (c.label, c.kind, c.min, c.max, c.value, c.placed) == ("prefill boost", "number", 1, 64, None, True)
    assert c.help == "--prefill-boost: Prefill boost (declared in a test)"


@pytest.mark.parametrize("engine, flag", [("vllm", "--prefill-boost 4"), ("sglang", "--prefill-boost-sg 4"),
                                          ("trtllm", "--prefill_boost 4")])
def test_a_new_setting_is_in_each_engines_launch_command(prefill_boost, engine, flag):
    from capacity.engine import get_engine
    from capacity.engine.launch import parse_launch_command
    from capacity.model.card import load_named_card
    from capacity.model.gpus import get_gpu

    card, gpu = load_named_card("llama-3.1-8b"), get_gpu("h100-sxm")
    cfg = prefill_boost(engine=engine, prefill_boost=4)
    em = get_engine(engine)
    cmd = em.launch_command(card, cfg, em.budget(card, gpu, cfg))
    assert flag in cmd
    assert parse_launch_command(cmd).settings["prefill_boost"] == 4  # the reader knows it from the declaration too
    plain = prefill_boost(engine=engine)  # at its default (None) the command does not name it
    assert flag.split()[0] + " " not in em.launch_command(card, plain, em.budget(card, gpu, plain))


def test_a_new_setting_is_in_the_schema_reference(prefill_boost):
    from capacity.io.schema import schema_markdown

    row = next(line for line in schema_markdown().splitlines() if line.startswith("| `prefill_boost` |"))
    assert "A what-if setting declared only in this test (>= 1, <= 64)" in row
    assert "Flag: `--prefill-boost`" in row
    assert "vLLM `--prefill-boost`, SGLang `--prefill-boost-sg`, TensorRT-LLM `--prefill_boost`" in row


def test_every_declared_flag_is_in_its_commands_help():
    """The declarations' flags and help are what the commands show (fleet, autoscale, pools and disagg take a named subset)."""
    for command in (*ENGINE_COMMANDS, "fleet", "autoscale", "pools", "disagg"):
        text = " ".join(run_cli(command, "--help").stdout.split())
        for name, (_f, cli) in declared(config_mod.settings_fields(), "cli").items():
            if in_command(cli, command):
                assert cli["flag"].split("/")[0] in text, (command, name)


def test_switches_and_units_map_to_the_fields():
    """--chunked-prefill/--no-chunked-prefill (a pair: on, off or the release's), --contiguous and --optimistic set
    their field's value; --activation-gib is GiB."""
    from capacity.cli.engine_options import command_options, given

    opts = command_options("memory")
    got = given(opts, {"enable_chunked_prefill": False, "paged_kv": True, "kv_estimate": True,
                       "activation_bytes": 1.5, "enforce_eager": False, "max_num_seqs": None})
    assert got == {"enable_chunked_prefill": False, "paged_kv": False, "kv_estimate": "middle",
                   "activation_bytes": 1.5 * 2**30}
    assert given(opts, {"enable_chunked_prefill": True})["enable_chunked_prefill"] is True  # TensorRT-LLM: on
    assert "enable_chunked_prefill" not in given(opts, {"enable_chunked_prefill": None})  # the release's default


def test_max_wait_ms_is_seconds_as_before():
    """--max-wait-ms 7 is 7 / 1000 s exactly (what the command computed before it was generated)."""
    from capacity.cli.engine_options import command_options, given

    assert given(command_options("simulate"), {"static_max_wait_s": 7.0}) == {"static_max_wait_s": 7.0 / 1e3}
    assert "static_max_wait_s" not in {o.field for o in command_options("memory")}  # simulate's own
