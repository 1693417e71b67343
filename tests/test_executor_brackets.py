"""Parallel Hyperband brackets in the executor: lanes side by side (``rubberband.executor.lanes``, ``sha``).

Unit tests of the pure :class:`~rubberband.executor.lanes.LaneLayout`, runs of the real executor on virtual time
(tests/sim_helpers.py: a Hyperband job — R=3, η=3: bracket 0 runs 3 trials for 1 epoch then its best for 2 more,
bracket 1 runs 2 trials for 3 epochs — whose brackets run side by side, killed and resumed, its report; and
Hyperband R=243 on the quickstart profile through ``rubberband run --cloud sim``), and parallel-run accounting.
What only real Ray nodes prove (a run's processes, SIGKILL and ``--resume``) is proven once, on a SHA run
(tests/test_executor_e2e.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from executor_helpers import make_plan, write_hyperband_job
from sim_helpers import KillingJournal, Killed, SimCase, cpu_model

from conftest import EXAMPLES
from rubberband.executor import journal as J
from rubberband.executor.decisions import LossPolicy
from rubberband.executor.lanes import LaneLayout, Waiting
from rubberband.executor.plan_checks import check_plan_matches, trial_configs
from rubberband.executor.run import Settings
from rubberband.executor.schedulers import scheduler_for
from rubberband.executor.sha import ShaScheduler
from rubberband.plan import parse_plan, write_plan
from rubberband.spec import load_spec

# bracket 0: 3 trials on two 1-worker nodes, its best on a 2-worker node; bracket 1: 2 trials on one 1-worker node
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]


def _plan(spec, offsets=(0.0, 0.0)):
    plan = make_plan(spec, STAGES, durations=[12.0, 8.0, 12.0])
    return plan.model_copy(update={"brackets": "parallel", "bracket_offsets_s": list(offsets)})


def _job(directory: Path, epoch_s: float, offsets=(0.0, 0.0)):
    spec_path, spec = write_hyperband_job(directory, epoch_s=epoch_s)
    plan = _plan(spec, offsets)
    write_plan(plan, directory / "plan.json")
    return spec_path, spec, plan


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


# -- the pure layout ---------------------------------------------------------------------------


def test_the_layout_reads_brackets_and_offsets_from_the_plan(tmp_path):
    spec = load_spec(_job(tmp_path, 0.1)[0])
    layout = LaneLayout.for_plan(_plan(spec, offsets=(0.0, 30.0)))
    assert layout.parallel and layout.ranges == ((0, 2), (2, 3)) and layout.offsets_s == (0.0, 30.0)
    assert [layout.lane_of(g) for g in range(3)] == [0, 0, 1]
    assert [layout.next_stage(g) for g in range(3)] == [1, None, None]  # never into another bracket
    assert layout.due(0.0, [False, False], [False, False]) == [0]
    assert layout.due(29.9, [True, False], [False, False]) == []
    assert layout.due(30.0, [True, False], [False, False]) == [1]
    assert layout.due(99.0, [True, True], [True, False]) == []
    # brackets that start together request their instances longest first (the critical path first)
    assert layout.durations_s == (20.0, 12.0)
    assert layout.start_order([1, 0]) == [1, 0]  # bracket 1 starts 30 s later: it ends last
    assert LaneLayout.for_plan(_plan(spec)).start_order([1, 0]) == [0, 1]
    three = LaneLayout(((0, 1), (1, 2), (2, 3)), (0.0, 0.0, 0.0), (10.0, 30.0, 10.0), parallel=True)
    assert three.start_order([0, 1, 2]) == [1, 0, 2]
    assert LaneLayout(((0, 1), (1, 2)), (0.0, 0.0), (10.0, 30.0), parallel=True).due(
        0.0, [False, False], [False, False]
    ) == [1, 0]
    # a sequential plan: one bracket after another, no offsets; a stage's successor is the plan's next stage
    seq = LaneLayout.for_plan(make_plan(spec, STAGES))
    assert not seq.parallel and seq.offsets_s == (0.0, 0.0)
    assert [seq.next_stage(g) for g in range(3)] == [1, 2, None]
    assert seq.due(0.0, [False, False], [False, False]) == [0]
    assert seq.due(500.0, [True, False], [False, False]) == []  # bracket 1 waits for bracket 0's end
    assert seq.due(500.0, [True, False], [True, False]) == [1]


def test_the_layout_hands_a_released_instance_to_another_brackets_waiting_request(tmp_path):
    w = [
        Waiting("a", bracket=0, stage=1, order=0, queued=True),  # the giver's own bracket: never
        Waiting("b", bracket=1, stage=2, order=1, queued=False),  # booting: kept only if nothing queued
        Waiting("c", bracket=2, stage=3, order=3, queued=True),
        Waiting("d", bracket=1, stage=2, order=2, queued=True),
    ]
    parallel = LaneLayout(((0, 2), (2, 3), (3, 4)), (0.0, 0.0, 0.0), parallel=True)
    assert parallel.receiver(0, w).token == "d"  # queued first (cancelling it saves its bill), earliest
    assert parallel.receiver(0, [w[0], w[1]]).token == "b"
    assert parallel.receiver(0, [w[0]]) is None
    assert parallel.receiver(1, w).token == "a"
    assert parallel.receiver(1, []) is None
    # one bracket after another: nothing is handed over (the next bracket keeps what the one before leaves)
    assert LaneLayout(parallel.ranges, parallel.offsets_s).receiver(0, w) is None


def test_parallel_plans_are_accepted_and_their_brackets_run_side_by_side(tmp_path):
    """The plan check accepts a parallel plan; the same scheduler (lanes) runs either bracket mode, and the plan
    says which: side by side, bracket 1 starts with the job; one after another, once bracket 0 has ended."""
    spec = load_spec(_job(tmp_path, 0.1)[0])
    plan = _plan(spec)
    sequential = plan.model_copy(update={"brackets": "sequential"})
    check_plan_matches(spec, plan)  # no longer refused
    check_plan_matches(spec, sequential)
    for p in (plan, sequential):
        scheduler = scheduler_for(p, spec, LossPolicy(10), prefetch=Settings().prefetch, elastic=Settings().elastic)
        assert isinstance(scheduler, ShaScheduler)
    starts = {}
    for name, p in (("parallel", plan), ("sequential", sequential)):
        out = SimCase(spec, p, model=cpu_model(epoch_s=5.0)).run(tmp_path / name)
        assert out.result.status == "finished", out.error
        started = {e["stage"]: e["t"] for e in out.of(J.STAGE_STARTED)}
        finished = {e["stage"]: e["t"] for e in out.of(J.STAGE_FINISHED)}
        assert sorted(finished) == [0, 1, 2]
        starts[name] = (started, finished)
    started, finished = starts["parallel"]
    assert started[2] == started[0] < finished[0]  # both brackets start with the job
    started, finished = starts["sequential"]
    assert started[2] >= finished[1]  # bracket 1 once bracket 0 has ended


def test_a_parallel_run_journals_every_decision_its_lanes_take(tmp_path):
    """Bracket 0 runs 3 one-epoch trials on one local.cpu1, then its best for 2 more epochs on two (one more
    requested ahead, the first kept); bracket 1 starts 55 s after the job, asks for a local.cpu1 and gets
    bracket 0's the moment bracket 0 ends (its own request is let go when up). Every decision is journaled."""
    _, spec = write_hyperband_job(tmp_path)
    plan = make_plan(spec, [("local.cpu1", 1, 1), ("local.cpu1", 2, 2), ("local.cpu1", 1, 1)], durations=[30, 10, 60])
    plan = plan.model_copy(update={"brackets": "parallel", "bracket_offsets_s": [0.0, 55.0]})
    out = SimCase(spec, plan, model=cpu_model(epoch_s=10.0, startup_s=10.0)).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    kinds = {e["kind"] for e in out.of(J.DECISION)}
    assert {"handoff", "keep", "release", "prefetch", "replan"} <= kinds, kinds
    (prefetch,) = out.of("prefetch")
    assert prefetch["stage"] == 1 and prefetch["count"] == 1
    (keep,) = out.of("keep")
    assert keep["stage"] == 1
    first_node = next(e["id"] for e in out.of(J.INSTANCE_REQUESTED) if e["stage"] == 0)
    assert keep["id"] == first_node
    (stage1,) = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    assert first_node in stage1["instances"] and len(stage1["instances"]) == 2
    assert [(e["stage"], e["bracket"]) for e in out.of("replan")] == [(1, 0), (2, 1)]  # a boundary, an offset
    (handoff,) = out.of("handoff")
    assert (handoff["from_bracket"], handoff["to_bracket"], handoff["from_stage"], handoff["to_stage"]) == (0, 1, 1, 2)
    assert handoff["instance_type"] == "local.cpu1"
    assert all(handoff["id"] in e["instances"] for e in out.of(J.TRIAL_STARTED) if e["stage"] == 2)
    released = {e["id"] for e in out.of("release")}
    requested = {e["id"] for e in out.of(J.INSTANCE_REQUESTED)}
    assert released == requested  # each instance let go by a decision when no stage needed it any more
    assert {e["id"] for e in out.of(J.INSTANCE_TERMINATED)} == requested


# -- Hyperband R=243 on virtual time ------------------------------------------------------------


def _hyperband_243(directory: Path, brackets: str, deadline: str) -> Path:
    """The quickstart spec as Hyperband R=243 (η 3, 1 to 243 epochs: 6 brackets, 21 stages, 415 trials)."""
    data = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 243, "brackets": brackets}
    data["deadline"] = deadline
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"hyperband-{brackets}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.e2e  # the whole CLI, planning included: 10-35 s each on 2 cores
@pytest.mark.parametrize("brackets, deadline", [("parallel", "8h"), ("sequential", "24h")])
def test_hyperband_r243_runs_to_its_end_on_virtual_time(tmp_path, cli_here, brackets, deadline):
    """``rubberband run --cloud sim`` plans and runs Hyperband R=243 in either bracket mode to its end (it once
    crashed on a simulated request's future: ``SimFuture.running`` was missing). Side by side, the later brackets
    start while bracket 0 still runs; one after another, each once the one before has ended."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = cli_here(
        "run", _hyperband_243(tmp_path, brackets, deadline), "--cloud", "sim", "--yes", "--run-dir", run_dir
    )
    print(f"\nHyperband R=243 ({brackets}) on --cloud sim: {time.monotonic() - started:.1f}s wall")
    assert result.returncode in (0, 4), result.stderr[-3000:]  # met (or late): the point is that it ends
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"] is not None
    events = _events(run_dir)
    plan = J.read_state(run_dir).plan
    assert plan["brackets"] == brackets and len(plan["stages"]) == 21
    finished = {e["stage"]: e for e in events if e["type"] == J.STAGE_FINISHED}
    started_at = {e["stage"]: e["t"] for e in events if e["type"] == J.STAGE_STARTED}
    assert sorted(finished) == list(range(21))
    ranges = LaneLayout.for_plan(parse_plan(plan)).ranges
    assert len(ranges) == 6
    bracket0_end = finished[ranges[0][1] - 1]["t"]
    later_starts = [started_at[lo] for lo, _ in ranges[1:]]
    if brackets == "parallel":
        assert min(later_starts) < bracket0_end
    else:
        for (_, before_end), (lo, _) in zip(ranges, ranges[1:]):
            assert started_at[lo] >= finished[before_end - 1]["t"]
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested == terminated
    assert events[-1]["type"] == J.RUN_FINISHED


# -- end to end ------------------------------------------------------------------------------


def _winners(spec, plan) -> dict[int, str]:
    """Bracket 0's stage-0 winner (promoted) and the job's best, from the sampled configs."""
    configs = trial_configs(spec, plan)
    b0 = sorted((t for t in configs if t[1] == 0), key=lambda t: t[3]["quality"])
    everyone = sorted(configs, key=lambda t: t[3]["quality"] / 3)
    return {"promoted": b0[0][0], "best": everyone[0][0]}


def _sim_winners(out, spec, plan) -> dict[str, str]:
    """Bracket 0's stage-0 winner and the job's best by the simulated world's stand-in metric (a loss)."""
    world = out.sim.world
    configs = trial_configs(spec, plan)
    b0 = [t for t, b, _, _ in configs if b == 0]
    promoted = min(b0, key=lambda t: world.metric(t, 0))
    finals = [promoted] + [t for t, b, _, _ in configs if b == 1]
    return {"promoted": promoted, "best": min(finals, key=lambda t: world.metric(t, 2))}


def _intervals(events: list[dict]) -> list[tuple[int, float, float]]:
    """(bracket, start, end) of every trial run."""
    bracket = {e["trial_id"]: e["bracket"] for e in events if e["type"] == J.TRIAL_CREATED}
    started: dict[str, float] = {}
    out = []
    for e in events:
        if e["type"] == J.TRIAL_STARTED:
            started[e["trial_id"]] = e["t"]
        elif e["type"] == J.TRIAL_STOPPED and e["trial_id"] in started:
            out.append((bracket[e["trial_id"]], started.pop(e["trial_id"]), e["t"]))
    return out


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory):
    """The Hyperband job (both brackets starting at once) run on virtual time."""
    base = tmp_path_factory.mktemp("brackets")
    _, spec, plan = _job(base, epoch_s=0.1)
    out = SimCase(spec, plan, model=cpu_model(epoch_s=0.1, startup_s=2.0)).run(base / "run")
    return {"spec": spec, "plan": plan, "run_dir": base / "run", "out": out}


def test_parallel_brackets_overlap_promote_hand_over_and_clean_up(parallel_run):
    out, run_dir, spec, plan = (parallel_run[k] for k in ("out", "run_dir", "spec", "plan"))
    assert out.error is None and out.result.status == "finished", out.error
    events = _events(run_dir)
    finished = {e["stage"]: e for e in events if e["type"] == J.STAGE_FINISHED}
    started = {e["stage"]: e for e in events if e["type"] == J.STAGE_STARTED}
    assert sorted(finished) == [0, 1, 2]

    # the brackets ran side by side: both started at once (offsets 0), and bracket 1's trials ran while
    # bracket 0 was still under way (one after another, they would all run after bracket 0's last stage)
    assert started[2]["t"] < finished[0]["t"] and started[0]["t"] < finished[2]["t"]
    runs = _intervals(events)
    assert [r for r in runs if r[0] == 1] and all(started[0]["t"] < s < finished[1]["t"] for b, s, e in runs if b == 1)

    # no instance ever holds more trials than its slots, whichever bracket they come from
    holding: dict[str, set[str]] = {}
    slots = {"local.cpu1": 1, "local.cpu2": 1}  # one 1-worker trial on a cpu1, one 2-worker trial on a cpu2
    types = {e["id"]: e["instance_type"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    for e in events:
        if e["type"] == J.TRIAL_STARTED:
            for instance in set(e["instances"]):
                holding.setdefault(instance, set()).add(e["trial_id"])
                assert len(holding[instance]) <= slots[types[instance]], (instance, holding[instance])
        elif e["type"] == J.TRIAL_STOPPED:
            for trials in holding.values():
                trials.discard(e["trial_id"])

    # every bracket's promotions are right: bracket 0 promotes its best stage-0 trial to its own stage 1 only
    winners = _sim_winners(out, spec, plan)
    assert finished[0]["promoted"] == [winners["promoted"]]
    promotions = [e for e in events if e["type"] == J.TRIAL_PROMOTED]
    assert [(e["trial_id"], e["from_stage"], e["to_stage"]) for e in promotions] == [(winners["promoted"], 0, 1)]
    assert finished[1]["promoted"] == [] and finished[2]["promoted"] == []
    assert {e["trial_id"] for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 2} == {
        t for t, b, _, _ in trial_configs(spec, plan) if b == 1
    }

    # nothing is left: every instance requested was terminated, and the simulated cloud runs none of them
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested == terminated
    assert all(s.ended_at is not None for s in out.sim.world.instances.values())
    assert events[-1]["type"] == J.RUN_FINISHED
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"] == winners["best"]
    assert summary["actual"]["cost_usd"] > 0


def test_resume_after_kill_with_one_bracket_done_and_one_under_way(tmp_path):
    _, spec, plan = _job(tmp_path, epoch_s=0.1, offsets=(0.0, 5.0))  # bracket 1 starts 5 s in
    case = SimCase(spec, plan, model=cpu_model(epoch_s=0.1, startup_s=2.0))
    run_dir, sim = tmp_path / "run", case.world()
    bracket1_done = KillingJournal(
        run_dir, clock=sim.clock, when=lambda e: isinstance(e, J.StageFinished) and e.stage == 2
    )
    killed = case.run(run_dir, sim=sim, journal=bracket1_done)
    assert isinstance(killed.error, Killed)
    before = _events(run_dir)
    assert 1 not in {e["stage"] for e in before if e["type"] == J.STAGE_FINISHED}, "killed too late"
    stage2 = next(e for e in before if e["type"] == J.STAGE_STARTED and e["stage"] == 2)
    assert stage2["t"] - before[0]["t"] >= 5.0 and stage2["offset_s"] == 5.0  # not before its offset

    resumed = case.run(run_dir, sim=sim, resume=True)
    assert resumed.error is None and resumed.result.status == "finished", resumed.error
    events = _events(run_dir)
    after = events[len(before) :]
    # finished stages stay finished: only bracket 0's last stage runs (again), once, with its promoted trial
    assert {e["stage"] for e in after if e["type"] == J.TRIAL_STARTED} == {1}
    assert [e["stage"] for e in after if e["type"] == J.STAGE_FINISHED] == [1]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["attempts"] == 2
    unkilled = case.run(tmp_path / "unkilled")
    assert summary["best"]["trial_id"] == unkilled.result.best_trial
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested == terminated


def test_report_of_a_parallel_run_draws_a_lane_per_bracket(parallel_run):
    from rubberband.report.charts import draw_all
    from rubberband.report.model import build_report_data
    from rubberband.report.source import RunSource

    data = build_report_data(RunSource.from_dir(parallel_run["run_dir"]), replan=None)
    charts = draw_all(data)
    assert "a lane per bracket (2)" in charts.actual_gantt.alt
    assert len(charts.actual_gantt.png) > 1000


def test_parallel_run_bills_each_instance_to_the_stages_of_the_brackets_it_served():
    from rubberband.executor.accounting import bill_run

    plan = {"brackets": "parallel", "stages": [{"bracket": 0}, {"bracket": 0}, {"bracket": 1}]}
    events = [
        {
            "type": J.RUN_STARTED,
            "t": 0.0,
            "run_id": "r",
            "spec_sha256": "x",
            "spec": {},
            "plan": plan,
            "cloud": "local",
            "deadline_s": 100.0,
        },
        {"type": J.STAGE_STARTED, "t": 0.0, "stage": 0},
        {"type": J.STAGE_STARTED, "t": 0.0, "stage": 2},
        {"type": J.STAGE_STARTED, "t": 10.0, "stage": 1},
    ]
    for ident in ("n1", "n2"):
        events.append(
            {
                "type": J.INSTANCE_REQUESTED,
                "t": 0.0,
                "id": ident,
                "instance_type": "local.cpu1",
                "cloud": "local",
                "price_hr": 3600.0,
                "stage": 0,
            }
        )
        events.append({"type": J.INSTANCE_TERMINATED, "t": 20.0, "id": ident})
    # n1 goes from bracket 0's stage 0 to bracket 1's stage 2 at t=5; n2 stays in bracket 0
    events.append({"type": J.DECISION, "t": 5.0, "kind": "handoff", "id": "n1", "from_stage": 0, "to_stage": 2})
    bill = bill_run(J.fold(events), now=30.0)
    assert bill.workers_usd == pytest.approx(40.0)  # 2 × 20 s at $1/s
    assert bill.by_stage[0] == pytest.approx(5.0 + 10.0)  # n1 until the hand-over, n2 in stage 0's window
    assert bill.by_stage[1] == pytest.approx(10.0)  # n2 only: n1 was bracket 1's by then
    assert bill.by_stage[2] == pytest.approx(15.0)  # n1 from the hand-over
    # the same journal read as one bracket after another splits by the stage windows, as before
    sequential = J.fold([{**events[0], "plan": {**plan, "brackets": "sequential"}}] + events[1:])
    assert sum(bill_run(sequential, now=30.0).by_stage.values()) == pytest.approx(40.0)
