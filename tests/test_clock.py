"""The executor's injected clock: wall time for real runs, virtual time for runs on a simulated cluster.

The executor's loop runs here on a :class:`VirtualClock` with the simulated cloud and cluster
(tests/sim_helpers.py, no Ray): every event it journals is stamped with virtual time, and the durations it
measures are virtual ones. The wall clock is the one every real run uses (all the end-to-end tests).
"""

from __future__ import annotations

import math
import time

import pytest
from executor_helpers import make_plan, write_job
from sim_helpers import START, SimCase, cpu_model

from rubberband.executor import journal as J
from rubberband.executor.clock import WALL_CLOCK, Clock, VirtualClock, WallClock
from rubberband.spec import load_spec

VIRTUAL_START = 1_000_000.0  # 1970-01-12: far from any wall-clock reading of today


def test_a_virtual_clock_moves_only_when_told():
    clock = VirtualClock(VIRTUAL_START)
    assert clock.time() == clock.monotonic() == VIRTUAL_START
    clock.sleep(2.5)
    assert clock.time() == VIRTUAL_START + 2.5
    clock.advance_to(VIRTUAL_START + 1.0)  # never back
    assert clock.time() == VIRTUAL_START + 2.5
    clock.advance_to(VIRTUAL_START + 10.0)
    assert clock.monotonic() == VIRTUAL_START + 10.0
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            clock.sleep(bad)
    with pytest.raises(ValueError):
        clock.advance_to(math.inf)
    with pytest.raises(ValueError):
        VirtualClock(math.nan)
    assert isinstance(clock, Clock) and isinstance(WALL_CLOCK, Clock)


def test_the_wall_clock_is_the_machines():
    clock = WallClock()
    before = time.time()
    clock.sleep(0.01)
    assert before <= clock.time() <= time.time() and clock.monotonic() <= time.monotonic()


def test_a_run_on_a_virtual_clock_journals_virtual_time(tmp_path):
    """The real executor on a simulated cluster (tests/sim_helpers.py): 9 one-epoch trials on two ``local.cpu2``
    then 3 on one, each epoch 10 virtual seconds. Every event it journals carries virtual time, in order, and
    the trials' journaled durations are the virtual ones; the run takes virtual minutes in wall milliseconds."""
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    case = SimCase(spec, plan, model=cpu_model(epoch_s=10.0, startup_s=5.0))
    sim = case.world()
    wall = time.monotonic()
    out = case.run(tmp_path / "run", sim=sim)
    wall = time.monotonic() - wall
    assert out.result.status == "finished"
    written = out.events
    assert {e["stage"] for e in written if e["type"] == J.STAGE_FINISHED} == {0, 1}
    stamps = [e["t"] for e in written]
    assert all(START <= t <= sim.clock.time() for t in stamps), stamps
    assert written[0]["t"] == START  # the run started when the virtual clock did
    assert out.result.result["actual"]["jct_s"] > 10 * wall  # virtual seconds, not the machine's
    # `t` is when an event happened: the loop journals most as they happen, so in order; an instance's request is
    # journaled once it arrives, stamped with the provider's launch time, and a termination once the loop collects
    # it, stamped when the terminate call returned
    as_they_happen = [e["t"] for e in written if e["type"] not in (J.INSTANCE_REQUESTED, J.INSTANCE_TERMINATED)]
    assert as_they_happen == sorted(as_they_happen)
    requested = {e["id"]: e["t"] for e in written if e["type"] == J.INSTANCE_REQUESTED}
    ready = {e["id"]: e["t"] for e in written if e["type"] == J.INSTANCE_READY}
    assert requested and all(ready[i] - requested[i] == pytest.approx(5.0) for i in requested)
    stopped = [e for e in written if e["type"] == J.TRIAL_STOPPED]
    assert len(stopped) == 12 and all(e["seconds"] == pytest.approx(10.0) for e in stopped)
