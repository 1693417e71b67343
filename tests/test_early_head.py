"""A local run's Ray head starts while its plan is made (issue 30: "start the head while planning, so that time is
not spent twice"): ``rubberband run`` begins the head once the plan's inputs have loaded, the executor takes it over,
the journal says when it began, and result.json's prediction from the command counts the overlap. A run that does not
start leaves neither the head nor its directory behind.

The provider's begin / take over / stop and the CLI's run run real Ray heads (e2e); the arithmetic of the
prediction and the plan's ``head_start_s`` run on folded journals and the planner (unit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from executor_helpers import cli_env, make_plan, run_pids, write_job

from rubberband.commands._early_head import early_head_for
from rubberband.cloud.local.provider import LocalProvider
from rubberband.executor import events as E
from rubberband.executor import journal as J
from rubberband.executor.decision_events import HeadStarted
from rubberband.executor.result import Ending, build_result
from rubberband.executor.runstate import fold
from rubberband.inputs import load_job_inputs
from rubberband.planner import PlanOptions, plan_job
from rubberband.spec import load_spec

from conftest import EXAMPLES

T0 = 1_800_000_000.0


# -- the plan and the prediction (unit) ------------------------------------------------------------------------------


def test_a_local_plan_says_how_long_its_head_takes_and_a_cloud_plan_none():
    local = load_job_inputs(EXAMPLES / "quickstart_local.yaml")
    plan = plan_job(local.spec, local.profile, local.catalog, PlanOptions(samples=100, seed=0))
    from rubberband.planner.model import fit_performance_model

    model = fit_performance_model(local.profile)
    first = plan.stages[0]
    assert plan.head_start_s == pytest.approx(model.head_wait_s(first.cloud, first.instance_type), abs=1e-3)
    assert plan.head_start_s > 0
    aws = load_job_inputs(EXAMPLES / "quickstart.yaml")
    plan = plan_job(aws.spec, aws.profile, aws.catalog, PlanOptions(samples=100, seed=0))
    assert plan.head_start_s == 0.0  # the head instance is up before the job starts (head mode)


def _journal(head_requested_at: float | None, head_start_s: float, tmp_path):
    """A finished run's events: commanded at T0, executor started at T0 + 2, its head (begun at
    ``head_requested_at``) up at T0 + 4, one stage from T0 + 5 to T0 + 30; and its plan (p50 40 s)."""
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 1)], durations=[20.0, 15.0])
    plan = plan.model_copy(update={"head_start_s": head_start_s})
    plan.predicted.jct_s.p50, plan.predicted.jct_s.p95 = 40.0, 45.0
    events = [
        {
            **E.RunStarted(
                run_id="r",
                spec_sha256=spec.sha256(),
                spec=spec.model_dump(mode="json"),
                plan=plan.model_dump(mode="json"),
                deadline_s=98.0,
                deadline_from_command_s=100.0,
                commanded_at=T0,
            ).model_dump(mode="json"),
            "t": T0 + 2,
        },
        {
            **HeadStarted(address="127.0.0.1:1", pid=1, requested_at=head_requested_at).model_dump(mode="json"),
            "t": T0 + 4,
        },
        {**E.StageStarted(stage=0).model_dump(mode="json"), "t": T0 + 5},
        {**E.StageFinished(stage=0, promoted=[]).model_dump(mode="json"), "t": T0 + 30},
    ]
    return fold(events), plan, spec


@pytest.mark.parametrize(
    ("requested_at", "head_start_s", "early"),
    [
        (T0 + 0.5, 3.5, 1.5),  # begun while planning: 1.5 s of its start ran before the executor's
        (T0 + 0.5, 1.0, 1.0),  # ... but the plan counted only 1 s for it: no more than that is taken off
        (T0 + 2.1, 3.5, 0.0),  # started by the executor
        (None, 3.5, 0.0),  # an older journal: not known
    ],
)
def test_the_prediction_from_the_command_counts_a_head_begun_while_planning_once(
    requested_at, head_start_s, early, tmp_path
):
    state, plan, spec = _journal(requested_at, head_start_s, tmp_path)
    assert state.before_start_s == pytest.approx(2.0)
    assert state.head_early_s == pytest.approx(0.0 if requested_at is None else max(0.0, 2.0 - (requested_at - T0)))
    result = build_result(state, plan, spec, Ending("finished", None, T0 + 30), tmp_path / "run")
    assert result["actual"]["head_early_s"] == pytest.approx(state.head_early_s)
    assert result["actual"]["jct_s"] == pytest.approx(30.0)
    assert result["predicted"]["jct_from_start_s"] == pytest.approx(40.0 - early)
    assert result["predicted"]["jct_s"] == pytest.approx(40.0 + 2.0 - early)
    assert result["predicted"]["jct_p95_s"] == pytest.approx(45.0 + 2.0 - early)


def test_a_head_started_again_on_a_resume_does_not_count(tmp_path):
    state, _, _ = _journal(T0 + 0.5, 3.5, tmp_path)
    J_events = [
        {**E.RunResumed(run_id="r", attempt=2).model_dump(mode="json"), "t": T0 + 100},
        {**HeadStarted(address="127.0.0.1:2", pid=2, requested_at=T0 + 50).model_dump(mode="json"), "t": T0 + 104},
    ]
    from rubberband.executor.runstate import apply
    from rubberband.executor.events import parse_event

    for event in J_events:
        apply(state, parse_event(event))
    assert state.head_early_s == pytest.approx(1.5)  # the first start's, which the plan's prediction is about


# -- the provider and the CLI on real Ray heads (e2e) ---------------------------------------------------------------


@pytest.mark.e2e
def test_a_head_begun_ahead_is_taken_over_by_the_executor_and_stopped(tmp_path):
    provider = LocalProvider(tmp_path / "run")
    begun_at = time.time()
    provider.begin_head("early-run")
    try:
        head = provider.head()
        assert head is not None and head.ready_at is None  # launched, not waited for
        time.sleep(0.5)  # the planning
        handle = provider.start_head("early-run")
        assert handle.pid == head.pid  # the same process, not a second head
        assert handle.requested_at is not None and begun_at <= handle.requested_at < begun_at + 0.5
        record = provider.head()
        assert record is not None and record.ready_at is not None and record.ready_at > record.requested_at
    finally:
        provider.stop_head()
    assert run_pids(tmp_path / "run") == []


@pytest.mark.e2e
def test_a_head_begun_for_another_run_is_stopped_and_the_asked_one_started(tmp_path):
    """A head begun ahead is taken over only by the run it was begun for, with the default settings; any other
    start stops it first (no second head of the directory is left running)."""
    provider = LocalProvider(tmp_path / "run")
    provider.begin_head("first-run")
    begun = provider.head()
    assert begun is not None
    try:
        record = provider.start_head_process("second-run")
        assert record.pid != begun.pid and record.run_id == "second-run" and record.ready_at is not None
        with pytest.raises(ProcessLookupError):
            os.kill(begun.pid, 0)  # stopped and reaped
    finally:
        provider.stop_head()
    assert run_pids(tmp_path / "run") == []


@pytest.mark.e2e
def test_a_run_that_never_starts_stops_its_early_head_and_leaves_no_directory(tmp_path):
    run_dir = tmp_path / "runs" / "never"
    early = early_head_for("local", run_dir)
    assert early is not None and not run_dir.exists()  # nothing started yet
    early.begin("never")
    assert run_dir.is_dir()
    pid = early.backend.head().pid  # type: ignore[attr-defined]
    early.cancel()
    assert not run_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped
    assert early_head_for("aws", tmp_path / "a") is None  # a head instance's cloud: nothing begins here
    (tmp_path / "taken").mkdir()
    assert early_head_for("local", tmp_path / "taken") is None  # not the run's own directory


def _job(tmp_path, deadline: str):
    """The sleepy job, planned with the README job's local profile (its head's start measured)."""
    spec_path = write_job(tmp_path / "job", epoch_s=0.2, deadline=deadline)
    data = json.loads(spec_path.read_text())
    data["profile"] = str(EXAMPLES / "profiles" / "quickstart_local.json")
    spec_path.write_text(json.dumps(data))
    return spec_path


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rubberband", "run", *args],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.e2e
def test_rubberband_run_starts_the_head_while_planning_and_counts_it_once(tmp_path):
    spec_path = _job(tmp_path, "5m")
    run_dir = tmp_path / "run"
    done = _cli(tmp_path, str(spec_path), "--run-dir", str(run_dir), "--yes")
    assert done.returncode == 0, done.stderr[-2000:]
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    started = next(e for e in events if e["type"] == J.RUN_STARTED)
    head = next(e for e in events if e["type"] == J.DECISION and e["kind"] == "head_started")
    assert head["requested_at"] < started["t"]  # begun before the executor started: during the planning
    result = json.loads((run_dir / "result.json").read_text())
    actual, predicted = result["actual"], result["predicted"]
    assert actual["head_early_s"] == pytest.approx(started["t"] - head["requested_at"], abs=1e-3)
    assert 0 < actual["head_early_s"] <= actual["before_start_s"]
    plan = J.read_state(run_dir).plan
    early = min(actual["head_early_s"], plan["head_start_s"])
    assert predicted["jct_s"] == pytest.approx(plan["predicted"]["jct_s"]["p50"] + actual["before_start_s"] - early)
    assert run_pids(run_dir) == []


@pytest.mark.e2e
def test_rubberband_run_whose_deadline_cannot_be_met_leaves_no_head_and_no_run_directory(tmp_path):
    spec_path = _job(tmp_path, "2s")
    done = _cli(tmp_path, str(spec_path), "--run-dir", str(tmp_path / "run"), "--yes")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "shortest feasible JCT" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_sigterm_while_planning_stops_the_early_head_and_leaves_no_run_directory(tmp_path):
    """A long plan (Hyperband to 243 epochs on the local profile takes seconds): the command is stopped once its
    head has begun, and takes the head and the run's directory with it (exit 130, as on Ctrl-C)."""
    spec_path = _job(tmp_path, "3h")
    data = json.loads(spec_path.read_text())
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 243}
    spec_path.write_text(json.dumps(data))
    run_dir = tmp_path / "run"
    cli = subprocess.Popen(
        [sys.executable, "-m", "rubberband", "run", str(spec_path), "--run-dir", str(run_dir), "--yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
        cwd=tmp_path,
    )
    head_json = run_dir / "instances" / "head.json"
    try:
        deadline = time.monotonic() + 60
        while not head_json.exists() and cli.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert head_json.exists() and cli.poll() is None, "the head never began while planning"
        pid = json.loads(head_json.read_text())["pid"]
        cli.terminate()
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert not run_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_runs_report_says_how_much_of_the_wait_before_the_executor_the_head_was_starting():
    from rubberband.report import fmt

    assert "Ray head was starting for 0.9s" in fmt.before_start(1.5, 0.9)
    assert "Ray head" not in fmt.before_start(1.5) and fmt.before_start(0.0, 0.9) == ""
