"""Shared pieces of the `capacity` command line: the typer app, option types, and the helpers that turn flags
into typed configuration. Command modules import this; nothing here imports a command module."""
from __future__ import annotations

import importlib
import math
from difflib import get_close_matches
from typing import Annotated, Any, Optional

import typer
from typer._click import Context, HelpFormatter
from typer._click.exceptions import UsageError
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup
from typer.main import get_group

from capacity import __version__, compiled, stale_compiled
from capacity.cli.commands import COMMANDS
from capacity.cli.engine_options import engine_option
from capacity.engine.config import EngineConfig, own_settings, settings_fields
from capacity.errors import CapacityError
from capacity.files import validate
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu, with_memory
from capacity.vision_requests import image_flags
from capacity.workload import Lengths


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"capacity {__version__} (" + ("simulator compiled by mypyc" if compiled() else "pure Python") + ")")
        if stale := stale_compiled():
            typer.echo(f"warning: {len(stale)} compiled module(s) edited since the build run their old code "
                       f"({stale[0]}...): bash scripts/compile.sh", err=True)
        raise typer.Exit()


class LazyGroup(TyperGroup):
    """The top-level group: a command's module (commands.COMMANDS) is imported when the command is looked up
    (to run it or show its own help), not before; the group's --help lists the commands from the table.
    An error raised while a module imports reaches the boundary in capacity/cli/__init__.py as any other."""

    def list_commands(self, ctx: Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: Context, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"capacity.cli.{COMMANDS[cmd_name][0]}")  # registers its commands on `app`
            for name, command in get_group(app).commands.items():
                self.commands.setdefault(name, command)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        try:
            return self._click_resolve_command(ctx, args)
        except UsageError as e:  # typer's suggestion, from every command's name (not only those imported)
            if self.suggest_commands and args and (matches := get_close_matches(args[0], self.list_commands(ctx))):
                e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(f'{m!r}' for m in matches)}?"
            raise

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, make_default_short_help(COMMANDS[name][1], limit) if name in COMMANDS
                 else self.commands[name].get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Predict GPU memory, concurrency and GPU count for LLM serving (vLLM-faithful).")


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit")] = False) -> None:
    """Predict GPU memory, concurrency and GPU count for LLM serving (vLLM-faithful)."""

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model card YAML, HF config.json, or bundled card name")]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help="GPU catalogue name (see `capacity gpus`) or GPU YAML")]
# The engine settings' options are generated from EngineConfig's declarations (capacity/cli/engine_options.py);
# these three, for the commands that take them without an EngineConfig (step-cost, calibrate), read it too
TpOpt = Annotated[int, engine_option("tensor_parallel_size")]
DpOpt = Annotated[int, engine_option("data_parallel_size")]
EpOpt = Annotated[bool, engine_option("enable_expert_parallel")]
WOpt = Annotated[Optional[str], typer.Option("--weight-dtype", help="Override weight format: bf16, fp16, fp8, int8, int4")]
CompOpt = Annotated[Optional[str], typer.Option(
    "--compute-dtype", help="Dtype quantised GEMMs multiply in: auto (what engines run for the weight format on the "
    "GPU: fp8 weights -> FP8 GEMMs where the GPU has FP8), bf16/fp16 (weight-only), fp8, int8, fp4")]
GroupOpt = Annotated[Optional[int], typer.Option("--quant-group-size", help="int4: group size (default 128); fp8/int8: square blocks (128: DeepSeek/Qwen3 FP8)")]
GpuMemOpt = Annotated[Optional[float], typer.Option(
    "--gpu-memory-gib", help="Total GPU memory the engine sees, GiB (overrides the catalogue's)")]
SpecOpt = Annotated[Optional[str], typer.Option(
    "--speculative", help="Speculative decoding METHOD:K (draft_model, eagle, eagle3, mtp; K drafts per step), "
    "e.g. eagle3:3 (docs/speculative.md)")]
AcceptOpt = Annotated[Optional[str], typer.Option(
    "--acceptance", help="--speculative: acceptance per draft token (0.7), per position (0.8,0.6,0.4) or a published "
    "figure's name (deepseek-v3-mtp; capacity/data/speculative_acceptance.yaml)")]
DraftOpt = Annotated[Optional[str], typer.Option("--draft-model", help="--speculative draft_model: the draft's card")]
DraftVocabOpt = Annotated[Optional[int], typer.Option(
    "--draft-vocab-size", help="--speculative eagle3: the head's own vocabulary (Llama 3.1's EAGLE-3: 32000)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output")]
ImagesOpt = Annotated[Optional[str], typer.Option("--images-per-request", help="Images in a request with images (docs/vision.md): N, LOW-HIGH or lognormal:MEAN:CV")]
ImageSizeOpt = Annotated[Optional[str], typer.Option("--image-size", help="Image resolution WxH, or several WxH[:WEIGHT],... drawn by weight (default 1024x768)")]
ImageShareOpt = Annotated[Optional[float], typer.Option("--image-share", help="Share of requests with images, in [0, 1] (default 1 when an image flag is given)")]
ImageDatasetOpt = Annotated[Optional[str], typer.Option("--image-dataset", help="The images a benchmark dataset sends (docs/vision_datasets.md): visionarena[:small|large], mmmu, random-mm:base=N,ratio=R,limit=L,buckets={...}, sglang-image:count=N,resolution=720p")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", "-o", help="table (default), json, csv or md")]


def output_kind(output: str | None, json_out: bool) -> str:
    """--output (table, json, csv, md), with --json as a synonym of --output json."""
    kind = "json" if json_out else (output or "table").lower()
    if kind not in ("table", "json", "csv", "md"):
        raise CapacityError(f"--output {output!r}: use table, json, csv or md")
    return kind


def load_card(model: str, weight_dtype: str | None = None, group: int | None = None, compute_dtype: str | None = None):
    """A model card from a path, a bundled name or a config.json, with optional weight-format and GEMM-dtype
    overrides."""
    card = load_named_card(model)
    if weight_dtype is not None:
        if group is None and weight_dtype == "int4":
            group = 128
        card = card.with_overrides(weight_dtype=weight_dtype, quant_group_size=group)
    elif group is not None:  # a group for the card's own quantised weights; never dropped silently
        if not {card.weight_format, *card.weight_formats.values()} - {"bf16", "fp16"}:
            raise CapacityError(f"--quant-group-size {group}: model {card.name} stores {card.weight_format} weights, "
                                "which have no groups; give --weight-dtype too")
        card = card.with_overrides(quant_group_size=group)
    if compute_dtype is not None:
        card = card.with_overrides(gemm_dtype=compute_dtype)
    return card


def engine_overrides(specs: list[str] | None, flag: str) -> dict:
    """KEY=VALUE settings of one role's engine (`--decode-set max_num_seqs=64`): the value read as JSON where it
    parses (64, true, 0.85), else as text; the key an EngineConfig field, not the TP (its own option)."""
    import json

    out: dict = {}
    if len(specs or []) > 32:
        raise CapacityError(f"{flag}: at most 32 settings (got {len(specs or [])})")
    for spec in specs or []:
        if "=" not in spec or len(spec) > 200:
            raise CapacityError(f"{flag} {spec[:80]!r}: expected KEY=VALUE, e.g. max_num_seqs=64")
        key, raw = (x.strip() for x in spec.split("=", 1))
        if key not in settings_fields() or key == "tensor_parallel_size":
            raise CapacityError(f"{flag} {key!r}: not an engine setting of one role (see `capacity schema`; the "
                                "TP has its own option)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def role_engine(cfg, tp: int, over: dict, flag: str):
    """`cfg` at TP `tp` with a role's own settings, validated (one line naming the flag if one is wrong)."""
    return validate(EngineConfig, {**cfg.model_dump(exclude_unset=True), "tensor_parallel_size": tp, **over}, flag)


def engine_config(source: str = "options", **fields):
    """The configuration of the engine the CLI values name (None = not given: the engine decides), validated
    strictly; another engine's setting left at its default (the options pass every default) is not given."""
    return validate(EngineConfig, own_settings({k: v for k, v in fields.items() if v is not None}), source)


def _scenario(model, gpu, settings: dict, weight_dtype=None, group=None, gpu_memory_gib=None):
    """The card, the GPU and the EngineConfig of a command's options (`settings`: the engine fields given)."""
    card = load_card(model, weight_dtype, group)
    return card, with_memory(get_gpu(gpu), gpu_memory_gib), engine_config(**settings)


def _lengths(flag: str, value: str):
    """'1024' (fixed), '128-2048' (uniform), 'lognormal:MEAN:CV[:MIN:MAX]' (clipped to [MIN, MAX])."""
    v = value.strip().lower()
    try:
        if v.startswith("lognormal:"):
            parts = v.split(":")
            if len(parts) not in (3, 5):
                raise ValueError
            data = {"kind": "lognormal", "mean": float(parts[1]), "cv": float(parts[2])}
            if len(parts) == 5:
                data.update(low=int(parts[3]), high=int(parts[4]))
        elif "-" in v:
            lo, hi = v.split("-")
            data = {"kind": "uniform", "low": int(lo), "high": int(hi)}
        else:
            data = {"kind": "fixed", "value": int(v)}
    except ValueError:
        raise CapacityError(f"{flag} {value!r}: expected N, LOW-HIGH or lognormal:MEAN:CV[:MIN:MAX]") from None
    return validate(Lengths, data, flag)



def image_section(per_request: str | None, sizes: str | None, share: float | None, dataset: str | None = None) -> dict:
    """--images-per-request, --image-size, --image-share and --image-dataset as a workload's `images:` ({}: none)."""
    img = image_flags(per_request, sizes, share, lambda f, v: _lengths(f, v).model_dump(), dataset)
    return {"images": img} if img else {}


def speculative_fields(spec: str | None, acceptance: str | None, draft: str | None = None,
                       draft_vocab: int | None = None) -> dict:
    """EngineConfig's `speculative` from --speculative METHOD:K and --acceptance (a rate, a comma list of
    per-position rates, or a published figure's name); {} without --speculative."""
    if spec is None:
        for flag, v in (("--acceptance", acceptance), ("--draft-model", draft), ("--draft-vocab-size", draft_vocab)):
            if v is not None:
                raise CapacityError(f"{flag} {v}: needs --speculative METHOD:K")
        return {}
    method, _, k = spec.partition(":")
    try:
        k_int = int(k)
    except ValueError:
        raise CapacityError(f"--speculative {spec!r}: expected METHOD:K, e.g. eagle3:3") from None
    out: dict = {"method": method.strip(), "num_speculative_tokens": k_int}
    a = (acceptance or "").strip()
    if not a:
        raise CapacityError("--acceptance: needed with --speculative (a rate, per-position rates or a published figure)")
    try:
        rates = [float(x) for x in a.split(",")]
    except ValueError:
        out["acceptance_source"] = a
    else:
        out.update({"acceptance": rates} if "," in a else {"acceptance_rate": rates[0]})
    if draft is not None:
        out["draft_model"] = draft
    if draft_vocab is not None:
        out["draft_vocab_size"] = draft_vocab
    return {"speculative": out}


def _prices(spec: str | None, gpus: list) -> dict[str, float]:
    """'2.5' (every GPU) or 'h100-sxm=2.5,h200=3.6' -> {gpu: USD per GPU-hour}; one line naming a bad value."""

    if not spec:
        return {}
    out: dict[str, float] = {}
    items = [x.strip() for x in spec.split(",") if x.strip()]
    for item in items:
        name, _, val = item.rpartition("=") if "=" in item else ("", "", item)
        try:
            v = float(val)
        except ValueError:
            v = math.nan
        if not (v > 0 and math.isfinite(v)):
            raise CapacityError(f"--price-per-gpu-hour {item!r}: expected a positive price in USD, e.g. 2.5 or h200=3.6")
        if name:
            out[name] = v
        else:
            out.update({g or "": v for g in gpus})
    unknown = set(out) - {g or "" for g in gpus}
    if unknown and any(unknown - {""}):
        raise CapacityError(f"--price-per-gpu-hour: {', '.join(sorted(unknown - {''}))} not among --gpu {','.join(g or '' for g in gpus)}")
    return out
