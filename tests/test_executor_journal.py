"""Journal round-trip and resume state, accounting against hand-computed bills, placement, plan checks."""

from __future__ import annotations

import json

import pytest
from executor_helpers import JournalTail, make_plan, write_job

from rubberband.catalog import BillingRule
from rubberband.errors import PlanFileError, RunDirError
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_instance, bill_run
from rubberband.executor.decisions import rank
from rubberband.executor.plan_checks import check_plan_matches, trial_configs
from rubberband.executor.placement import make_slots, slots_per_instance, waves
from rubberband.spec import load_spec


@pytest.fixture
def spec(tmp_path):
    return load_spec(write_job(tmp_path / "job"))


def _start(journal: J.Journal, spec, plan, t0: float = 1000.0) -> None:
    journal.record(
        J.RunStarted(
            t=t0,
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=600.0,
        )
    )


def test_journal_round_trip_rebuilds_resume_state(tmp_path, spec):
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    journal = J.Journal(tmp_path)
    _start(journal, spec, plan)
    for trial_id, bracket, index, config in trial_configs(spec, plan):
        journal.record(J.TrialCreated(trial_id=trial_id, bracket=bracket, index=index, config=config))
    journal.record(
        J.InstanceRequested(t=1001.0, id="n1", instance_type="local.cpu2", cloud="local", price_hr=0.10, stage=0)
    )
    journal.record(J.InstanceReady(t=1005.0, id="n1"))
    journal.record(J.StageStarted(t=1005.0, stage=0, predicted_duration_s=20.0))
    journal.record(J.TrialStarted(trial_id="b0-t000", stage=0, start_epoch=0, end_epoch=1))
    journal.record(J.Epoch(trial_id="b0-t000", epoch=0, metrics={"loss": 0.5}, seconds=1.0))
    journal.record(J.Checkpoint(trial_id="b0-t000", epoch=0, path="/x/epoch-0.pt"))
    journal.record(J.TrialStopped(trial_id="b0-t000", stage=0, reason="finished", metric=0.5, checkpoint_epoch=0))
    journal.record(J.StageFinished(t=1020.0, stage=0, metrics={"b0-t000": 0.5}, promoted=["b0-t000"]))
    journal.record(J.Release(id="n1"))
    # a crash mid-write leaves a torn last line: the reader skips it
    with open(journal.path, "ab") as handle:
        handle.write(b'{"type": "epoch", "trial_id": "b0-t0')

    state = J.read_state(tmp_path)
    assert state.run_id == "r1" and state.spec_sha256 == spec.sha256()
    assert state.status == "running" and not state.finished
    assert len(state.trials) == 9
    trial = state.trials["b0-t000"]
    assert trial.checkpoint_epoch == 0 and trial.checkpoint_path == "/x/epoch-0.pt"
    assert trial.finished_stages == {0: 0.5} and trial.epoch_runs == {0: 1}
    assert state.completed_stages() == [0] and state.stages[0].promoted == ["b0-t000"]
    assert state.instances["n1"].ready_at == 1005.0 and state.instances["n1"].terminated_at is None
    assert [d["kind"] for d in state.decisions] == ["release"]
    assert state.plan["stages"][1]["workers_per_trial"] == 2

    journal = J.Journal(tmp_path)  # the resuming executor ends the torn line first
    journal.record(J.RunResumed(t=2000.0, attempt=2))
    journal.record(J.RunFinished(t=2100.0, best_trial="b0-t000"))
    state = J.read_state(tmp_path)
    assert state.attempts == 2 and state.finished and state.first_started_at == 1000.0


def test_read_state_rejects_non_runs(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        J.read_state(tmp_path / "nope")
    with pytest.raises(RunDirError, match="no journal"):
        J.read_state(tmp_path)


def test_journal_lines_are_one_json_object_each(tmp_path):
    journal = J.Journal(tmp_path)
    journal.record(J.Prefetch(stage=1, count=2))
    J.JournalSink(str(journal.path)).record({"type": "epoch", "trial_id": "b0-t001", "epoch": 3, "t": 5.0})
    lines = journal.path.read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["decision", "epoch"]
    assert json.loads(lines[1])["t"] == 5.0


def test_bills_match_hand_computed_figures(tmp_path, spec):
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    journal = J.Journal(tmp_path)
    _start(journal, spec, plan, t0=0.0)
    # n1: 0 → 125.4 s on aws-like rules ($3.06/h): ceil(125.4) = 126 s → 126 * 3.06 / 3600
    journal.record(J.InstanceRequested(t=0.0, id="n1", instance_type="p3.2xlarge", cloud="aws", price_hr=3.06, stage=0))
    journal.record(J.InstanceTerminated(t=125.4, id="n1"))
    # n2: lives 20 s on aws → the 60 s minimum applies: 60 * 3.06 / 3600
    journal.record(
        J.InstanceRequested(t=10.0, id="n2", instance_type="p3.2xlarge", cloud="aws", price_hr=3.06, stage=0)
    )
    journal.record(J.InstanceTerminated(t=30.0, id="n2"))
    # n3: local ($0.10/h, 1 s minimum), still alive at now=100: 40 s
    journal.record(
        J.InstanceRequested(t=60.0, id="n3", instance_type="local.cpu2", cloud="local", price_hr=0.10, stage=1)
    )
    journal.record(J.StageStarted(t=5.0, stage=0))
    journal.record(J.StageStarted(t=50.0, stage=1))
    bill = bill_run(J.read_state(tmp_path), now=100.0)
    costs = {b.id: b.cost_usd for b in bill.instances}
    assert costs["n1"] == pytest.approx(126 * 3.06 / 3600)
    assert costs["n2"] == pytest.approx(60 * 3.06 / 3600)
    assert costs["n3"] == pytest.approx(40 * 0.10 / 3600)
    assert bill.total_usd == pytest.approx(sum(costs.values()))
    # n1 spent 50 of its 125.4 s before stage 1 started → 50/125.4 of its bill goes to stage 0
    assert bill.by_stage[0] == pytest.approx(costs["n1"] * 50 / 125.4 + costs["n2"])
    assert bill.by_stage[1] == pytest.approx(costs["n1"] * 75.4 / 125.4 + costs["n3"])
    assert sum(bill.by_stage.values()) == pytest.approx(bill.total_usd)


def test_billing_rule_granularity():
    life = J.InstanceLife("x", "t", "gcp", 3600.0, False, 0, requested_at=0.0, terminated_at=61.2)
    rules = {"gcp": BillingRule(granularity_s=10.0, minimum_s=60.0)}
    item = bill_instance(life, now=0.0, rules=rules)
    assert item.billed_s == 70.0 and item.cost_usd == pytest.approx(70.0)


def test_slots_follow_the_simulator_layout():
    slots = make_slots(["a", "b"], 4, 2)  # two trials side by side per instance
    assert [s.placement for s in slots] == [("rb-node-a",) * 2] * 2 + [("rb-node-b",) * 2] * 2
    spanning = make_slots(["a", "b", "c", "d", "e"], 2, 3)  # a trial spans ceil(3/2) = 2 instances
    assert [s.instance_ids for s in spanning] == [("a", "b"), ("c", "d")]
    assert spanning[0].placement == ("rb-node-a", "rb-node-a", "rb-node-b")
    assert slots_per_instance(4, 3) == 1.0 and slots_per_instance(2, 3) == 0.5
    assert waves(9, 2, 2, 1) == 3 and waves(3, 1, 4, 2) == 2
    with pytest.raises(ValueError):
        waves(1, 1, 2, 4)


def test_rank_promotes_by_mode_with_missing_metrics_last():
    metrics = {"a": 0.3, "b": None, "c": 0.1, "d": 0.3}
    assert rank(metrics, "min", ["a", "b", "c", "d"]) == ["c", "a", "d", "b"]
    assert rank(metrics, "max", ["a", "b", "c", "d"]) == ["a", "d", "c", "b"]


def test_trial_configs_are_seeded_and_stable(spec):
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    first, second = trial_configs(spec, plan), trial_configs(spec, plan)
    assert first == second and len(first) == 9
    assert [t[0] for t in first] == [f"b0-t{i:03d}" for i in range(9)]
    assert len({t[3]["quality"] for t in first}) == 9
    assert all(t[3]["epoch_s"] == spec.config["epoch_s"] for t in first)


def test_plan_must_match_the_spec(spec):
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    check_plan_matches(spec, plan)
    wrong = plan.model_copy(update={"stages": [plan.stages[0], plan.stages[1].model_copy(update={"trials": 2})]})
    with pytest.raises(PlanFileError, match="stage 1 runs 2 trials"):
        check_plan_matches(spec, wrong)
    with pytest.raises(PlanFileError, match="has 1 stages"):
        check_plan_matches(spec, plan.model_copy(update={"stages": plan.stages[:1]}))


def test_hyperband_brackets_get_their_own_trials(tmp_path):
    spec = load_spec(write_job(tmp_path / "hb", trials=9, max_epochs=9))
    spec = spec.model_copy(update={"scheduler": spec.scheduler.model_copy(update={"kind": "hyperband"})})
    plan = make_plan(spec, [("local.cpu2", 1, 1)] * 6)
    check_plan_matches(spec, plan)
    ids = [t[0] for t in trial_configs(spec, plan)]
    # R=9, η=3: brackets s=2,1,0 start 9, 5 and 3 trials
    assert ids == [f"b0-t{i:03d}" for i in range(9)] + [f"b1-t{i:03d}" for i in range(5)] + [
        f"b2-t{i:03d}" for i in range(3)
    ]


def test_the_tail_a_waiting_test_reads_is_the_whole_journal_at_every_write(tmp_path):
    """executor_helpers.JournalTail (what wait_for_events polls) reads only what was appended, and sees what
    iter_events sees: a line being written shows once its newline is there, a garbled line is skipped."""
    path = tmp_path / J.JOURNAL_NAME
    tail = JournalTail(path)
    assert tail.events() is None  # no journal yet
    writes = [
        b'{"type": "run_started", "t": 1}\n',
        b'{"type": "epoch", "t"',  # a write in progress
        b': 2}\n{"type": "epoch", "t": 3}\n',
        b"garbled\n",
        b'{"type": "checkpoint", "t": 4}\n{"type": "epo',
        b'ch", "t": 5}\n',
    ]
    for chunk in writes:
        with open(path, "ab") as handle:
            handle.write(chunk)
        complete = path.read_bytes().rpartition(b"\n")[0] + b"\n"
        expected = [e for e in map(J.decode_line, complete.split(b"\n")) if e is not None]
        assert tail.events() == expected == list(J.iter_events(path))[: len(expected)]
    assert [e["t"] for e in tail.events()] == [1, 2, 3, 4, 5]
