"""`capacity loadtest`: an async load generator for OpenAI-compatible servers (httpx + SSE).

Open-loop arrivals (the same `WorkloadSpec` generators the simulator uses: Poisson, gamma, constant, trace
replay with exact timestamps) or closed-loop users; exact prompt lengths for word-level tokenizers (prompt =
N words "w<k>"; on other tokenizers the length is approximate and the server's `usage` is recorded);
fixed output lengths via `max_tokens` + `ignore_eos` + `min_tokens`. Per request it records the scheduled
and actual send time, the time of every streamed token, the finish, the token counts and the outcome
(ok / http error / timeout / connection error / malformed stream): failures are counted, never raised.
Bounded by request count and wall time; partial results are returned (and saved by the CLI) even when the
run is interrupted. `/metrics` (Prometheus text) is scraped when the server has it.

Metrics use the simulator's definitions (`capacity.sim.metrics`): TTFT from the actual send time, TPOT over the
remaining tokens, ITL over every token gap.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from capacity.errors import CapacityError, require
from capacity.sim.metrics import Records, summarize
from capacity.steady import wait_stats
from capacity.truth.provenance import host, server_info
from capacity.truth.utilisation import Sampler
from capacity.workload import Request

OK, HTTP_ERROR, TIMEOUT, CONN_ERROR, BAD_STREAM, NOT_SENT = "ok", "http_error", "timeout", "connection_error", \
    "malformed_stream", "not_sent"

# A server is not trusted: everything it sends is bounded.
MAX_SSE_LINE = 1 << 20  # bytes in one server-sent-event line
MAX_STREAM_BYTES = 64 << 20  # bytes of one streamed answer
MAX_ERROR_BODY = 64 << 10  # bytes of an error body kept (the rest is not read)
MAX_METRICS_BYTES = 4 << 20  # bytes of one /metrics page
SCRAPE_TIMEOUT_S = 2.0  # a whole /metrics request, however slowly the server drips it
UTILISATION_INTERVAL_S = 1.0  # host and GPU sampling period


class _Hostile(Exception):
    """The server broke a bound or sent something of the wrong shape: the request is malformed_stream."""


async def _sse_events(response):
    """Server-sent events of a streaming response, with every line and the whole body bounded; decoding is
    httpx-sse's (its own line reader has no bound)."""
    decoder = None
    try:
        from httpx_sse._decoders import SSEDecoder

        decoder = SSEDecoder()
    except ImportError:  # pragma: no cover - a future httpx-sse: the few lines of the format, by hand
        pass
    buf, total = b"", 0
    data: list[str] = []
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise _Hostile(f"stream longer than {MAX_STREAM_BYTES:,} bytes")
        buf += chunk
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            raw, buf = buf[:i], buf[i + 1:]
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            if decoder is not None:
                ev = decoder.decode(line)
                if ev is not None:
                    yield ev.data
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                yield "\n".join(data)
                data = []
        if len(buf) > MAX_SSE_LINE:
            raise _Hostile(f"an event line longer than {MAX_SSE_LINE:,} bytes")


async def _bounded_body(response, limit: int) -> str:
    got = b""
    async for chunk in response.aiter_bytes():
        got += chunk
        if len(got) >= limit:
            break
    return got[:limit].decode("utf-8", errors="replace")


@dataclass
class Outcome:
    id: int
    scheduled_s: float
    prompt_tokens: int
    max_tokens: int
    sent_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    status: str = NOT_SENT
    error: str = ""


def prompt_text(n: int, salt: int) -> str:
    """n distinct words; `salt` varies the text between requests (no accidental prefix sharing)."""
    return " ".join(f"w{(salt * 7919 + i * 31) % 2000}" for i in range(n))


@dataclass
class ServerQuirks:
    """What one run learns about its server; a new run starts from scratch (nothing carries between runs)."""

    eos_fields: bool = True  # dropped once the server refuses ignore_eos/min_tokens (e.g. transformers serve)


async def _one(client, url: str, model: str, o: Outcome, t0: float, timeout_s: float, endpoint: str,
               quirks: ServerQuirks) -> None:
    """One request, recorded in `o`. Never raises (a task that raised would stop a closed-loop user)."""
    try:
        await _one_request(client, url, model, o, t0, timeout_s, endpoint, quirks)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # anything a hostile or broken server provokes is this request's outcome
        o.status, o.error = BAD_STREAM, f"{type(exc).__name__}: {exc}"[:200]
        o.output_tokens = len(o.token_times)


async def _one_request(client, url: str, model: str, o: Outcome, t0: float, timeout_s: float, endpoint: str,
                       quirks: ServerQuirks) -> None:
    import httpx

    text = prompt_text(o.prompt_tokens, o.id)
    for attempt in range(2):
        body = {"model": model, "max_tokens": o.max_tokens, "stream": True, "temperature": 0.0,
                "stream_options": {"include_usage": True}}
        if quirks.eos_fields:
            body.update(ignore_eos=True, min_tokens=o.max_tokens)
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = text
            path = "/v1/completions"
        o.sent_s = time.perf_counter() - t0
        o.token_times = []
        ended = False  # saw [DONE] or a finish_reason: the server meant to stop here
        # a server that ignores max_tokens is cut off well past it
        token_cap = 2 * o.max_tokens + 16
        try:
            async with asyncio.timeout(timeout_s):
                async with client.stream("POST", url + path, json=body,
                                         headers={"Accept": "text/event-stream"}) as response:
                    if response.status_code >= 400:
                        txt = await _bounded_body(response, MAX_ERROR_BODY)
                        if attempt == 0 and response.status_code in (400, 422) and "ignore_eos" in txt:
                            quirks.eos_fields = False  # the server fixes lengths otherwise (EOS disabled)
                            continue
                        o.status, o.error = HTTP_ERROR, f"HTTP {response.status_code}: {txt[:200]}"
                        return
                    ctype = response.headers.get("content-type", "")
                    if "text/event-stream" not in ctype:
                        o.status, o.error = BAD_STREAM, f"not an event stream (content-type {ctype[:60]!r})"
                        return
                    async for data in _sse_events(response):
                        if data.strip() == "[DONE]":
                            ended = True
                            break
                        try:
                            msg = json.loads(data)
                        except (json.JSONDecodeError, RecursionError):
                            o.status, o.error = BAD_STREAM, f"not JSON: {data[:80]!r}"
                            return
                        if not isinstance(msg, dict):
                            raise _Hostile(f"an event that is not a JSON object ({type(msg).__name__})")
                        now = time.perf_counter() - t0
                        choices = msg.get("choices") or []
                        if not isinstance(choices, list):
                            raise _Hostile("choices is not a list")
                        for ch in choices:
                            if not isinstance(ch, dict):
                                raise _Hostile("a choice is not an object")
                            ended = ended or bool(ch.get("finish_reason"))
                            piece = ch.get("text")
                            if piece is None:
                                delta = ch.get("delta") or {}
                                piece = delta.get("content") if isinstance(delta, dict) else None
                            if piece:
                                o.token_times.append(now)
                        if len(o.token_times) > token_cap:
                            raise _Hostile(f"{len(o.token_times)} tokens for max_tokens {o.max_tokens}")
                        usage = msg.get("usage")
                        if isinstance(usage, dict):
                            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
                            o.usage_prompt_tokens = pt if isinstance(pt, int) else None
                            o.usage_completion_tokens = ct if isinstance(ct, int) else None
            if o.token_times and not ended:
                o.status, o.error = CONN_ERROR, (f"stream cut after {len(o.token_times)} of {o.max_tokens} tokens "
                                                 "(no [DONE] or finish_reason)")
            elif o.token_times:
                o.first_token_s, o.finish_s = o.token_times[0], o.token_times[-1]
                o.status = OK
            else:
                o.status, o.error = BAD_STREAM, "stream ended without tokens"
            return
        except TimeoutError:
            o.status, o.error = TIMEOUT, f"no complete answer within {timeout_s} s"
            return
        except httpx.HTTPError as exc:  # connection refused/reset, protocol errors
            o.status, o.error = CONN_ERROR, f"{type(exc).__name__}: {exc}"[:200]
            return
        except (_Hostile, ValueError) as exc:  # a bound broken, or an answer of the wrong shape
            o.status, o.error = BAD_STREAM, str(exc)[:200]
            return
        finally:
            o.output_tokens = len(o.token_times)


async def _run(url: str, model: str, requests: list[Request], *, users: int | None, think_s: float,
               timeout_s: float, max_duration_s: float, endpoint: str, metrics: bool, progress,
               holder: dict, max_concurrency: int | None = None) -> tuple[list[Outcome], list]:
    import httpx

    outs = [Outcome(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests]
    scrapes: list = []
    quirks = ServerQuirks()
    sampler = Sampler() if metrics else None
    holder.update(outs=outs, scrapes=scrapes, sampler=sampler)  # what an interrupted run still returns
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits) as client:
        t0 = time.perf_counter()
        stop = asyncio.Event()

        async def scrape():
            from prometheus_client.parser import text_string_to_metric_families

            while not stop.is_set():
                try:
                    async with asyncio.timeout(SCRAPE_TIMEOUT_S):  # however slowly the server drips the page
                        async with client.stream("GET", url + "/metrics") as r:
                            if r.status_code != 200:
                                return  # the server has no /metrics: nothing to scrape
                            page = await _bounded_body(r, MAX_METRICS_BYTES)
                    now = time.perf_counter() - t0
                    row = {"t": now}
                    for fam in text_string_to_metric_families(page):
                        if any(k in fam.name for k in ("num_requests_running", "num_requests_waiting", "cache_usage",
                                                       "num_preemptions")):
                            for s in fam.samples:
                                row[s.name] = row.get(s.name, 0.0) + s.value
                    scrapes.append(row)
                    if len(scrapes) > 100_000:
                        return
                except (httpx.HTTPError, ValueError, TimeoutError, TypeError, KeyError):
                    return  # metrics are optional: a broken or slow /metrics ends the scraping, not the run
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    pass

        # a client's cap on requests in flight (`vllm bench serve --max-concurrency` with a rate): a request that
        # comes while that many are unanswered waits for a slot (asyncio's semaphore wakes its waiters in turn);
        # its clock (sent_s) starts at the send
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def open_loop(o: Outcome):
            delay = o.scheduled_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None:
                await _one(client, url, model, o, t0, timeout_s, endpoint, quirks)
            else:
                async with slots:
                    await _one(client, url, model, o, t0, timeout_s, endpoint, quirks)
            if progress:
                progress()

        async def user(queue: list[Outcome]):
            while queue:
                o = queue.pop(0)
                o.scheduled_s = time.perf_counter() - t0
                await _one(client, url, model, o, t0, timeout_s, endpoint, quirks)
                if progress:
                    progress()
                if think_s > 0:
                    await asyncio.sleep(float(np.random.default_rng(o.id).exponential(think_s)))

        async def sample_host():  # host and GPU utilisation every second (capacity.truth.utilisation)
            assert sampler is not None
            while not stop.is_set():
                sampler.sample(time.perf_counter() - t0)
                try:
                    await asyncio.wait_for(stop.wait(), UTILISATION_INTERVAL_S)
                except TimeoutError:
                    pass

        scraper = asyncio.create_task(scrape()) if metrics else None
        sampling = asyncio.create_task(sample_host()) if sampler else None
        if users:
            queue = list(outs)
            tasks = [asyncio.create_task(user(queue)) for _ in range(users)]
        else:
            tasks = [asyncio.create_task(open_loop(o)) for o in outs]
        done, pending = await asyncio.wait(tasks, timeout=max_duration_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for o in outs:
            if o.status == NOT_SENT and not math.isnan(o.sent_s):
                o.status, o.error = TIMEOUT, f"unfinished at the run bound ({max_duration_s} s)"
                o.output_tokens = len(o.token_times)
        stop.set()
        if scraper:  # never wait on the server past the run bound
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
        if sampling:
            await asyncio.gather(sampling, return_exceptions=True)
    return outs, scrapes


def run_load(url: str, model: str, requests: list[Request], *, users: int | None = None, think_s: float = 0.0,
             timeout_s: float = 60.0, max_duration_s: float = 600.0, endpoint: str = "completions",
             metrics: bool = True, progress=None, engine: dict | None = None,
             max_concurrency: int | None = None) -> dict:
    """Run the load and return the run record (JSON-ready). `engine`: the server's scheduler limits, recorded for
    fits (capacity.truth.provenance.ENGINE_KEYS); the run also records where it was measured. `max_concurrency`
    (open loop only): at most that many requests in flight, the others waiting at the client for a slot."""
    if max_concurrency is not None and (users or max_concurrency < 1):
        raise CapacityError(f"max_concurrency {max_concurrency}: a cap of at least 1 on an open loop "
                            "(closed-loop users are their own cap)")

    for mod in ("httpx", "httpx_sse", "prometheus_client"):
        require(mod, "loadtest", "the load tester")
    url = url.rstrip("/")

    provenance = {"host": host(), "server": server_info(url) if metrics else {}}
    started = time.time()
    holder: dict = {}
    interrupted = False
    import signal
    import threading

    def _stop(signum, frame):  # SIGTERM and SIGHUP end the run like Ctrl-C: partial results kept
        # through asyncio's own Ctrl-C handling where it is installed (it cancels the run's main task, and
        # asyncio.run then raises KeyboardInterrupt after every task is cancelled); a KeyboardInterrupt raised
        # here could land inside another task (a metrics scrape), which asyncio would report as a traceback
        h = signal.getsignal(signal.SIGINT)
        if callable(h) and h is not signal.default_int_handler:
            h(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                saved[sig] = signal.signal(sig, _stop)
    try:
        outs, scrapes = asyncio.run(_run(url, model, requests, users=users, think_s=think_s, timeout_s=timeout_s,
                                         max_duration_s=max_duration_s, endpoint=endpoint, metrics=metrics,
                                         progress=progress, holder=holder, max_concurrency=max_concurrency))
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: keep what was measured, account for the rest
        interrupted = True
        outs, scrapes = holder.get("outs", []), holder.get("scrapes", [])
        for o in outs:
            if o.status == NOT_SENT and not math.isnan(o.sent_s):
                o.status, o.error = TIMEOUT, "interrupted before it finished"
                o.output_tokens = len(o.token_times)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return {"meta": {"url": url, "model": model, "endpoint": endpoint, "started_unix": started,
                     "users": users, "max_concurrency": max_concurrency, "timeout_s": timeout_s,
                     "max_duration_s": max_duration_s,
                     "interrupted": interrupted, "engine": engine, "provenance": provenance},
            "requests": [asdict(o) for o in outs], "metrics": scrapes,
            "utilisation": holder["sampler"].close() if holder.get("sampler") else None}


def counts(run: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in run["requests"]:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def run_records(run: dict) -> tuple[Records, np.ndarray, np.ndarray]:
    """The successful requests as simulator-style Records (arrival = actual send time) and their ITLs."""
    ok = [r for r in run["requests"] if r["status"] == OK]
    f = lambda k: np.array([r[k] for r in ok], dtype=float)
    rec = Records(arrival=f("sent_s"), first_scheduled=np.full(len(ok), np.nan), first_token=f("first_token_s"),
                  finish=f("finish_s"), prompt_tokens=np.array([r["prompt_tokens"] for r in ok], dtype=np.int64),
                  output_tokens=np.array([r["output_tokens"] for r in ok], dtype=np.int64),
                  cls=np.zeros(len(ok), dtype=np.int64), preemptions=np.zeros(len(ok), dtype=np.int64),
                  replica=np.zeros(len(ok), dtype=np.int64))
    gaps = np.concatenate([np.diff(r["token_times"]) for r in ok if len(r["token_times"]) > 1] or [np.array([])])
    return rec, gaps, np.ones(len(gaps))


def summarize_run(run: dict, seed: int = 0) -> dict:
    rec, gaps, w = run_records(run)
    s = summarize(rec, gaps, w, np.random.default_rng(seed), ci=len(rec) >= 100)
    d = s.as_dict()
    d["outcomes"] = counts(run)
    cap = (run.get("meta") or {}).get("max_concurrency")
    if cap:  # behind the client's cap: how long the successful requests waited for a slot (sent - scheduled)
        d["client_wait"] = wait_stats(np.array([r["sent_s"] - r["scheduled_s"] for r in run["requests"]
                                                if r["status"] == OK]), cap)
    return d
