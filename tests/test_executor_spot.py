"""Lost instances on the local backend: a worker node dies mid-stage, its trials restart from their checkpoints
on a replacement node, and the run ends as an uninterrupted one would (same best trial), leaving nothing.

The end-to-end test runs the real CLI with real Ray nodes (a one-stage job: 2 trials × 3 epochs on one
``local.cpu2``); the others run the real executor on virtual time (tests/sim_helpers.py) with scripted losses, and
look at its journal, its result and its progress reports.

The end-to-end test is slow (~40 s on an idle 2-core machine, ~75 s under the shared CI load) for a reason it
cannot avoid: three Ray processes start one after another (the head, the node that dies, its replacement).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_helpers import cli_env, lose_node_once_checkpointed, make_plan, run_pids, write_job
from sim_helpers import START, SimCase, cpu_model

from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.plan_checks import trial_configs
from rubberband.executor.progress import Progress
from rubberband.executor.run import Executor, Job, Settings, Target
from rubberband.executor.simulated import SimScript
from rubberband.plan import write_plan
from rubberband.spec import load_spec


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


@pytest.mark.e2e
def test_lost_node_mid_stage_restarts_its_trials_from_checkpoints(tmp_path):
    # 2 s epochs: after the kill the dying node's workers must not finish the stage before Ray sees the loss
    spec_path = write_job(tmp_path / "job", trials=2, eta=3, min_epochs=3, max_epochs=3, epoch_s=2.0)
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1)], durations=[10.0])
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(tmp_path / "plan.json"),
            "--run-dir",
            str(run_dir),
            "--yes",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
    )
    victim, out, err = lose_node_once_checkpointed(proc, run_dir, timeout_s=120)  # once a trial has checkpointed
    assert proc.returncode == 0, err[-3000:]
    events = _events(run_dir)
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == victim and lost["reason"] == "lost"
    at = events.index(lost)
    # billed up to the loss: terminated (reason lost) at the loss time
    state = J.read_state(run_dir)
    life = state.instances[victim]
    assert life.reason == "lost" and life.lost == "lost" and life.terminated_at == pytest.approx(lost["t"])
    bill = {b.id: b for b in bill_run(state, now=time.time()).instances}
    assert bill[victim].lifetime_s == pytest.approx(lost["t"] - life.requested_at)
    # its trials stopped as instance_lost (not failed), then restarted from their checkpoints on a new instance
    stopped = [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "instance_lost"]
    affected = sorted(e["trial_id"] for e in stopped)  # those still running on the node when it died
    assert affected and set(lost["trials"]) <= set(affected) and all(e["lost"] == [victim] for e in stopped)
    assert not [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "failed"]
    replacement = [e["id"] for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED]
    assert len(replacement) == 1 and replacement[0] != victim
    assert any(e["type"] == J.DECISION and e.get("kind") == "replace" and e["id"] == victim for e in events)
    for trial_id in affected:
        before = max(e["epoch"] for e in events[:at] if e["type"] == J.CHECKPOINT and e["trial_id"] == trial_id)
        restarted = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED and e["trial_id"] == trial_id]
        if not restarted:
            # its last epoch was checkpointed (by the dying node's worker, which may outlive the kill by a moment,
            # so perhaps after the loss was journaled): finished from the journal, never trained twice
            (settled,) = [e for e in events[at:] if e["type"] == J.TRIAL_STOPPED and e["trial_id"] == trial_id]
            last = max(e["epoch"] for e in events if e["type"] == J.CHECKPOINT and e["trial_id"] == trial_id)
            assert settled["reason"] == "finished" and settled["metric"] is not None and last == 2, settled
            assert [e["epoch"] for e in events if e["type"] == J.EPOCH and e["trial_id"] == trial_id] == [0, 1, 2]
            continue
        (again,) = restarted
        assert again["instances"] == replacement
        assert again["from_checkpoint"] is not None and again["start_epoch"] == again["from_checkpoint"] + 1
        assert again["from_checkpoint"] >= before
    # the same best trial as an uninterrupted run (loss = quality / (epoch + 1): the lowest quality wins)
    best = min(trial_configs(spec, plan), key=lambda t: t[3]["quality"])[0]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"] == best
    assert summary["instances_lost"] == 1
    assert f"best trial {best}" in out
    assert run_pids(run_dir) == []


# -- loss handling on virtual time (no Ray) ---------------------------------------------------------------

#: One epoch on one worker, and every instance's start-up (the head boots first, as a local run's does).
EPOCH_S, STARTUP_S = 10.0, 10.0


def _case(tmp_path, *, trials: int = 3, spot: bool = True, **options) -> SimCase:
    """``trials`` trials × 3 epochs in one stage on one ``local.cpu2`` (two one-worker slots), on spot."""
    spec = load_spec(write_job(tmp_path / "job", trials=trials, eta=3, min_epochs=3, max_epochs=3))
    plan = make_plan(spec, [("local.cpu2", 1, 1)], durations=[30.0])
    plan = plan.model_copy(update={"stages": [s.model_copy(update={"spot": spot}) for s in plan.stages]})
    return SimCase(spec, plan, model=cpu_model(epoch_s=EPOCH_S, startup_s=STARTUP_S), **options)


def test_lost_instance_is_journaled_dropped_replaced_and_its_trials_requeued(tmp_path):
    # the first instance goes 15 s after it is up: its two trials have checkpointed epoch 0; the third waits
    out = _case(tmp_path, script=SimScript(losses={1: 15.0})).run(tmp_path / "run")
    assert out.result.status == "finished"
    events = out.events
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == "sim-1" and lost["reason"] == "spot-interruption"
    assert lost["trials"] == ["b0-t000", "b0-t001"]
    at = events.index(lost)
    life = out.state.instances["sim-1"]
    assert life.lost == "spot-interruption" and life.reason == "lost" and life.terminated_at == lost["t"]
    assert out.sim.world.instances["sim-1"].ended_at == lost["t"]  # the cloud was told to stop it
    # replaced (the replacement requested at the loss), and dropped: nothing runs on it any more
    (replace,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "replace"]
    assert replace["id"] == "sim-1" and replace["spot"] is True
    requested = [e["id"] for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED]
    assert requested == ["sim-2"]
    restarted = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED]
    assert {i for e in restarted for i in e["instances"]} == {"sim-2"}
    # the trials the loss stopped go first, each right after its checkpoint; then the one that waited
    assert [e["trial_id"] for e in restarted] == ["b0-t000", "b0-t001", "b0-t002"]
    for e in restarted[:2]:
        checkpoints = [c["epoch"] for c in events[:at] if c["type"] == J.CHECKPOINT and c["trial_id"] == e["trial_id"]]
        assert checkpoints == [0] and e["start_epoch"] == 1
    assert restarted[2]["start_epoch"] == 0
    assert out.result.result["instances_lost"] == 1


def test_losses_beyond_the_cap_fail_the_run_with_a_clear_error_spot_interruptions_not_counted(tmp_path):
    # stage 0 on spot loses its first four instances (spot interruptions: not counted); stage 1, on-demand,
    # loses three: the third is one more than the cap of 2
    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu1", 1, 1)], durations=[20.0, 30.0])
    plan = plan.model_copy(update={"stages": [plan.stages[0].model_copy(update={"spot": True}), plan.stages[1]]})
    losses = {n: 5.0 for n in (1, 2, 3, 4, 6, 7, 8)}
    case = SimCase(
        spec,
        plan,
        model=cpu_model(epoch_s=EPOCH_S, startup_s=STARTUP_S),
        settings=Settings(max_instance_losses=2),
        script=SimScript(losses=losses),
    )
    out = case.run(tmp_path / "run")
    assert isinstance(out.error, ExecutionError)
    assert "3 instances were lost during this run, not counting spot interruptions (limit 2)" in str(out.error)
    lost = {e["id"]: e["reason"] for e in out.of(J.INSTANCE_LOST)}
    assert list(lost.values()) == ["spot-interruption"] * 4 + ["lost"] * 3
    # every loss replaced up to the cap, none beyond it: the five of stage 0, the first and two replacements of
    # stage 1
    assert len(out.of(J.INSTANCE_REQUESTED)) == 8
    assert [e["id"] for e in out.of("replace")] == [i for i in lost][:-1]
    assert out.state.instances["sim-8"].lost == "lost"
    assert json.loads((out.run_dir / "result.json").read_text())["status"] == "failed"


def _expected_spend(state: J.RunState, now: float) -> float:
    """What the instances journaled up to ``now`` cost by then, each billed from its request to its termination."""
    total = 0.0
    for life in state.instances.values():
        if life.ready_at is None or life.ready_at > now:
            continue
        end = min(now, life.terminated_at) if life.terminated_at is not None else now
        total += life.price_hr * (end - life.requested_at) / 3600.0
    return total


def test_spend_so_far_stops_at_each_instance_termination(tmp_path):
    case = _case(tmp_path, script=SimScript(losses={1: 15.0}))
    sim = case.world()
    snapshots: list[Progress] = []
    job = Job(case.spec, case.plan, case.catalog_or_local())
    target = Target("sim-run", tmp_path / "run", sim.backend, sim.runtime, cluster=sim.cluster, clock=sim.clock)
    result = Executor(job, target, case.settings, progress=snapshots.append).run()
    assert result.status == "finished" and snapshots
    state = J.read_state(tmp_path / "run")
    lost = state.instances["sim-1"]
    after = [p for p in snapshots if START + p.elapsed_s > lost.terminated_at + 1.0]
    assert after  # the run went on after the loss
    for p in snapshots:
        assert p.spent_usd == pytest.approx(_expected_spend(state, START + p.elapsed_s), rel=1e-6, abs=1e-12)
    # after the loss only its replacement adds up: between two reports while it runs, at its price alone
    replacement = state.instances["sim-2"]
    running = [p for p in after if replacement.ready_at <= START + p.elapsed_s < replacement.terminated_at]
    assert len(running) >= 2
    first, last = running[0], running[-1]
    rate = (last.spent_usd - first.spent_usd) / (last.elapsed_s - first.elapsed_s) * 3600.0
    assert rate == pytest.approx(replacement.price_hr) and lost.price_hr > 0


def test_settle_finishes_a_trial_whose_checkpoint_covers_the_stage(tmp_path):
    """A run died with both trials' last epoch (2) checkpointed: b0-t000 had reported it (loss 0.25), b0-t001's
    report never reached the journal. Resumed, b0-t000 finishes from the journal without running again; b0-t001
    runs its last epoch again, once."""
    case = _case(tmp_path, trials=2)
    spec, plan, run_dir = case.spec, case.plan, tmp_path / "run"
    journal = J.Journal(run_dir)
    t0 = START - 100.0
    journal.record(
        J.RunStarted(
            t=t0,
            run_id="sim-run",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=600.0,
        )
    )
    for trial_id, bracket, index, config in trial_configs(spec, plan):
        journal.record(J.TrialCreated(t=t0, trial_id=trial_id, bracket=bracket, index=index, config=config))
    journal.record(J.StageStarted(t=t0, stage=0, trials=2, to_run=2, epochs=3))
    for trial_id in ("b0-t000", "b0-t001"):
        journal.record(J.TrialStarted(t=t0, trial_id=trial_id, stage=0, start_epoch=0, end_epoch=3))
        for epoch in range(3):
            if (trial_id, epoch) != ("b0-t001", 2):
                metrics = {"loss": 0.25 if trial_id == "b0-t000" else 0.5}
                journal.record(J.Epoch(t=t0 + epoch, trial_id=trial_id, epoch=epoch, metrics=metrics, seconds=1.0))
            journal.record(J.Checkpoint(t=t0 + epoch, trial_id=trial_id, epoch=epoch))

    out = case.run(run_dir, resume=True)
    assert out.result.status == "finished"
    events = out.events
    resumed = next(i for i, e in enumerate(events) if e["type"] == J.RUN_RESUMED)
    started = [e for e in events[resumed:] if e["type"] == J.TRIAL_STARTED]
    stopped = {e["trial_id"]: e for e in events[resumed:] if e["type"] == J.TRIAL_STOPPED}
    # reported and checkpointed: finished without running again
    assert stopped["b0-t000"]["reason"] == "finished" and stopped["b0-t000"]["metric"] == 0.25
    assert "b0-t000" not in {e["trial_id"] for e in started}
    # never reported: its last epoch runs again, once
    (again,) = started
    assert again["trial_id"] == "b0-t001" and (again["start_epoch"], again["end_epoch"]) == (2, 3)
    assert stopped["b0-t001"]["reason"] == "finished"
    assert out.result.best_trial == "b0-t000" and out.result.best_metric == 0.25
