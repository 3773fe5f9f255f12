"""Public traces as published (issue 51 item 1): Mooncake, Azure, BurstGPT read as their sources define them,
checked row by row, streamed in bounded memory, converted to capacity's trace and replayed by `simulate`."""
import json
import tracemalloc

import pytest

from capacity.errors import ConfigError
from capacity.traces import Counts, convert, detect, parse_window, rows, stats
from capacity.workload import load_trace
from tests.conftest import ROOT, run_cli

SAMPLES = ROOT / "examples" / "traces"


def test_the_bundled_samples_are_read_as_their_sources_define_them():
    mc, az = SAMPLES / "mooncake_conversation_head.jsonl", SAMPLES / "azure_conv_2023_head.csv"
    assert detect(mc) == "mooncake" and detect(az) == "azure"
    first = list(rows(mc, max_rows=2))
    # line 1 of the Mooncake file: {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0..13]}
    assert first[0].t == 0 and (first[0].input_tokens, first[0].output_tokens) == (6758, 500)
    assert first[0].block_ids == tuple(range(14)) and first[1].block_ids[0] == 0
    late = [r for r in rows(mc) if r.t > 2.9][0]  # "timestamp": 3000 is milliseconds: 3 s
    assert late.t == pytest.approx(3.0) and late.input_tokens == 13544
    a = list(rows(az, max_rows=2))  # 2023-11-16 18:15:46.6805900 then 18:15:50.9951690: 4.314579 s apart
    assert a[0].t == 0 and a[1].t == pytest.approx(4.314579, abs=1e-6)
    assert (a[0].input_tokens, a[0].output_tokens, a[1].input_tokens) == (374, 44, 396)
    assert sum(1 for _ in rows(az)) == 400


def test_prefix_reuse_counts_blocks_an_earlier_request_had(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]},  # 1,024 reused
        {"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [0, 3]}]) + "\n")  # 512 reused
    st = stats(f)
    assert st.reused_prompt_share == pytest.approx((1024 + 512) / (1024 + 1500 + 700))
    assert st.duration_s == 2.0 and st.mean_input == pytest.approx(3224 / 3)


def test_burstgpt_failed_requests_are_dropped_and_counted(tmp_path):
    f = tmp_path / "b.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,230,1317,Conversation log\n"
                 "118,GPT-4,417,0,417,API log\n120,GPT-4,300,12,312,API log\n")
    c = Counts()
    got = list(rows(f, counts=c))
    assert detect(f) == "burstgpt" and [(r.t, r.input_tokens) for r in got] == [(0, 472), (40, 1087), (115, 300)]
    assert (c.read, c.kept, c.dropped_zero) == (4, 3, 1)


def test_window_and_time_scale(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"timestamp": t, "input_tokens": 10, "output_tokens": 2}) + "\n"
                         for t in (0, 30, 60, 90, 120, 150)))
    got = [r.t for r in rows(f, window=parse_window("60:150"), time_scale=0.5)]
    assert got == [0, 15, 30]  # 60, 90, 120 s from the start, re-based at 60 s and halved
    for bad in ("150:60", "x:1", "60", "-5:10"):
        with pytest.raises(ConfigError, match="--window"):
            parse_window(bad)


@pytest.mark.parametrize("text,needle", [
    ('{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
     '{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": []}\n', "line 2: timestamp goes back in time"),
    ('{"timestamp": 0, "input_length": 10.7, "output_length": 1, "hash_ids": []}\n', "line 1: input_length 10.7"),
    ('{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": []}\n', "line 1: input_length True"),
    ('{"timestamp": 0, "input_length": 5, "output_length": -2, "hash_ids": []}\n', "line 1: output_length -2 is negative"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": []}\n', "line 1: timestamp -1"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-3]}\n', "line 1: hash_ids"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,5\n", "row 2: TIMESTAMP 'yesterday'"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,4\n", "needs the columns"),
    ("hello\n", "format not recognised"),
])
def test_bad_rows_are_one_line_naming_the_row_and_field(tmp_path, text, needle):
    f = tmp_path / ("t.csv" if "," in text.splitlines()[0] and not text.startswith("{") else "t.jsonl")
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        list(rows(f))


def test_a_trace_streams_row_by_row_in_bounded_memory(tmp_path):
    """Rows are read as they are used: the first ones come before a broken last line is ever read, and a pass
    over 20,000 rows holds none of them (the 1-million-row figure is in bench/trace_replay.py)."""
    import itertools

    f = tmp_path / "long.jsonl"
    with f.open("w") as out:
        for i in range(20_000):
            out.write(f'{{"timestamp": {i * 10}, "input_length": {600 + i % 7}, "output_length": 50, '
                      f'"hash_ids": [{i % 100}, {100 + i}]}}\n')
        out.write("not json\n")
    assert len(list(itertools.islice(rows(f), 5))) == 5
    with pytest.raises(ConfigError, match="line 20001: not valid JSON"):
        stats(f)
    tracemalloc.start()
    st = stats(f, max_rows=20_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert st.counts.kept == 20_000 and st.mean_rate == pytest.approx(20_000 / 199.99, rel=1e-3)
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB"  # the lengths' reservoir and the block ids, not the rows


def test_convert_then_replay(tmp_path):
    out = tmp_path / "t.jsonl"
    c = convert(SAMPLES / "azure_conv_2023_head.csv", out, window=parse_window(":30"))
    reqs = load_trace(out)
    assert len(reqs) == c.kept and reqs[0].arrival_s == 0 and reqs[-1].arrival_s < 30
    with pytest.raises(ConfigError, match="exists"):
        convert(SAMPLES / "azure_conv_2023_head.csv", out)
    r = run_cli("simulate", "-m", "tiny", "--trace", str(SAMPLES / "azure_conv_2023_head.csv"), "-n", "100",
                "--json")
    assert r.returncode == 0, r.stderr[-1500:]
    got = json.loads(r.stdout)
    assert got["requests"] == 100 and 0 < got["summary"]["n_requests"] <= 100
    r = run_cli("trace", "stats", str(SAMPLES / "mooncake_conversation_head.jsonl"))
    assert r.returncode == 0 and "prefix reuse: 13.7%" in r.stdout and "--target-rate 3.08" in r.stdout
    r = run_cli("simulate", "-m", "tiny", "--rate", "1", "--window", "0:10")
    assert r.returncode == 1 and "apply to --trace" in r.stderr


def test_a_traces_prefix_ids_are_hits_in_the_prefix_cache(tmp_path):
    """Mooncake's hash_ids replayed: a second 8,192-token prompt whose 16 ids all repeat the first's recomputes
    only its last token; one sharing the first 8 ids (4,096 tokens) recomputes about half; one with new ids all
    of it. Each second request comes after the first has finished, so only the cache differs."""
    import json as _json

    def second_ttft(ids2):
        f = tmp_path / f"t{ids2[0]}_{ids2[-1]}.jsonl"
        f.write_text(_json.dumps({"timestamp": 0, "input_length": 8192, "output_length": 16,
                                  "hash_ids": list(range(16))}) + "\n"
                     + _json.dumps({"timestamp": 30000, "input_length": 8192, "output_length": 16,
                                    "hash_ids": ids2}) + "\n")
        r = run_cli("simulate", "-m", "llama-3.1-8b", "--trace", str(f), "-n", "2", "--warmup", "0",
                    "--prefix-caching", "--json", "--frontend-ms", "0", "--frontend-us-per-token", "0")  # the engine
        assert r.returncode == 0, r.stderr[-1000:]
        s = _json.loads(r.stdout)["summary"]
        hits.append(s.get("prefix_hit_rate"))
        return s["ttft_s"]["mean"]

    hits: list = []
    first_and_new = second_ttft(list(range(100, 116)))  # both requests pay a whole prefill: the mean is one
    same = 2 * second_ttft(list(range(16))) - first_and_new
    half = 2 * second_ttft(list(range(8)) + list(range(200, 208))) - first_and_new
    # hits over both prompts (16,384 tokens): none; (8,192 - 1) // 16 = 511 blocks of 16; 8 chunks of 512
    assert hits == [None, pytest.approx(511 * 16 / 16384), pytest.approx(8 * 512 / 16384)]
    assert same < 0.1 * first_and_new
    assert 0.4 * first_and_new < half < 0.65 * first_and_new


def test_plan_sizes_for_a_traces_busiest_minute_and_its_lengths():
    """The Azure sample's busiest 60 s hold 289 arrivals (4.82 req/s: `trace stats`), its lengths a mean prompt
    of 928 tokens; `plan --trace` plans that rate with the rows' lengths."""
    r = run_cli("plan", "-m", "tiny", "--trace", str(SAMPLES / "azure_conv_2023_head.csv"), "--tp", "1",
                "--max-num-seqs", "256",  # the sizing from the trace is this test's subject, not the frontier search
                "--requests", "100", "--seeds", "1", "--executor", "serial", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    p = json.loads(r.stdout)
    assert p["target_rate"] == 4.82
    wl = p["scenario"]["workload"]
    assert wl["input_len"]["kind"] == "empirical" and len(wl["input_len"]["values"]) == 400
    assert sum(wl["input_len"]["values"]) / 400 == pytest.approx(stats(SAMPLES / "azure_conv_2023_head.csv").mean_input)
