"""`capacity calibrate`, `capacity step-cost` and `capacity profiles`: measured step costs and their use."""
from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from capacity.cli.common import CompOpt, DpOpt, EpOpt, GroupOpt, JsonOpt, ModelOpt, TpOpt, WOpt, app, load_card
from capacity.cli.engine_options import engine_option
from capacity.cli.step_lockstep import attention_dp_config, lockstep_terms, print_terms
from capacity.cost.calibrated import CalibratedCost
from capacity.cost.factory import make_step_cost
from capacity.cost.parallel import BACKENDS, EXPERT_IMBALANCE_RANGE, wrap
from capacity.cost.profile import bundled_profiles, to_plan
from capacity.cost.step import PrefillChunk, StepPlan
from capacity.engine import get_engine
from capacity.engine.budget import check_tp
from capacity.engine.configs import AnyEngineConfig
from capacity.engine.graphs import allreduce_rules, graph_wrap
from capacity.errors import CapacityError
from capacity.files import check_writable, dumps
from capacity.limits import check
from capacity.model.card import load_named_card
from capacity.model.gpus import get_gpu
from capacity.truth.fit import fit_engine, load_run, save_fit
from capacity.truth.provenance import mismatches, run_engine


@app.command()
def calibrate(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model card (not needed with --from-run)")] = None,
    device: Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:N")] = "cpu",
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Profile JSON to write")] = None,
    tp: TpOpt = 1,
    quick: Annotated[bool, typer.Option("--quick", help="Small grids (seconds): for tests and smoke runs")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (recorded)")] = None,
    max_context: Annotated[Optional[int], typer.Option("--max-context", help="Largest context to measure")] = None,
    cuda_graphs: Annotated[Optional[bool], typer.Option("--cuda-graphs/--eager", help="Time CUDA graph replays (default: on for CUDA and cards without MoE)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and step shapes")] = 0,
    attention_kernel: Annotated[str, typer.Option("--attention-kernel", help="paged: one FlashAttention call per layer over a paged KV pool, as vLLM (CPU: a reference rehearsal); sdpa: padded SDPA; auto: paged where FlashAttention runs")] = "auto",
    compile_layers: Annotated[bool, typer.Option("--compile", help="torch.compile each layer's work around attention, as vLLM does (Inductor; minutes of compiling)")] = False,
    from_run: Annotated[Optional[list[str]], typer.Option("--from-run", help="Fit engine terms to measured runs instead")] = None,
    num_blocks: Annotated[Optional[int], typer.Option("--num-blocks", help="--from-run: the engine's KV blocks (default: each run's record)")] = None,
    block_size: Annotated[Optional[int], typer.Option("--block-size", help="--from-run: the engine's block size")] = None,
    max_batch_tokens: Annotated[Optional[int], typer.Option("--max-batch-tokens", help="--from-run: token budget per step")] = None,
    max_seqs: Annotated[Optional[int], typer.Option("--max-seqs", help="--from-run: max sequences per step")] = None,
    attention: Annotated[str, typer.Option("--attention", help="--from-run: per_sequence (vLLM, SGLang) or packed (transformers CB on CPU)")] = "per_sequence",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file")] = False,
    weight_dtype: WOpt = None, compute_dtype: CompOpt = None,
    quant_group_size: GroupOpt = None,
) -> None:
    """Measure step costs with real torch kernels on a device and write a profile (needs torch:
    `pip install torch==2.13.0`); or, with --from-run, fit an engine's step-cost terms to measured runs."""
    import re
    from pathlib import Path

    if from_run:

        given = engine_flags(num_blocks, block_size, max_batch_tokens, max_seqs)
        runs = [load_run(r) for r in from_run]

        scheds = [run_engine(run, given, path) for run, path in zip(runs, from_run)]
        provs = [(run.get("meta") or {}).get("provenance") for run in runs]
        for path, p in zip(from_run[1:], provs[1:]):
            for m in mismatches(provs[0], p):
                typer.echo(f"warning: {path} was measured elsewhere than {from_run[0]}: {m}", err=True)
        dest = check_writable(out or "engine-fit.json", force, "--out")
        fitted, info = fit_engine(runs, scheds, attention=attention)
        save_fit(dest, fitted, info, scheds[0], list(from_run), provs[0], scheds)
        typer.echo(f"wrote {dest}: fixed {fitted.fixed_s * 1e3:.3f} ms, per token {fitted.per_token_s * 1e6:.2f} us, "
                   f"per sequence {fitted.per_seq_s * 1e6:.2f} us, "
                   f"per key {fitted.per_key_s * 1e9:.2f} ns, per pair {fitted.per_pair_s * 1e12:.2f} ps, "
                   f"front end {info['frontend_s'] * 1e3:.2f} ms; "
                   f"median |error| on the fitted runs {info['median_abs_rel_err']:.1%}")
        unc = info.get("uncertainty", {})
        if unc:
            typer.echo("95% ranges (x/ factor): " + ", ".join(
                f"{k} {'unbounded' if v['factor_95'] is None else format(v['factor_95'], '.2f')}"
                for k, v in unc.items()))
        for w in info.get("warnings", []):
            typer.echo(f"warning: {w}", err=True)
        return
    if model is None:
        raise CapacityError("--model is required (unless --from-run)")
    card = load_card(model, weight_dtype, quant_group_size, compute_dtype)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CapacityError("calibration needs torch: pip install torch==2.13.0") from None
    from calibrate.suite import run_suite

    if tp < 1:
        raise CapacityError(f"--tp: must be >= 1 (got {tp})")
    if max_context is not None and max_context < 2:
        raise CapacityError(f"--max-context: must be >= 2 (got {max_context})")
    if out:
        dest = Path(out)
    else:  # from the card's name, which a user file controls: only safe characters, in the current folder
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{card.name}-{device}").lstrip("._-")[:100] or "profile"
        dest = Path(f"{stem}.json")
    check_writable(dest, force, "--out")  # before minutes of measuring, not after
    prof = run_suite(card, device, dest, tp=tp, quick=quick, threads=threads, max_context=max_context, seed=seed,
                     cuda_graphs=cuda_graphs, attention=attention_kernel, compile_layers=compile_layers,
                     command="capacity calibrate " + " ".join(sys.argv[2:]))
    hold = [st for st in prof.steps if st.role == "holdout"]
    typer.echo(f"wrote {dest}: {prof.provenance.device_name}, {len(prof.steps)} whole steps "
               f"({len(hold)} held out), fit median error "
               f"{prof.fit.median_abs_rel_err if prof.fit else float('nan'):.1%}; "
               "check held-out accuracy with: python bench/step_accuracy.py --profile " + str(dest))


@app.command("step-cost")
def step_cost(
    model: ModelOpt,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU (default: the profile's device, or h100-sxm)")] = None,
    tp: TpOpt = 1, dp: DpOpt = 1, expert_parallel: EpOpt = False,
    all2all_backend: Annotated[str, typer.Option(
        "--all2all-backend", help="--dp with MoE: allgather_reducescatter (vLLM's default) or deepep_low_latency")
    ] = "allgather_reducescatter",
    expert_imbalance: Annotated[Optional[float], typer.Option(
        "--expert-imbalance", help="Busiest expert-parallel rank's load / the mean (default 1.5, the conservative "
                                   "end of the assumed 1.0-1.5)")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated profile JSON (default: roofline)")] = None,
    prefill: Annotated[Optional[list[str]], typer.Option("--prefill", help="NEW[:CACHED] tokens of a prefill chunk (repeat)")] = None,
    decode: Annotated[Optional[list[str]], typer.Option("--decode", help="BATCHxCONTEXT decoding sequences (repeat)")] = None,
    kv_dtype: Annotated[str, engine_option(
        "kv_cache_dtype", help="KV cache dtype: auto, fp8, int8 (attention reads its bytes)")] = "auto",
    weight_dtype: WOpt = None, quant_group_size: GroupOpt = None, compute_dtype: CompOpt = None,
    allow_profile_mismatch: Annotated[bool, typer.Option("--allow-profile-mismatch")] = False,
    engine: Annotated[Optional[str], typer.Option(
        "--engine", help="Engine and release (vllm@0.9, sglang@0.5.10, trtllm@1.0): its all-reduce rules and the CPU "
                         "dispatch of steps it runs without a full CUDA graph (default: vLLM's all-reduce, no graphs "
                         "term)")] = None,
    enable_dp_attention: Annotated[bool, engine_option(
        "enable_dp_attention", help="SGLang DP attention over --dp ranks inside the --tp GPUs (--engine sglang): the "
        "step's sequences dealt round robin to the ranks, stepped in lock step")] = False,
    trtllm_attention_dp: Annotated[bool, engine_option(
        "trtllm_attention_dp", help="TensorRT-LLM attention DP, one rank per --tp GPU (--engine trtllm): the step's "
        "sequences dealt round robin to the ranks, stepped in lock step")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Time of one engine step (ms) with its breakdown, from the roofline or a calibrated profile."""
    card = load_card(model, weight_dtype, quant_group_size, compute_dtype)
    if tp < 1:
        raise CapacityError(f"--tp {tp}: must be >= 1")
    check_tp(card, tp)  # the same rule `memory` applies: heads must split evenly
    pre: list[PrefillChunk] = []
    for item in prefill or []:
        parts = item.split(":")
        if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts) or int(parts[0]) == 0:
            raise CapacityError(f"--prefill {item!r}: expected NEW[:CACHED] with NEW > 0, e.g. 512:1024")
        chunk = PrefillChunk(int(parts[0]), int(parts[1]) if len(parts) == 2 else 0)
        check("step_tokens", chunk.new_tokens + chunk.cached_tokens, f"--prefill {item}:")
        check("step_sequences", len(pre) + 1, "--prefill chunks")
        pre.append(chunk)
    dec: list[int] = []
    for item in decode or []:
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts) or int(parts[0]) == 0:
            raise CapacityError(f"--decode {item!r}: expected BATCHxCONTEXT with BATCH > 0, e.g. 32x2048")
        batch, ctx = int(parts[0]), int(parts[1])
        check("step_sequences", len(dec) + len(pre) + batch, f"--decode {item}: sequences")
        check("step_tokens", ctx, f"--decode {item}: context")
        dec += [ctx] * batch
    plan_ = StepPlan(tuple(pre), tuple(dec))
    longest = max([p.new_tokens + p.cached_tokens for p in pre] + [d + 1 for d in dec] + [0])
    if longest > card.max_position_embeddings:
        raise CapacityError(f"a sequence of {longest} tokens exceeds {card.name}'s max_position_embeddings "
                            f"({card.max_position_embeddings})")
    if plan_.num_tokens == 0:
        raise CapacityError("give at least one --prefill or --decode")

    if kv_dtype not in ("auto", "fp8", "int8"):
        raise CapacityError(f"--kv-dtype {kv_dtype!r}: use auto, fp8 or int8")

    if all2all_backend not in BACKENDS:
        raise CapacityError(f"--all2all-backend {all2all_backend!r}: use {', '.join(BACKENDS)}")
    em, cfg = engine_of(engine)
    cost = make_step_cost(card, gpu, tp, kv_dtype=kv_dtype, profile=profile, allow_mismatch=allow_profile_mismatch,
                          allreduce=allreduce_rules(em, cfg) if em is not None else "vllm",
                          step_overhead_s=None if em is None else em.step_overhead_s(cfg))
    adp = attention_dp_config(em, engine, card, getattr(cost, "gpu", None), tp, dp, expert_parallel,
                              enable_dp_attention, trtllm_attention_dp)
    cfg = adp or cfg  # (the MoE layout of an attention-DP replica: dp 1, experts whole over tp with EP)
    cost = wrap(cost, card, tp, 1 if adp is not None else dp, expert_parallel, profile, all2all_backend,
                EXPERT_IMBALANCE_RANGE[1] if expert_imbalance is None else expert_imbalance)
    if em is not None:  # (e): the CPU dispatch of steps without a full CUDA graph, as `simulate` costs them
        cost = graph_wrap(cost, em, cfg, card, em.step_overhead_s(cfg), profile)
    lock: dict | None = None
    if adp is not None:
        cost, lock = lockstep_terms(cost, adp, card, tp, kv_dtype, profile, plan_)
        terms = {"rest_over_gathered": lock["rest_over_gathered_s"],
                 "slowest_rank_attention": max(lock["rank_attention_s"])}
    else:
        terms = cost.breakdown(plan_)
    total = sum(terms.values())
    if json_out:
        typer.echo(dumps({"step_s": total, "breakdown_s": terms, "source": cost.source,
                          "tokens": plan_.num_tokens, **({"lock_step": lock} if lock is not None else {})}))
        return
    typer.echo(f"step: {total * 1e3:.3f} ms for {plan_.num_tokens} tokens ({len(pre)} prefill chunks, "
               f"{len(dec)} decodes); source: {cost.source}")
    if lock is not None:
        print_terms(typer.echo, lock)
        return
    for k, v in terms.items():
        typer.echo(f"  {k:<14}{v * 1e3:10.3f} ms")


@app.command()
def profiles(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Only profiles of this model card")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="Only profiles measured on this GPU")] = None,
    json_out: JsonOpt = False,
) -> None:
    """List the bundled calibration profiles (calibrate/profiles): model, device, torch/CUDA, eager or CUDA
    graphs, and held-out whole-step accuracy. Pass a name to --profile of plan, simulate, step-cost."""
    import warnings

    import numpy as np

    rows: list[dict[str, Any]] = []
    for name, path, prof in bundled_profiles(model, get_gpu(gpu).name if gpu else None):
        pv = prof.provenance
        err = None
        hold = [st for st in prof.steps if st.role == "holdout"]
        try:
            card = load_named_card(prof.model.name)
            cost = CalibratedCost(prof, card, tp=prof.tp, profile_path=str(path))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                err = float(np.median([abs(cost.step_s(to_plan(st.prefills, st.decodes)) / st.measured_s - 1)
                                       for st in hold])) if hold else None
        except CapacityError:
            pass
        rows.append({"name": name, "path": str(path), "model": prof.model.name, "gpu": pv.gpu,
                     "device_name": pv.device_name, "torch": pv.torch_version, "cuda": pv.cuda_version,
                     "cuda_graphs": pv.cuda_graphs, "date": pv.date, "holdout_steps": len(hold),
                     "holdout_median_abs_err": err})
    if json_out:
        typer.echo(dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Bundled calibration profiles (use the name with --profile)", title_justify="left")
    t.add_column("name", no_wrap=True)  # what --profile takes: never truncated
    for col in ("model", "device", "torch / CUDA", "timing", "held-out median |err|", "date"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["model"], r["device_name"], f"{r['torch']} / {r['cuda'] or '-'}",
                  "CUDA graphs" if r["cuda_graphs"] else "eager",
                  f"{r['holdout_median_abs_err']:.1%} of {r['holdout_steps']}" if r["holdout_median_abs_err"] is not None else "-",
                  r["date"][:10])
    if not rows:
        typer.echo("no bundled profile matches" + (f" --model {model}" if model else "") + (f" --gpu {gpu}" if gpu else ""))
        return
    Console().print(t)


def engine_of(spec: str | None):
    """(engine model, its default configuration) of an `--engine` spec, or (None, None) without one."""
    if spec is None:
        return None, None
    from pydantic import TypeAdapter, ValidationError

    try:
        cfg = TypeAdapter(AnyEngineConfig).validate_python({"engine": spec})
    except ValidationError as err:
        raise CapacityError(f"--engine {spec!r}: {err.errors()[0]['msg']}") from None
    return get_engine(spec), cfg


def engine_flags(num_blocks, block_size, max_batch_tokens, max_seqs) -> dict | None:
    """The engine limits given on the command line: all four, or none (then each run's own record is used)."""
    vals = {"num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": max_batch_tokens,
            "max_num_seqs": max_seqs}
    given = {k: v for k, v in vals.items() if v is not None}
    if not given:
        return None
    flag = {"num_blocks": "--num-blocks", "block_size": "--block-size", "max_num_batched_tokens": "--max-batch-tokens",
            "max_num_seqs": "--max-seqs"}
    if len(given) < 4:
        raise CapacityError("give all of --num-blocks, --block-size, --max-batch-tokens, --max-seqs or none (then "
                            f"each run's recorded engine config is used); missing {', '.join(flag[k] for k in vals if k not in given)}")
    for k, v in given.items():
        if v <= 0:
            raise CapacityError(f"{flag[k]} {v}: must be > 0")
    return given
