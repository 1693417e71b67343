"""Re-planning after a failover in a run whose Hyperband brackets run side by side (``ParallelController``).

When failover finds a planned type unavailable (every zone blocked, or another type obtained in its place), the
remaining work of every bracket — the boundary re-plan's remainder — is re-planned without it at once, as a
sequential run re-plans after a failover: the re-planner with the type excluded, else (no re-planner, or its
proposal unusable) each stage's stand-in; journaled as ``decision`` kind ``replan`` with ``trigger: failover``,
then ``plan_changed``; followed by the lanes; once per unavailable type. A run resumed after it goes on with the
changed plan.

The controller's pieces are driven by hand (:func:`_pass` is one pass of its loop, in the loop's order) with the
stand-in backend and runtime of tests/test_brackets_replan.py, plus failover: a request for a swapped type blocks
every zone of it (the backend then calls it unavailable) and gets the stand-in type, as
:class:`~rubberband.cloud.backend.CloudBackend` reports it. The real failover of a cloud run, re-planned at a
sequential run's boundary, is tests/test_cloud_gcp_failover.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time

import pytest
from executor_helpers import (
    FakeRuntime,
    LosingBackend,
    finish_oldest_trial,
    finished_outcome,
    journaled_controller,
    write_hyperband_job,
)
from test_brackets_replan import Backend, StubReplanner, _close, _controller, _events, _plan, _replans, _served, _up

from rubberband.cloud.backend import Obtained
from rubberband.commands.run import _journaled
from rubberband.executor import journal as J
from rubberband.executor.brackets import ParallelController

CPU1, CPU2 = "local:local:local.cpu1", "local:local:local.cpu2"


class FailoverBackend(Backend):
    """The stand-in backend with failover. A request for a type of ``swap`` blocks every zone of it first (from
    then on :meth:`unavailable`), waits for ``gate`` when one is given (failover still trying), then gets
    ``swap[type]`` instead (:meth:`obtained` says so). Types in ``blocked`` are unavailable too."""

    def __init__(self, inner, catalog, swap: dict[str, str], gate: threading.Event | None = None) -> None:
        super().__init__(inner)
        self.catalog, self.swap, self.gate = catalog, swap, gate
        self.blocked: set[str] = set()
        self.got: dict[str, Obtained] = {}

    def unavailable(self, itype, spot: bool = False) -> bool:
        return itype.name in self.blocked

    def obtained(self, instance_id):
        return self.got.get(instance_id)

    def provision(self, request):
        name = request.instance_type.name
        if name not in self.swap:
            return self.inner.provision(request)
        self.blocked.add(name)
        if self.gate is not None:
            assert self.gate.wait(30)
        stand_in = self.catalog.find(self.swap[name])
        instances = self.inner.provision(dataclasses.replace(request, instance_type=stand_in))
        self.got[instances[0].id] = Obtained(stand_in, "local-a")
        return instances


def _failover_controller(tmp_path, replanner, swap, gate=None):
    controller, inner = _controller(tmp_path, replanner)
    backend = FailoverBackend(inner, controller.catalog, swap, gate)
    controller.backend = backend
    return controller, backend


def _pass(controller, lane) -> None:
    """One pass of the loop for ``lane``: instances that came up collected (waiting briefly for the provisioner
    thread), the failover re-plan, free slots filled, the lane's first running trial finished and collected (loss:
    its index / 10), the lane tended."""
    futures = [e.future for e in controller.pool.values() if e.future is not None]
    concurrent.futures.wait(futures, timeout=0.5)
    startups = {k: list(v) for k, v in controller.startup_seconds.items()}
    controller._collect_provisioned()
    controller.startup_seconds = startups  # the stand-in's instant start-ups would shorten the prefetch lead
    controller._replan_on_failover()
    controller._fill_slots(lane)
    mine = [
        (ref, run)
        for ref, run in controller.running.items()
        if controller.state.trials[run.trial_id].bracket == lane.bracket
    ]
    if mine:
        ref, run = mine[0]
        del controller.running[ref]
        run.handle.outcome = finished_outcome(
            run.trial_id, run.start_epoch, run.end_epoch, int(run.trial_id.rsplit("t", 1)[1]) / 10
        )
        controller._collect(lane, [run])
    controller._tend_lane(lane)


def _until_prefetched(controller, lane, g: int) -> None:
    """Passes until stage ``g`` (the lane's next) has its instances requested ahead, its stage still running."""
    for _ in range(10):
        if g in controller.prefetched:
            return
        _pass(controller, lane)
        assert lane.g == g - 1
    pytest.fail(f"stage {g} was never prefetched")


def _failover_replans(controller) -> list[dict]:
    return [e for e in _replans(controller) if e.get("trigger") == "failover"]


def events_index(controller, event: dict) -> int:
    return _events(controller).index(event)


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the provisioner thread never got there"
        time.sleep(0.01)


def test_a_type_blocked_everywhere_is_replanned_around_at_once_and_the_lanes_run_the_new_plan(tmp_path):
    # stage 1 (bracket 0's next) is planned on local.cpu2; its prefetched request finds it sold out in every zone
    # and failover is still trying the stand-in when the loop sees the type blocked: every bracket's remaining
    # work is re-planned without it, mid-stage; the re-planner puts stage 1 on a local.cpu4
    replanner = StubReplanner(current_p_meet=0.99, changes={1: ("local.cpu4", 1, 2)})
    gate = threading.Event()
    controller, backend = _failover_controller(tmp_path, replanner, {"local.cpu2": "local.cpu1"}, gate)
    controller._start_due(0.0)
    lane = controller.lanes[0]
    _up(controller)  # stage 0's two local.cpu1 nodes
    _until_prefetched(controller, lane, 1)
    (prefetched,) = controller._stage_pool(1)
    _wait_for(lambda: "local.cpu2" in backend.blocked)
    _pass(controller, lane)
    assert lane.g == 0 and lane.trials  # still stage 0: its last trial runs

    (request,) = replanner.requests
    assert request.unavailable == (CPU2,)
    # the remainder: bracket 0 after its current stage, bracket 1 (not started) at its offset, counted from then
    assert request.next_stage == 1 and request.stages == (1, 2)
    (decision,) = _failover_replans(controller)
    assert decision["accepted"] and decision["source"] == "replanner" and decision["unavailable"] == [CPU2]
    assert decision["stage"] == 1 and decision["bracket"] == 0 and decision["stages"] == [1, 2]
    wait = decision["starts_in_s"]
    assert wait > 0 and request.offsets_s == (0.0, pytest.approx(100.0 - wait, abs=2.0))
    assert request.remaining_deadline_s == pytest.approx(400.0 - wait, abs=2.0)
    assert "local.cpu2 unavailable in every zone" in decision["reason"]
    (changed,) = [e for e in _events(controller) if e["type"] == J.PLAN_CHANGED]
    assert changed["stage"] == 1 and events_index(controller, changed) > events_index(controller, decision)
    assert [s["instance_type"] for s in changed["plan"]["stages"]] == ["local.cpu1", "local.cpu4", "local.cpu1"]
    assert J.read_state(controller.run_dir).plan["stages"][1]["instance_type"] == "local.cpu4"
    # the lanes follow: the request still failing over is released when it is up; stage 1 asks for a local.cpu4
    assert prefetched.released
    gate.set()
    for _ in range(10):
        if lane.g == 1:
            break
        _pass(controller, lane)
    _served(controller)
    _up(controller)
    controller._fill_slots(lane)
    events = _events(controller)
    (failover,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]
    assert (failover["requested"], failover["obtained"]) == ("local.cpu2", "local.cpu1")
    controller._collect_terminations(wait=True)
    assert failover["id"] in backend.terminated  # the stand-in nobody needs any more
    (started,) = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    (node,) = started["instances"]
    assert controller._entry(node).itype.name == "local.cpu4" and started["workers"] == 2
    # once per type: later passes and the boundary's re-plan do not re-plan around it again
    controller._replan_on_failover()
    assert len(_failover_replans(controller)) == 1
    assert [r.unavailable for r in replanner.requests] == [(CPU2,), ()]  # the boundary's: nothing unavailable
    # a type only running stages use (stage 1 runs on its local.cpu4 already): nothing to re-plan
    backend.blocked.add("local.cpu4")
    controller._replan_on_failover()
    assert len(_replans(controller)) == 2 and len(replanner.requests) == 2
    _close(controller)


@pytest.mark.parametrize(
    "replanner, note",
    [
        (None, None),
        # the re-planner's proposal keeps the unavailable type: unusable, the stand-ins take over
        (StubReplanner(current_p_meet=0.99), "re-planner's proposal uses an unavailable type"),
    ],
)
def test_without_a_usable_proposal_the_type_failover_obtained_stands_in(tmp_path, replanner, note):
    controller, backend = _failover_controller(tmp_path, replanner, {"local.cpu2": "local.cpu4"})
    before = controller.plan.stages[1].predicted_cost_usd
    controller._start_due(0.0)
    lane = controller.lanes[0]
    _up(controller)
    _until_prefetched(controller, lane, 1)
    _served(controller)
    controller._collect_provisioned()  # stage 1's node came up as a local.cpu4
    assert controller.substitutes == {CPU2: controller.catalog.find("local.cpu4")}
    controller._replan_on_failover()
    assert lane.g == 0
    (decision,) = _failover_replans(controller)
    assert decision["accepted"] and decision["source"] == "substitution"
    assert decision["substitutions"] == {"local.cpu2": "local.cpu4"} and decision["unavailable"] == [CPU2]
    assert decision["stages"] == [1, 2]
    assert (note in decision["reason"]) if note else "(" not in decision["reason"]
    stage = controller.plan.stages[1]
    assert stage.instance_type == "local.cpu4" and stage.workers_per_trial == 2
    assert stage.predicted_cost_usd == pytest.approx(before * 0.20 / 0.10)  # re-priced
    assert controller.plan.stages[2].instance_type == "local.cpu1"  # bracket 1 keeps its available type
    (changed,) = [e for e in _events(controller) if e["type"] == J.PLAN_CHANGED]
    assert changed["plan"]["stages"][1]["instance_type"] == "local.cpu4"
    # the node failover obtained fits the changed stage: kept, and stage 1's trial runs on it; nothing more asked
    (stand_in,) = controller._stage_pool(1)
    assert not stand_in.released and stand_in.itype.name == "local.cpu4"
    for _ in range(10):
        if lane.g == 1:
            break
        _pass(controller, lane)
    controller._fill_slots(lane)
    (started,) = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    assert started["instances"] == [stand_in.id]
    assert len(controller.pool) == 3  # two for stage 0, the one for stage 1
    assert len(_failover_replans(controller)) == 1
    _close(controller)

    # resumed (`rubberband run --resume`: the plan is the journal's last plan_changed): it goes on with the changed
    # plan, so the new executor asks for the stand-in type without a failover of its own
    spec, plan = _journaled(controller.run_dir, J.read_state(controller.run_dir))
    assert plan.stages[1].instance_type == "local.cpu4"
    fresh = LosingBackend()
    resumed = ParallelController(
        spec=spec,
        plan=plan,
        catalog=controller.catalog,
        run_dir=controller.run_dir,
        backend=Backend(fresh),
        runtime=FakeRuntime(),
        run_id="r1",
        deadline_s=400.0,
    )
    resumed.state = resumed.journal.state
    resumed._open_lanes()
    resumed._request_first_instances()  # bracket 0 from its first unfinished stage; bracket 1 not due yet
    _served(resumed)
    assert [(e.itype.name, e.assigned_stage) for e in resumed.pool.values()] == [("local.cpu4", 1)]
    assert resumed._stage_itype(resumed.plan.stages[1]).name == "local.cpu4" and not resumed.substitutes
    _close(resumed)


def test_a_type_found_unavailable_at_a_brackets_start_is_replanned_there_once(tmp_path):
    # bracket 1's stage (local.cpu1) turns unavailable while bracket 0 runs (on local.cpu1 nodes already up): the
    # failover re-plan comes at bracket 1's start, its boundary, before it requests anything
    replanner = StubReplanner(current_p_meet=0.99, changes={2: ("local.cpu2", 1, 1)})
    controller, backend = _failover_controller(tmp_path, replanner, {})
    controller._start_due(0.0)
    _up(controller)
    backend.blocked.add("local.cpu1")
    controller._start_due(150.0)
    (decision,) = _replans(controller)
    assert decision["trigger"] == "failover" and decision["accepted"] and decision["source"] == "replanner"
    assert decision["stage"] == 2 and decision["bracket"] == 1 and decision["stages"] == [2, 1]
    assert decision["unavailable"] == [CPU1] and "starts_in_s" not in decision
    assert replanner.requests[0].offsets_s[0] == 0.0
    assert controller.lanes[1].g == 2 and controller.plan.stages[2].instance_type == "local.cpu2"
    assert [e.itype.name for e in controller._stage_pool(2)] == ["local.cpu2"]
    controller._replan_on_failover()  # the loop's check after it: nothing new
    assert len(_replans(controller)) == 1
    _up(controller)
    _close(controller)


def test_the_loop_replans_after_a_failover_and_runs_every_bracket_to_its_end(tmp_path, monkeypatch):
    """The controller's own loop (``_run_stages``) with both brackets starting at once; only ``ray.wait`` is
    replaced: each wait finishes the oldest running trial once the provisioner thread has served what was asked.
    Stage 1's prefetched local.cpu2 comes up as a local.cpu4; the next pass re-plans (no re-planner: the stand-in),
    and the run ends with stage 1 on that node."""
    _, spec = write_hyperband_job(tmp_path)
    controller, inner = journaled_controller(
        tmp_path,
        spec,
        _plan(spec, offsets=(0.0, 0.0)),
        deadline_s=400.0,
        controller_class=ParallelController,
        runtime=FakeRuntime(),
    )
    backend = FailoverBackend(inner, controller.catalog, {"local.cpu2": "local.cpu4"})
    controller.backend = backend
    controller.search = controller._restore_search()
    controller.startup_seconds = {"local.cpu1": [10.0, 12.0], "local.cpu2": [10.0, 12.0]}
    controller._last_liveness = time.monotonic() + 3600  # the stand-in backend calls every instance lost

    monkeypatch.setattr(controller, "_wait_some", lambda: finish_oldest_trial(controller))
    best, _ = controller._run_stages()
    _close(controller)
    assert best is not None
    events = _events(controller)
    assert {e["stage"] for e in events if e["type"] == J.STAGE_FINISHED} == {0, 1, 2}
    (failover,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]
    (decision,) = _failover_replans(controller)
    assert events.index(decision) > events.index(failover)
    assert decision["source"] == "substitution" and decision["substitutions"] == {"local.cpu2": "local.cpu4"}
    assert decision["stages"] == [1] and "starts_in_s" in decision  # mid-stage: bracket 1 has nothing left to plan
    finished_0 = next(e for e in events if e["type"] == J.STAGE_FINISHED and e["stage"] == 0)
    assert events.index(decision) < events.index(finished_0)
    (changed,) = [e for e in events if e["type"] == J.PLAN_CHANGED]
    assert changed["plan"]["stages"][1]["instance_type"] == "local.cpu4"
    (started,) = [e for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    assert started["instances"] == [failover["id"]]
