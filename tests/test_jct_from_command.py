"""The user's deadline and the result's JCT count from their command: what it spent before the executor started (the
CLI's loading and planning; in head mode the head's boot and the upload) is measured from the command's start, the
executor works to what is left of the deadline, and result.json's JCT includes it (``actual.before_start_s``, with
the executor's own part in ``actual.jct_from_start_s``)."""

from __future__ import annotations

import math
import shlex
import time
from types import SimpleNamespace

import pytest
import yaml

from conftest import EXAMPLES

from rubberband.cli import process_started_at
from rubberband.cloud.head_session import HeadRecord, RunJob, entrypoint
from rubberband.executor import events as E
from rubberband.executor import journal as J
from rubberband.executor.result import deadline_from_command
from rubberband.executor.run import Executor, Job, Settings, Target
from rubberband.executor.runstate import fold
from rubberband.executor.simulated import simulated_for
from rubberband.inputs import load_job_inputs
from rubberband.planning import PlanningOptions, plan_from_inputs
from rubberband.executor.deadline import MIN_DEADLINE_S, remaining_deadline
from rubberband.head_job import build_parser, head_deadline


START = 1_800_000_000.0  # a simulated run's virtual clock: nowhere near today's wall clock


def _started(t: float, commanded_at: float | None) -> dict:
    event = E.RunStarted(
        run_id="r", spec_sha256="x", spec={}, plan={}, deadline_s=100.0, commanded_at=commanded_at
    ).model_dump(mode="json")
    return {**event, "t": t}


def test_the_wait_before_the_start_is_measured_from_the_command():
    state = fold([_started(10.0, 7.5)])
    assert state.before_start_s == pytest.approx(2.5)
    assert state.first_started_at == state.started_at == 10.0  # the JCT, as predicted, counts from the start


def test_without_a_command_time_nothing_went_before_and_a_command_never_lies_in_the_future():
    assert fold([_started(10.0, None)]).before_start_s == 0.0
    assert fold([_started(10.0, 12.0)]).before_start_s == 0.0  # a skewed clock: never a negative wait


def test_head_mode_hands_the_command_time_to_the_run_job():
    record = HeadRecord(
        run_id="run-1",
        cloud="aws",
        region="us-east-1",
        instance_id="i-1",
        zone="us-east-1a",
        address="10.0.0.1",
        public_address=None,
        regions=["us-east-1"],
        metric="loss",
    )
    words = shlex.split(entrypoint(record, RunJob(deadline_s=600, trial_runtime="x", commanded_at=1_700_000_000.25)))
    assert build_parser().parse_args(words[3:]).commanded_at == pytest.approx(1_700_000_000.25)
    assert "--commanded-at" not in entrypoint(record, RunJob(deadline_s=600, trial_runtime="x"))


def test_the_cli_knows_when_its_process_began():
    """``rubberband`` (cli.main) counts from its process's start: the interpreter's own start-up is the user's
    wait too."""
    began = process_started_at()
    assert began is not None and time.time() - 86400 < began <= time.time()


def test_an_executor_works_to_what_is_left_of_the_deadline_after_the_command_s_start_up():
    """The user's deadline counts from their command: a head that took 200 s to boot and take the code leaves its
    executor 400 s of a 600 s deadline (its boundaries then re-plan for that), never less than a second."""
    assert remaining_deadline(600.0, 1_000.0, 1_200.0) == pytest.approx(400.0)
    assert remaining_deadline(600.0, 1_000.0, 2_000.0) == MIN_DEADLINE_S  # all of it gone: finish late or stop
    assert remaining_deadline(600.0, None, 1_200.0) == 600.0  # the command's start unknown
    assert remaining_deadline(600.0, 1_300.0, 1_200.0) == 600.0  # a skewed clock never adds time


def test_a_resumed_head_job_keeps_the_deadline_its_first_start_was_handed(tmp_path):
    args = build_parser().parse_args(
        [
            "run",
            "--cloud",
            "aws",
            "--region",
            "us-east-1",
            "--head-id",
            "i-1",
            "--run-id",
            "r",
            "--commanded-at",
            "1000",
        ]
    )
    plan = SimpleNamespace(deadline_s=600.0)
    assert head_deadline(args, plan, tmp_path) == 600.0  # fresh: the user's, which its executor's start shortens
    J.append_event(tmp_path / J.JOURNAL_NAME, {**_started(1_150.0, 1_000.0), "deadline_s": 450.0})
    assert head_deadline(args, plan, tmp_path) == pytest.approx(450.0)  # resumed: what its first start worked to


def test_an_older_journal_keeps_its_verdict():
    """A journal from before ``deadline_from_command_s``: its executor was handed the whole deadline, so the
    deadline from the command is that plus what went before (the same met / late as it had)."""
    state = fold([_started(10.0, 7.5)])
    assert deadline_from_command(state) == pytest.approx(102.5)
    assert deadline_from_command(fold([_started(10.0, None)])) == 100.0


def _sim_run(tmp_path, before_s: float, **settings):
    """The quickstart on a simulated cluster whose command began ``before_s`` before the executor's start."""
    data = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    inputs = load_job_inputs(tmp_path / "job.yaml")
    plan = plan_from_inputs(inputs, options=PlanningOptions(samples=200))
    job = Job(inputs.spec, plan, inputs.catalog, inputs.profile)
    sim = simulated_for(job, seed=0, start=START)
    run_dir = tmp_path / "run"
    target = Target("sim", run_dir, sim.backend, sim.runtime, cluster=sim.cluster, clock=sim.clock)
    result = Executor(job, target, Settings(commanded_at=START - before_s, **settings)).run().result
    return plan, J.read_state(run_dir), result


def test_the_executor_works_to_what_the_command_left_and_the_jct_counts_from_the_command(tmp_path):
    plan, state, result = _sim_run(tmp_path, 30.0)
    assert state.deadline_s == pytest.approx(plan.deadline_s - 30.0)  # worked to, from the executor's start
    assert state.deadline_from_command_s == plan.deadline_s and state.before_start_s == pytest.approx(30.0)
    actual, predicted = result["actual"], result["predicted"]
    assert actual["jct_s"] == pytest.approx(actual["jct_from_start_s"] + 30.0)
    assert predicted["jct_s"] == pytest.approx(plan.predicted.jct_s.p50 + 30.0)
    assert predicted["jct_from_start_s"] == plan.predicted.jct_s.p50
    assert result["deadline_s"] == plan.deadline_s
    assert result["met_deadline"] == (actual["jct_s"] <= plan.deadline_s)
    assert result["late_by_s"] == pytest.approx(max(0.0, actual["jct_s"] - plan.deadline_s))


def test_a_command_whose_start_up_used_the_whole_deadline_runs_the_plan_late(tmp_path):
    late = 10_000.0  # longer than the quickstart's deadline
    plan, state, result = _sim_run(tmp_path, late, overrun_s=math.inf)
    assert late > plan.deadline_s and state.deadline_s == MIN_DEADLINE_S
    assert result["status"] == "finished" and result["outcome"] == "late" and not result["met_deadline"]
    assert result["late_by_s"] == pytest.approx(result["actual"]["jct_s"] - plan.deadline_s)
    assert result["actual"]["jct_s"] > late
