"""What the user's command spent before the executor started (the CLI's loading and planning; in head mode the head's
boot and the upload) is measured from the command's start and reported beside the JCT (``actual.before_start_s``,
``actual.jct_from_command_s``)."""

from __future__ import annotations

import shlex
import time
from types import SimpleNamespace

import pytest

from rubberband.cli import process_started_at
from rubberband.cloud.head_session import HeadRecord, RunJob, entrypoint
from rubberband.executor import events as E
from rubberband.executor import journal as J
from rubberband.executor.runstate import fold
from rubberband.head_job import MIN_DEADLINE_S, build_parser, head_deadline, remaining_deadline


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


def test_the_head_s_executor_works_to_what_is_left_of_the_deadline_after_the_head_boot_and_upload():
    """The user's deadline counts from their command: a head that took 200 s to boot and take the code hands its
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
    assert head_deadline(args, plan, tmp_path, now=1_150.0) == pytest.approx(450.0)  # fresh: what is left
    J.append_event(tmp_path / J.JOURNAL_NAME, {**_started(1_150.0, 1_000.0), "deadline_s": 450.0})
    assert head_deadline(args, plan, tmp_path, now=5_000.0) == pytest.approx(450.0)  # resumed: anchored at the command
