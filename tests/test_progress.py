"""Progress by phase (issue 48 item 8): piped, one line per phase that ran simulations, with the time so far and
an estimate of the time left; nothing on a terminal (its bar names the phase) or when progress is off."""
import io

from capacity.plan.progress import Phases


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_each_phase_ends_with_one_line_and_the_estimate_follows_the_pace():
    out, clock = io.StringIO(), Clock()
    ph = Phases(True, out, clock)
    ph.option(0, 2, "h100-sxm")
    ph.begin("rate search at tp=1", 0, 4)  # 1 of 4 phases of the first of 2 options: 1/8 of the command
    ph.count(3)
    ph.count(2)
    clock.t += 10
    ph.begin("frontier", 1, 4)  # the first phase took 10 s for 1/8: 70 s left at that pace
    ph.count(1)
    clock.t += 20
    ph.begin("context trade-off", 2, 4)
    ph.begin("verification", 3, 4)  # a phase without simulations (all cached) prints nothing
    ph.option(1, 2, "mi300x")
    ph.begin("rate search at tp=1", 3, 4)  # the last phase of the last option: 8/8, no estimate
    ph.count(4)
    clock.t += 5
    ph.end()
    assert out.getvalue().splitlines() == [
        "[10 s] h100-sxm (1/2): rate search at tp=1: 5 simulations in 10 s; about 1 min 10 s left",
        "[30 s] h100-sxm (1/2): frontier: 1 simulation in 20 s; about 1 min 30 s left",  # 2/8 done in 30 s
        "[35 s] mi300x (2/2): rate search at tp=1: 4 simulations in 5 s",
    ]


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_no_lines_and_progress_off_gets_nothing():
    for stream, enabled in ((Tty(), True), (io.StringIO(), False)):
        ph = Phases(enabled, stream, Clock())
        ph.begin("rate search at tp=1", 0, 4)
        ph.count(3)
        ph.end()
        assert stream.getvalue() == ""
    assert Phases(True, Tty(), Clock()).label == "simulating"
    ph = Phases(True, Tty(), Clock())
    ph.option(1, 3, "l40s (sglang)")
    ph.begin("frontier", 1, 4)
    assert ph.label == "l40s (sglang) (2/3): frontier"


def test_a_plan_names_its_phases():
    """A real plan through the executor: its phases, in order, each with the simulations it ran (a clock that
    moves 10 s per reading, so every phase is past the quiet first seconds)."""
    from capacity.model.card import load_named_card
    from capacity.plan.executors import SerialExecutor
    from capacity.plan.planner import Scenario, SearchSpec, make_plan

    class Ticking:
        t = 0.0

        def __call__(self):
            self.t += 10
            return self.t

    out = io.StringIO()
    ex = SerialExecutor(cache=False)
    ex.phases = Phases(True, out, Ticking())
    sc = Scenario(model="tiny", target_rate_per_s=10, search=SearchSpec(seeds=1, requests=100, tp=[1]))
    make_plan(sc, load_named_card("tiny"), ex)
    ex.close()
    names = [line.split("] ", 1)[1].split(":")[0] for line in out.getvalue().splitlines()]
    assert names[0] == "rate search at tp=1" and names[1] == "frontier (max_num_seqs x max_model_len)"
    assert "verification at 10 req/s on 1 replica(s)" in names
    assert all(" simulation" in line for line in out.getvalue().splitlines())
