"""`capacity simulate`: one simulated deployment through the run pipeline, percentiles and throughput."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from capacity.cli.common import (
    AcceptOpt,
    CompOpt,
    DraftOpt,
    DraftVocabOpt,
    GpuMemOpt,
    GroupOpt,
    ImageDatasetOpt,
    ImageShareOpt,
    ImageSizeOpt,
    ImagesOpt,
    JsonOpt,
    ModelOpt,
    OutputOpt,
    SpecOpt,
    WOpt,
    _lengths,
    app,
    engine_config,
    engine_overrides,
    load_card,
    output_kind,
    role_engine,
    speculative_fields,
)
from capacity.cli.engine_options import FROM_DECLARATIONS, engine_options
from capacity.cost.factory import DEFAULT_GPU, profile_gpu
from capacity.engine.offload import offload_line
from capacity.errors import CapacityError
from capacity.files import check_writable, dumps, read_mapping, validate, write_atomic
from capacity.io.report import simulation_rows, simulation_table, to_csv, to_markdown
from capacity.model.gpus import get_gpu, with_memory
from capacity.pipeline import Deployment, Disagg, RunOptions
from capacity.plan.simulate import simulation_report
from capacity.reasoning import Reasoning, reasoning_flags
from capacity.sessions import Sessions
from capacity.traces import convert, parse_window
from capacity.truth.compare import records_run
from capacity.vision_requests import ImageRequests, image_flags
from capacity.workload import Arrivals, RequestClass, WorkloadSpec


@app.command()
@engine_options("simulate")
def simulate(
    model: ModelOpt, gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU (default h100-sxm, or the profile's)")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibrated step-cost profile (default: roofline)")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", help="Arrival rate, requests/s (all replicas)")] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests to simulate")] = 2000,
    input_len: Annotated[str, typer.Option("--input-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "1024",
    output_len: Annotated[str, typer.Option("--output-len", help="N, LOW-HIGH or lognormal:MEAN:CV")] = "256",
    arrival: Annotated[str, typer.Option("--arrival", help="poisson, gamma, constant, closed, offline (all at t=0)")] = "poisson",
    cv: Annotated[float, typer.Option("--cv", help="Gamma arrivals: coefficient of variation (burstiness)")] = 1.0,
    users: Annotated[Optional[int], typer.Option("--users", help="Closed loop: concurrent users")] = None,
    think_s: Annotated[Optional[float], typer.Option("--think-s", help="Closed loop or --turns: mean think time, s (default 0; sessions: 10)")] = None,
    turns: Annotated[Optional[str], typer.Option("--turns", help="Multi-turn sessions (docs/sessions.md): turns per session, N, LOW-HIGH or lognormal:MEAN:CV; --rate is then new sessions/s, --input-len the first prompt, --output-len each turn's")] = None,
    turn_tokens: Annotated[str, typer.Option("--turn-tokens", help="--turns: tokens each later turn adds to the context (N, LOW-HIGH or lognormal:MEAN:CV)")] = "128",
    think_cv: Annotated[float, typer.Option("--think-cv", help="--turns: think time's coefficient of variation (1 exponential, 0 fixed)")] = 1.0,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help="Open loop behind a client that keeps at most this many requests in flight (vllm bench serve --request-rate R --max-concurrency C); TTFT is timed from the send")] = None,
    workload: Annotated[Optional[str], typer.Option("--workload", help="Workload YAML/JSON (overrides the flags above)")] = None,
    trace: Annotated[Optional[str], typer.Option(
        "--trace", help="Replay a trace as published: Mooncake JSONL, Azure or BurstGPT CSV, or capacity's own "
                        "(its first --requests rows; overrides the arrival and length flags)")] = None,
    trace_format: Annotated[Optional[str], typer.Option(
        "--trace-format", help="--trace: mooncake, azure, burstgpt or capacity (default: read from the file)")] = None,
    time_scale: Annotated[float, typer.Option(
        "--time-scale", help="--trace: multiply arrival times (0.5: twice the rate)")] = 1.0,
    window: Annotated[Optional[str], typer.Option(
        "--window", help="--trace: START:END seconds from its first request")] = None,
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas behind the router")] = 1,
    router: Annotated[str, typer.Option("--router", help="round_robin, least_outstanding, affinity (a session's turns "
                                        "to its last replica unless the load is imbalanced), or queue (one FIFO at "
                                        "the router, each replica taking up to --router-max-ongoing)")] = "round_robin",
    router_max_ongoing: Annotated[Optional[int], typer.Option(
        "--router-max-ongoing", help="Router queue: requests per replica before the router holds them "
                                     "(default: max_num_seqs; Ray Serve max_ongoing_requests)")] = None,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="SLO on TTFT for goodput")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="SLO on TPOT for goodput")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    warmup: Annotated[float, typer.Option("--warmup", help="Fraction of first requests excluded from metrics (a closed loop: at least its first --users)")] = 0.1,
    no_fast_forward: Annotated[bool, typer.Option("--no-fast-forward", help="One event per step (slow; for checks)")] = False,
    settings: dict = FROM_DECLARATIONS,  # the engine options, generated from EngineConfig's declarations (cli/engine_options.py)
    weight_dtype: WOpt = None, quant_group_size: GroupOpt = None, compute_dtype: CompOpt = None,
    allow_profile_mismatch: Annotated[bool, typer.Option("--allow-profile-mismatch")] = False,
    gpu_memory_gib: GpuMemOpt = None,
    disagg: Annotated[Optional[str], typer.Option("--disagg", help="Disaggregated prefill/decode: P:D replicas "
                                                  "(P prefill, D decode; --replicas is then ignored)")] = None,
    decode_tp: Annotated[Optional[int], typer.Option("--decode-tp", help="--disagg: TP of a decode replica (default --tp)")] = None,
    link: Annotated[str, typer.Option("--link", help="--disagg: nvlink, ib-400, roce-200 or eth-100")] = "nvlink",
    link_gbps: Annotated[Optional[float], typer.Option("--link-gbps", help="--disagg: GB/s per GPU (overrides --link's)")] = None,
    link_latency_us: Annotated[Optional[float], typer.Option("--link-latency-us", help="--disagg: one-way latency, us")] = None,
    shared_link: Annotated[bool, typer.Option("--shared-link", help="--disagg: one link for the whole prefill pool")] = False,
    decode_set: Annotated[Optional[list[str]], typer.Option(
        "--decode-set", help="--disagg: KEY=VALUE of the decode pool's engine only, e.g. max_num_seqs=512 "
        "(repeat); each pool's memory budget and launch line follow its own settings")] = None,
    save_run: Annotated[Optional[str], typer.Option("--save-run", help="Also write the measured requests as a run file (for capacity compare)")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --save-run file")] = False,
    speculative: SpecOpt = None, acceptance: AcceptOpt = None, draft_model: DraftOpt = None,
    draft_vocab_size: DraftVocabOpt = None,
    images_per_request: ImagesOpt = None, image_size: ImageSizeOpt = None, image_share: ImageShareOpt = None,
    image_dataset: ImageDatasetOpt = None,
    reasoning_share: Annotated[Optional[float], typer.Option("--reasoning-share", help="A reasoning model: share of each request's output tokens that are hidden reasoning (docs/fidelity.md)")] = None,
    reasoning_content_tokens: Annotated[Optional[float], typer.Option("--reasoning-content-tokens", help="A reasoning model: answer tokens per request (a mean); the rest of the output is reasoning")] = None,
    reasoning_counted: Annotated[Optional[str], typer.Option("--reasoning-counted", help="Tokens the benchmark client counts: all (usage.completion_tokens) or content (the answer)")] = None,
    reasoning_ttft: Annotated[Optional[str], typer.Option("--reasoning-ttft", help="Chunk that ends the client's TTFT: any (vllm bench serve openai-chat) or content")] = None,
    json_out: JsonOpt = False, output: OutputOpt = None,
) -> None:
    """Simulate serving: percentiles of TTFT, TPOT, ITL, E2E and queue wait (ms), throughput, goodput."""
    kind = output_kind(output, json_out)
    card = load_card(model, weight_dtype, quant_group_size, compute_dtype)
    g = with_memory(get_gpu(gpu or (profile_gpu(profile) if profile else DEFAULT_GPU)), gpu_memory_gib)
    cfg = engine_config(**settings, **speculative_fields(speculative, acceptance, draft_model, draft_vocab_size))
    tp = cfg.tensor_parallel_size
    import contextlib
    import tempfile

    stack = contextlib.ExitStack()
    if turns and (trace or workload):
        raise CapacityError("--turns: declare sessions in the workload file (`sessions:`), not with --trace/--workload")
    if trace and workload:
        raise CapacityError("--trace and --workload: give one (a workload file names its trace in `trace`)")
    if trace:  # converted (window, time scale, checks) into a temporary trace of capacity's form, then replayed
        if requests <= 0:
            raise CapacityError(f"--requests: must be > 0 (got {requests})")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="capacity-trace-"))) / "trace.jsonl"
        convert(trace, tmp, trace_format, time_scale=time_scale, window=parse_window(window), max_rows=requests)
        spec = validate(WorkloadSpec, {"arrivals": {"kind": "trace"}, "trace": str(tmp), "num_requests": requests,
                                       "classes": [RequestClass(slo_ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                                                                slo_tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)]},
                        "--trace")
    elif trace_format or time_scale != 1.0 or window:
        raise CapacityError("--trace-format, --time-scale and --window apply to --trace")
    elif workload:
        spec = validate(WorkloadSpec, read_mapping(workload), workload)
    else:
        if requests <= 0:
            raise CapacityError(f"--requests: must be > 0 (got {requests})")
        arr = {"kind": arrival, "cv": cv, "think_s": think_s or 0.0}
        if arrival == "closed":
            arr["users"] = users
        elif arrival != "offline":
            if rate is None:
                raise CapacityError("--rate is required for open-loop arrivals (or use --arrival closed --users N)")
            arr["rate_per_s"] = rate
        if max_concurrency is not None:
            arr["max_concurrency"] = max_concurrency
        cls = RequestClass(slo_ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                           slo_tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)
        sess = None
        if turns is not None:
            arr["think_s"] = 0.0
            sess = validate(Sessions, {"turns": _lengths("--turns", turns), "new_tokens": _lengths("--turn-tokens", turn_tokens),
                                       "think_cv": think_cv} | ({} if think_s is None else {"think_s": think_s}), "--turns")
        elif turn_tokens != "128" or think_cv != 1.0:
            raise CapacityError("--turn-tokens and --think-cv apply to --turns (multi-turn sessions)")
        spec = validate(WorkloadSpec, {"arrivals": validate(Arrivals, arr, "arrival options"),
                                       "input_len": _lengths("--input-len", input_len),
                                       "output_len": _lengths("--output-len", output_len), "num_requests": requests,
                                       "classes": [cls], "sessions": sess}, "--requests")
    if (img := image_flags(images_per_request, image_size, image_share, _lengths, image_dataset)) is not None:
        base = spec.images.model_dump(exclude={"weights"} if "sizes" in img else set()) if spec.images else {}
        base = {} if "dataset" in img else base  # --image-dataset replaces the file's `images:`
        img = base | img  # the flags over the file's `images:` (new sizes drop its weights)
        spec = spec.model_copy(update={"images": validate(ImageRequests, img, "images")})
    if (rsn := reasoning_flags(reasoning_share, reasoning_content_tokens, reasoning_counted, reasoning_ttft)) is not None:
        rsn = (spec.reasoning.model_dump(exclude={"share", "content_tokens"} if {"share", "content_tokens"} & set(rsn)
                                         else set()) if spec.reasoning else {}) | rsn  # the flags over the file's
        spec = spec.model_copy(update={"reasoning": validate(Reasoning, rsn, "reasoning")})
    dep = Deployment(card, g, cfg, profile=profile, allow_profile_mismatch=allow_profile_mismatch,
                     replicas=replicas, router=router, router_max_ongoing=router_max_ongoing)  # type: ignore[arg-type]
    if save_run:
        check_writable(save_run, force, "--save-run")
    dis = None
    if disagg is not None:

        try:
            n_p, n_d = (int(x) for x in disagg.split(":"))
        except ValueError:
            raise CapacityError(f"--disagg: expected P:D replicas, e.g. 1:2 (got {disagg!r})") from None
        if n_p < 1 or n_d < 1:
            raise CapacityError(f"--disagg: need at least one prefill and one decode replica (got {disagg!r})")

        dcfg = role_engine(cfg, decode_tp or tp, engine_overrides(decode_set, "--decode-set"), "--decode-set")
        dep = Deployment(card, g, cfg, profile=profile, allow_profile_mismatch=allow_profile_mismatch,
                         replicas=n_p, router=router)  # type: ignore[arg-type]
        dis = Disagg(Deployment(card, g, dcfg, profile=profile, allow_profile_mismatch=allow_profile_mismatch,
                                replicas=n_d, router=router),  # type: ignore[arg-type]
                     link, link_gbps, link_latency_us / 1e6 if link_latency_us is not None else None, shared_link)
    elif decode_set:
        raise CapacityError("--decode-set: needs --disagg (a decode pool of its own)")
    with stack:  # a converted --trace lives until the run has read it
        res, out = simulation_report(dep, spec, RunOptions(seed=seed, warmup_fraction=warmup,
                                                           fast_forward=not no_fast_forward, capacity_check=True,
                                                           timeseries=dis is not None), dis)
    if save_run:
        write_atomic(save_run, dumps(run_file(res), indent=None) + "\n", "--save-run")
    if kind == "json":
        typer.echo(dumps(out))
        return
    if kind in ("csv", "md"):

        head, rows = simulation_rows(out)
        if kind == "csv":
            typer.echo(to_csv(head, rows), nl=False)
        else:
            s = out["summary"]
            typer.echo(to_markdown(head, rows, f"{card.name} on {out['replicas']} x {g.name} (tp={tp}), "
                                               f"{out['policy']} batching"))
            typer.echo(f"Throughput {s['output_tokens_per_s']:,.1f} output tokens/s, {s['requests_per_s']:.3f} req/s; "
                       f"step costs: {out['step_cost_source']}. {s['definitions']}.")
        return
    from rich.console import Console


    con = Console()
    simulation_table(out, con)
    if "kv_offload" in out:
        con.print(offload_line(out["kv_offload"]), markup=False, highlight=False)
    d = out.get("disaggregated")
    if d:
        ms = lambda x: "-" if x is None else f"{x * 1e3:.2f} ms"
        con.print(f"disaggregated: {d['prefill_replicas']} prefill (tp={d['prefill_tp']}) + {d['decode_replicas']} "
                  f"decode (tp={d['decode_tp']}) = {d['gpus']} GPUs; KV over {d['link']}"
                  f"{' (one shared link)' if d['shared_link'] else ''}: {d['transfers']} transfers, mean "
                  f"{ms(d['transfer_s']['mean'])}, P99 {ms(d['transfer_s']['p99'])}, queued for the link P99 "
                  f"{ms(d['link_wait_s']['p99'])}; TTFT = prefill queue + prefill + decode admission (blocks for "
                  "the whole prompt) + transfer + the decode pool's first step")

        def pool_kv(role: str) -> str:
            k = d["kv"][role]
            peak = k["peak_used"]
            return (f"{role} {k['blocks_per_replica']:,} blocks" + (
                f", at most {peak:,} in use ({peak / max(1, k['blocks_per_replica']):.1%})" if peak is not None else ""))
        con.print(f"KV per replica: {pool_kv('prefill')}: prompts in prefill and those whose KV waits to be read; "
                  f"{pool_kv('decode')}")
        con.print("launch hints (vLLM with the NIXL connector; adapt):")
        con.print(d["launch_hints"], soft_wrap=True, markup=False, highlight=False)


def run_file(res) -> dict:
    """The measured (post-warm-up) simulated requests as a run file (capacity.truth.compare.records_run)."""
    return records_run(res.sim.records, res.warmup_requests,
                       {"source": "capacity simulate", "step_cost_source": res.cost_source,
                        "warmup_requests_excluded": res.warmup_requests})
