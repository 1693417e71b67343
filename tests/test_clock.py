"""The executor's injected clock: wall time for real runs, virtual time for runs on a simulated cluster.

The controller's own loop runs here on a :class:`VirtualClock` with the stand-in backend and runtime of
tests/test_brackets_replan.py (no Ray): every event it journals is stamped with virtual time, and the durations
it measures are virtual ones. The wall clock is the one every real run uses (all the end-to-end tests).
"""

from __future__ import annotations

import math
import time

import pytest
from executor_helpers import FakeRuntime, finish_oldest_trial, journaled_controller, write_hyperband_job
from test_brackets_replan import _close, _events, _plan

from rubberband.executor import journal as J
from rubberband.executor.brackets import ParallelController
from rubberband.executor.clock import WALL_CLOCK, Clock, VirtualClock, WallClock

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


def test_the_controllers_loop_on_a_virtual_clock_journals_virtual_time(tmp_path, monkeypatch):
    """Both brackets of a Hyperband run start at once; each wait finishes the oldest running trial 10 virtual
    seconds later. Every event the controller journals carries virtual time, in order, and the trials' journaled
    durations are the virtual ones."""
    _, spec = write_hyperband_job(tmp_path)
    clock = VirtualClock(VIRTUAL_START)
    controller, _ = journaled_controller(
        tmp_path,
        spec,
        _plan(spec, offsets=(0.0, 0.0)),
        deadline_s=400.0,
        controller_class=ParallelController,
        runtime=FakeRuntime(),
        clock=clock,
    )
    controller.search = controller._restore_search()
    controller.startup_seconds = {"local.cpu1": [10.0, 12.0], "local.cpu2": [10.0, 12.0]}
    controller._last_liveness = clock.monotonic() + 3600  # the stand-in backend calls every instance lost

    def wait_some():
        if controller.running:
            clock.sleep(10.0)
        return finish_oldest_trial(controller, clock)

    monkeypatch.setattr(controller, "_wait_some", wait_some)
    best, _ = controller._run_stages()
    _close(controller)
    assert best is not None
    written = _events(controller)[len(J.read_state(controller.run_dir).trials) + 1 :]  # after the helper's own
    assert written and {e["stage"] for e in written if e["type"] == J.STAGE_FINISHED} == {0, 1, 2}
    stamps = [e["t"] for e in written]
    assert all(VIRTUAL_START <= t <= clock.time() for t in stamps), stamps
    # `t` is when an event happened: the loop journals most as they happen, so in order, but a termination is
    # journaled once the loop collects it, stamped when the terminator thread's terminate call returned (and an
    # instance's request once it arrives, stamped with the provider's launch time). On a loaded machine a
    # termination done before the loop's clock moved on was collected after it: 10 virtual seconds older than the
    # events before it.
    as_they_happen = [e["t"] for e in written if e["type"] not in (J.INSTANCE_REQUESTED, J.INSTANCE_TERMINATED)]
    assert as_they_happen == sorted(as_they_happen)
    requested = {e["id"]: e["t"] for e in written if e["type"] == J.INSTANCE_REQUESTED}
    ready = {e["id"]: e["t"] for e in written if e["type"] == J.INSTANCE_READY}
    assert requested and all(requested[i] <= ready[i] for i in requested)
    stopped = [e for e in written if e["type"] == J.TRIAL_STOPPED]
    assert stopped and all(
        e["seconds"] % 10.0 == pytest.approx(0.0, abs=1e-6) and e["seconds"] >= 10.0 for e in stopped
    )
