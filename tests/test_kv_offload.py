"""KV offloading to host memory (capacity/sched/offload.py, capacity/engine/offload.py; docs/kv-offload.md): the
tier's size and load time from the settings by hand, misses turned into hits on a reuse workload derived by hand,
the load time in the step that admits the request, and one-line errors."""
import json

import numpy as np
import pytest

from capacity.cost.step import LinearCost
from capacity.engine.offload import Offloading, host_link_gbps, tier_size
from capacity.sched import make_scheduler
from capacity.sched.offload import OffloadingKVCacheManager
from capacity.sim.simulator import simulate
from capacity.workload import Request
from tests.conftest import run_cli

# Llama-3.1-8B's KV per token, bf16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 131,072 bytes
LLAMA8_KV = 32 * 8 * 128 * 2 * 2


def test_tier_size_and_load_time_by_hand():
    # 64 GiB over one rank, 16-token blocks of 2 MiB: 32,768 blocks; a block over 64 GB/s: 2 MiB / 64e9 s
    assert LLAMA8_KV == 131_072
    blocks, s = tier_size(64, 1, 16, LLAMA8_KV, 64.0)
    assert blocks == 32_768 and s == pytest.approx(2**21 / 64e9, rel=1e-15)  # 32.768 us
    # tp=2: 64 GiB summed over the ranks is 32 GiB each; a rank's share of a block is 1 MiB, loaded in parallel
    blocks, s = tier_size(64, 2, 16, LLAMA8_KV / 2, 64.0)
    assert blocks == 32_768 and s == pytest.approx(2**20 / 64e9, rel=1e-15)
    # 1 GiB of 3 MiB blocks: 341 whole blocks (the rest unused)
    assert tier_size(1, 1, 16, 3 * 2**16, 32.0)[0] == 341


def test_host_link_by_gpu():
    assert host_link_gbps("h100-sxm") == (64.0, "PCIe 5.0 x16")
    assert host_link_gbps("a100-80gb") == (32.0, "PCIe 4.0 x16")
    assert host_link_gbps("t4") == (16.0, "PCIe 3.0 x16")
    assert host_link_gbps("gh200")[0] == 450.0


def test_the_cli_reports_the_tier_it_was_given():
    """The tier's size, block load time and link as given (settings, not simulation results: a short run)."""
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "2", "-n", "20", "--input-len", "512",
                "--output-len", "64", "--prefix-caching",
                "--kv-offload-gb", "64", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    k = json.loads(r.stdout)["kv_offload"]
    assert k["host_blocks_per_replica"] == 32_768 and k["block_size"] == 16
    assert k["load_s_per_block"] == pytest.approx(2**21 / 64e9, rel=1e-12)
    assert k["host_link"] == "PCIe 5.0 x16, 64 GB/s"
    r = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rate", "2", "-n", "20", "--input-len", "512",
                "--output-len", "64", "--prefix-caching",
                "--kv-offload-gb", "64", "--host-link-gbps", "25", "--json", timeout=300)
    assert json.loads(r.stdout)["kv_offload"]["load_s_per_block"] == pytest.approx(2**21 / 25e9, rel=1e-12)


# A reuse workload, by hand. One request at a time (each done before the next arrives), 16-token blocks, a GPU pool
# of 5 blocks. A request of prefix group G has a 65-token prompt whose first 64 tokens are G's: 4 full blocks keyed
# (G, i), a fifth partly filled (its own), and one output token. Sequence A (group 0), B (group 1), A again (0):
# - GPU only: A takes blocks 0-4, frees them (4 keyed to the free queue's tail, 1 unkeyed to its head); B takes the
#   unkeyed one and evicts A's 4 keyed ones; A again finds nothing: 0 of its 65 tokens cached.
# - host tier of 8 blocks: A's and B's keyed blocks were written through (8 stored, none evicted); A again misses
#   on the GPU and hits its 4 blocks in host memory: 64 tokens not computed, 4 blocks loaded.
# - host tier of 4 blocks: B's 4 stores evict A's 4 (least recently used): A again misses in both tiers (and,
#   computed again, is written through again, evicting B's).
def reuse(host_blocks: int | None, load_block_s: float = 0.01):
    reqs = [Request(i, t, 65, 1, prefix_group=g, prefix_tokens=64) for i, (t, g) in enumerate([(0.0, 0), (10.0, 1),
                                                                                             (20.0, 0)])]

    def sched():
        return make_scheduler("continuous", max_num_seqs=1, max_num_batched_tokens=4096, num_blocks=5,
                              block_size=16, prefix_caching=True)

    factory = sched if host_blocks is None else Offloading(sched, host_blocks, load_block_s, "test")
    res = simulate(reqs, LinearCost(per_token_s=1e-3), factory, np.random.default_rng(0))
    kv = factory.managers[0] if isinstance(factory, Offloading) else None
    return res, kv


def test_the_host_tier_turns_a_gpu_eviction_into_a_hit():
    res, _ = reuse(None)
    np.testing.assert_array_equal(res.records.cached_tokens, [0, 0, 0])
    res, kv = reuse(8)
    np.testing.assert_array_equal(res.records.cached_tokens, [0, 0, 64])
    assert (kv.host_hit_blocks, kv.loaded_blocks, kv.gpu_hit_blocks, kv.stored_blocks, kv.evicted_blocks) == (
        4, 4, 0, 8, 0)
    # the prompt tokens found cached: 64 of the 3 x 65 prompted
    assert res.records.cached_tokens.sum() / res.records.prompt_tokens.sum() == pytest.approx(64 / 195)


def test_a_host_tier_too_small_keeps_the_miss():
    res, kv = reuse(4)
    np.testing.assert_array_equal(res.records.cached_tokens, [0, 0, 0])
    # A's 4 stored; B's 4 stored, evicting A's; A again computed and its 4 stored, evicting B's
    assert (kv.host_hit_blocks, kv.stored_blocks, kv.evicted_blocks) == (0, 12, 8)


def test_the_load_is_in_the_step_that_admits_the_request():
    # 1 ms per token computed. A and B: 65 tokens, 65 ms. A again: 1 token computed (the other 64 loaded) and 4
    # blocks x 10 ms of load in that step: 41 ms; without the tier it computes all 65 tokens, 65 ms.
    res, _ = reuse(8, load_block_s=0.01)
    ttft = res.records.first_token - res.records.arrival
    np.testing.assert_allclose(ttft, [0.065, 0.065, 0.001 + 4 * 0.01], rtol=1e-12)
    res, _ = reuse(None)
    np.testing.assert_allclose(res.records.first_token - res.records.arrival, [0.065] * 3, rtol=1e-12)


def test_an_admission_that_fails_gives_its_host_hits_back():
    from capacity.sched.base import Seq

    def fresh(num_blocks):
        kv = OffloadingKVCacheManager(num_blocks, 16, 8, 0.01)
        kv.host.update({(0, -1, i): None for i in range(4)})  # as if written through earlier
        return kv, Seq(Request(0, 0.0, 65, 1, prefix_group=0, prefix_tokens=64))

    kv, a = fresh(4)
    kv.get_computed_blocks(a)
    assert a.computed == 64 and kv.host_pending[a] == 4
    assert not kv.allocate_slots(a, 1)  # 65 tokens need 5 blocks, the pool has 4: refused, nothing taken
    kv.drop_computed_blocks(a)  # as the scheduler does then
    assert a.computed == 0 and a not in kv.host_pending and kv.take_load_s() == 0.0 and kv.host_hit_blocks == 0
    kv, a = fresh(5)
    kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 1) and a.cached_tokens == 64
    assert kv.take_load_s() == pytest.approx(0.04) and kv.take_load_s() == 0.0  # taken once


@pytest.mark.parametrize("args, said", [
    (["--kv-offload-gb", "8"], "needs the prefix cache on (--prefix-caching)"),
    (["--kv-offload-gb", "0", "--prefix-caching"], "kv_offloading_size"),
    (["--kv-offload-gb", "8", "--prefix-caching", "--engine", "sglang"],
     "kv_offloading_size 8.0: vLLM only (engine sglang does not have this setting)"),  # not an SglangConfig field
    (["--kv-offload-gb", "8", "--prefix-caching", "--engine", "vllm@0.11"],
     "engine vllm@0.11 has no --kv-offloading-size (vLLM 0.14.0 added it"),  # its 0.11-0.13 form is --kv-transfer-config
    (["--kv-offload-gb", "8", "--prefix-caching", "--engine", "vllm@0.13.0"], "has no --kv-offloading-size"),
    (["--host-link-gbps", "20"], "host_link_gbps: applies to KV offloading"),
    (["--kv-offload-gb", "0.001", "--prefix-caching"], "less than one KV block of host memory"),
])
def test_bad_input_is_one_line(args, said):
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "20", *args)
    assert r.returncode == 1 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_release_with_the_flag_is_accepted():
    """vllm@X from 0.14 on (pull request 24498) takes the tier; before, the engine spec with a version was refused."""
    r = run_cli("simulate", "-m", "llama-3.1-8b", "--rate", "1", "-n", "20", "--engine", "vllm@0.14",
                "--kv-offload-gb", "8", "--prefix-caching", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "KV offload:" in r.stdout
