"""Re-planning after a failover in a run whose Hyperband brackets run side by side (the executor's lanes).

When failover finds a planned type unavailable (every zone blocked, or another type obtained in its place), the
remaining work of every bracket — the boundary re-plan's remainder — is re-planned without it at once, as a
sequential run re-plans after a failover: the re-planner with the type excluded, else (no re-planner, or its
proposal unusable) each stage's stand-in; journaled as ``decision`` kind ``replan`` with ``trigger: failover``,
then ``plan_changed``; followed by the lanes; once per unavailable type. A run resumed after it goes on with the
changed plan.

Each run is the real executor on virtual time (tests/sim_helpers.py) with the stand-in re-planner of
tests/test_brackets_replan.py. The simulated cloud's sold-out types (``SimScript.sold_out``) are unavailable in
every zone from the run's start: a request for one fails over to the cheapest alternative of the catalog (here the
local catalog plus a second 1-worker and a second 2-worker type), and the executor re-plans around it as soon as it
looks — when an instance comes up, and at a bracket's boundary. The real failover of a cloud run, re-planned at a
sequential run's boundary, is tests/test_cloud_gcp_failover.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from executor_helpers import make_plan, write_hyperband_job
from sim_helpers import KillingJournal, SimCase
from test_brackets_replan import CPU2, MODEL, TASKS, StubReplanner

from rubberband.catalog import Catalog, load_catalog
from rubberband.executor import journal as J
from rubberband.executor.run import Settings
from rubberband.executor.simulated import SimScript
from rubberband.plan import parse_plan

CPU4 = "local:local:local.cpu4"


def _catalog() -> Catalog:
    """The local catalog plus what failover can take in place of a sold-out type of the same workers:
    ``local.cpu1b`` and ``local.cpu2b``, each at twice the price of the type it stands in for."""
    local = load_catalog(["local"])
    extra = tuple(
        dataclasses.replace(local.find(name), name=f"{name}b", price_hr=2 * price, spot_price_hr=None)
        for name, price in (("local.cpu1", 0.05), ("local.cpu2", 0.10))
    )
    return Catalog(types=local.types + extra, dates=dict(local.dates))


def _case(tmp_path, stages, *, sold_out: set[str], replanner=None, offsets=(0.0, 100.0)) -> SimCase:
    """Bracket 0: 3 trials × 1 epoch, then its best for 2 more; bracket 1: 2 trials × 3 epochs, ``offsets[1]``
    after the job; stage types and counts ``stages``; 5 s epochs, start-ups of 2 s (tests/test_brackets_replan)."""
    _, spec = write_hyperband_job(tmp_path)
    plan = make_plan(spec, stages, durations=[10.0, 40.0, 60.0])
    plan = plan.model_copy(
        update={
            "stages": [s.model_copy(update={"predicted_task_s": t}) for s, t in zip(plan.stages, TASKS)],
            "brackets": "parallel",
            "bracket_offsets_s": list(offsets),
        }
    )
    return SimCase(
        spec,
        plan,
        model=MODEL,
        catalog=_catalog(),
        script=SimScript(sold_out=frozenset(sold_out)),
        settings=Settings(deadline_s=400.0),
        replanner=replanner,
    )


def _failover_replans(out) -> list[dict]:
    return [e for e in out.of("replan") if e.get("trigger") == "failover"]


def _types(out) -> dict[str, str]:
    """Each instance's type as obtained (id → type)."""
    return {e["id"]: e["instance_type"] for e in out.of(J.INSTANCE_REQUESTED)}


def test_a_type_blocked_everywhere_is_replanned_around_at_once_and_the_lanes_run_the_new_plan(tmp_path):
    # stage 1 (bracket 0's next) is planned on local.cpu2, sold out in every zone: as stage 0's first node comes
    # up (its stage mid-way) every bracket's remaining work is re-planned without it; the re-planner puts stage 1
    # on a local.cpu4
    replanner = StubReplanner(current_p_meet=0.99, changes={1: ("local.cpu4", 1, 2)})
    stages = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]
    out = _case(tmp_path, stages, sold_out={"local.cpu2"}, replanner=replanner).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    request = replanner.requests[0]
    assert request.unavailable == (CPU2,)
    # the remainder: bracket 0 after its current stage, bracket 1 (not started) at its offset, counted from then
    assert request.next_stage == 1 and request.stages == (1, 2)
    (decision,) = _failover_replans(out)
    assert decision["accepted"] and decision["source"] == "replanner" and decision["unavailable"] == [CPU2]
    assert decision["stage"] == 1 and decision["bracket"] == 0 and decision["stages"] == [1, 2]
    (first_up,) = [e for e in out.of(J.INSTANCE_READY) if e["t"] <= decision["t"]]
    assert decision["t"] == first_up["t"]  # at once: as the run's first node came up
    # stage 0's rest from then: its first node is up, its 3 trials on 2 slots take two waves of 5 s
    wait = decision["starts_in_s"]
    assert wait == pytest.approx(10.0, abs=0.01)
    assert request.offsets_s == (0.0, pytest.approx(100.0 - decision["elapsed_s"] - wait, abs=1e-3))
    assert request.remaining_deadline_s == pytest.approx(400.0 - decision["elapsed_s"] - wait, abs=1e-3)
    assert "local.cpu2 unavailable in every zone" in decision["reason"]
    (changed,) = out.of(J.PLAN_CHANGED)
    assert changed["stage"] == 1 and out.events.index(changed) > out.events.index(decision)
    assert [s["instance_type"] for s in changed["plan"]["stages"]] == ["local.cpu1", "local.cpu4", "local.cpu1"]
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu4"
    # the lanes follow: stage 1's instance is a local.cpu4 (requested ahead), its trial runs there on 2 workers;
    # nothing ever asks for the sold-out type (no failover)
    types = _types(out)
    (started,) = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    (node,) = started["instances"]
    assert types[node] == "local.cpu4" and started["workers"] == 2
    assert "local.cpu2" not in types.values() and not out.of("failover")
    # once per type: the boundary's re-plan and bracket 1's at its offset are ordinary ones; their proposals
    # still may not bring the type back
    assert [(e["stage"], e.get("trigger")) for e in out.of("replan")] == [(1, "failover"), (1, None), (2, None)]
    assert [r.unavailable for r in replanner.requests] == [(CPU2,)] * 3


@pytest.mark.parametrize(
    "replanner, note",
    [
        (None, None),
        # the re-planner's proposal keeps the unavailable type: unusable, the stand-ins take over
        (StubReplanner(current_p_meet=0.99), "re-planner's proposal uses an unavailable type"),
    ],
)
def test_without_a_usable_proposal_the_type_failover_obtained_stands_in(tmp_path, replanner, note):
    """Both brackets start with the job, bracket 1 (the longer) first: its request for a local.cpu2 (sold out)
    fails over to a local.cpu2b. As that node comes up the remaining work — bracket 0's stage 1, on local.cpu2
    too — is re-planned around the type: with no usable proposal, what failover obtained stands in. The loop
    runs every bracket to its end, stage 1 on the stand-in, asked for as such (no failover of its own); a run
    resumed after the re-plan goes on with the changed plan."""
    stages = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu2", 1, 1)]
    case = _case(tmp_path, stages, sold_out={"local.cpu2"}, replanner=replanner, offsets=(0.0, 0.0))
    out = case.run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    events = out.events
    (failover,) = out.of("failover")
    assert (failover["requested"], failover["obtained"], failover["stage"]) == ("local.cpu2", "local.cpu2b", 2)
    (decision,) = _failover_replans(out)
    assert events.index(failover) < events.index(decision)
    assert decision["accepted"] and decision["source"] == "substitution"
    assert decision["substitutions"] == {"local.cpu2": "local.cpu2b"} and decision["unavailable"] == [CPU2]
    assert decision["stages"] == [1] and decision["starts_in_s"] > 0  # mid-stage: bracket 1 has nothing left
    assert (note in decision["reason"]) if note else "(" not in decision["reason"]
    (stage0,) = [e for e in out.of(J.STAGE_FINISHED) if e["stage"] == 0]
    assert events.index(decision) < events.index(stage0)
    before, after = case.plan.stages[1], out.state.plan["stages"][1]
    assert after["instance_type"] == "local.cpu2b" and after["workers_per_trial"] == 2
    assert after["predicted_cost_usd"] == pytest.approx(before.predicted_cost_usd * 2)  # re-priced
    assert out.state.plan["stages"][2]["instance_type"] == "local.cpu2"  # running: goes on with what it got
    (changed,) = out.of(J.PLAN_CHANGED)
    assert changed["plan"]["stages"][1]["instance_type"] == "local.cpu2b"
    assert {e["stage"] for e in out.of(J.STAGE_FINISHED)} == {0, 1, 2}
    types = _types(out)
    (started,) = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    assert [types[i] for i in started["instances"]] == ["local.cpu2b"]
    assert sorted(types.values()) == ["local.cpu1", "local.cpu1", "local.cpu2b", "local.cpu2b"]
    assert len(_failover_replans(out)) == 1

    # killed (kill -9) right after the re-plan's next decision, and resumed as `rubberband run --resume` does,
    # with the journal's plan: it goes on with the changed plan, asking for the stand-in without a failover
    k = out.of(J.DECISION).index(decision) + 2  # the re-plan's and the next decision (after its plan_changed)
    run_dir = tmp_path / "killed"
    sim = case.world()
    killed = case.run(run_dir, sim=sim, journal=KillingJournal(run_dir, after=k, clock=sim.clock))
    assert killed.result is None and killed.of(J.PLAN_CHANGED)
    resumed = case.but(plan=parse_plan(killed.state.plan)).run(run_dir, sim=sim, resume=True)
    assert resumed.result.status == "finished", resumed.error
    after = resumed.events[next(i for i, e in enumerate(resumed.events) if e["type"] == J.RUN_RESUMED) :]
    assert not [e for e in after if e.get("kind") == "failover" or e.get("trigger") == "failover"]
    asked = [e for e in after if e["type"] == J.INSTANCE_REQUESTED and e["stage"] == 1]
    assert asked and all(e["instance_type"] == "local.cpu2b" and "requested_type" not in e for e in asked)


def test_a_type_found_unavailable_at_a_brackets_start_is_replanned_there_once(tmp_path):
    # bracket 1's stage is planned on local.cpu4, sold out everywhere; bracket 1 starts 3 s after the job, before
    # any node is up (the head is up at 2 s, the first node at 4 s): the failover re-plan comes at bracket 1's
    # start, its boundary, before it requests anything
    replanner = StubReplanner(current_p_meet=0.99, changes={2: ("local.cpu2", 1, 1)})
    stages = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu4", 1, 1)]
    out = _case(tmp_path, stages, sold_out={"local.cpu4"}, replanner=replanner, offsets=(0.0, 3.0)).run(
        tmp_path / "run"
    )
    assert out.result.status == "finished", out.error
    decision = out.of("replan")[0]
    assert decision["trigger"] == "failover" and decision["accepted"] and decision["source"] == "replanner"
    assert decision["stage"] == 2 and decision["bracket"] == 1 and decision["stages"] == [2, 1]
    assert decision["unavailable"] == [CPU4] and "starts_in_s" not in decision
    assert decision["elapsed_s"] == pytest.approx(3.0, abs=1e-3)
    assert replanner.requests[0].offsets_s[0] == 0.0
    assert out.state.plan["stages"][2]["instance_type"] == "local.cpu2"
    assert [(e["instance_type"], e["t"] >= decision["t"]) for e in out.of(J.INSTANCE_REQUESTED) if e["stage"] == 2] == [
        ("local.cpu2", True)
    ]
    # once: the checks after it (each node up, bracket 0's boundary) find nothing new
    assert len(_failover_replans(out)) == 1 and not out.of("failover")


def test_a_type_only_running_stages_use_is_not_replanned_around(tmp_path):
    # stage 0's local.cpu1 is sold out: failover gets local.cpu1b nodes for it, and stage 0 runs on them; no stage
    # left to plan uses the type, so nothing is re-planned around it
    stages = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu4", 1, 1)]
    out = _case(tmp_path, stages, sold_out={"local.cpu1"}).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    failovers = out.of("failover")
    assert len(failovers) == 2 and {(e["requested"], e["obtained"], e["stage"]) for e in failovers} == {
        ("local.cpu1", "local.cpu1b", 0)
    }
    assert not _failover_replans(out) and not out.of(J.PLAN_CHANGED)
    assert [(e["stage"], e.get("trigger")) for e in out.of("replan")] == [(1, None), (2, None)]
