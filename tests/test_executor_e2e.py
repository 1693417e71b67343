"""End to end through the real CLI: a 9-trial SHA job (η=3, 2 stages) on real local Ray nodes.

These are the slow tests of the executor (~50-60 s per run on a 2-core machine, most of it
starting Ray nodes one after another); there are two runs: an uninterrupted one, shared by
the checks below through a module fixture, and one whose executor is killed with SIGKILL
mid-stage and resumed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_helpers import cli_env, make_plan, run_pids, wait_for_events, write_job

from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.plan_checks import trial_configs
from rubberband.plan import write_plan
from rubberband.spec import load_spec

STAGES = [("local.cpu2", 2, 1), ("local.cpu4", 1, 2)]  # stage 1: resize 1 → 2 workers, another type


def _job(directory: Path, epoch_s: float, stages: list[tuple[str, int, int]] = STAGES):
    spec_path = write_job(directory / "job", epoch_s=epoch_s)
    spec = load_spec(spec_path)
    plan = make_plan(spec, stages, durations=[12.0, 8.0])
    write_plan(plan, directory / "plan.json")
    return spec_path, spec, plan


def _expected(spec, plan) -> tuple[list[str], str]:
    """Winners are known from the sampled configs: loss = quality / (epoch + 1)."""
    by_quality = sorted(trial_configs(spec, plan), key=lambda t: t[3]["quality"])
    return sorted(t[0] for t in by_quality[:3]), by_quality[0][0]


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


# every test here runs the CLI on real local Ray nodes; all read one finished run (one xdist worker: it runs once)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("executor_e2e_finished_run")]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    spec_path, spec, plan = _job(base, epoch_s=0.5)
    run_dir = base / "run"
    started = time.monotonic()
    # a relative --run-dir (Ray's temp dirs under it must be absolute: the run resolves it)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(base / "plan.json"),
            "--cloud",
            "local",
            "--run-dir",
            "run",
            "--yes",
        ],
        capture_output=True,
        text=True,
        env=cli_env(base),
        cwd=base,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    print(f"\nuninterrupted run: {elapsed:.1f}s wall")
    return {
        "base": base,
        "spec_path": spec_path,
        "spec": spec,
        "plan": plan,
        "run_dir": run_dir,
        "result": result,
        "elapsed": elapsed,
    }


def test_sha_job_promotes_the_right_trials_releases_early_and_cleans_up(finished_run):
    result, run_dir, spec, plan = (finished_run[k] for k in ("result", "run_dir", "spec", "plan"))
    assert result.returncode == 0, result.stderr
    winners, best = _expected(spec, plan)
    events = _events(run_dir)
    kinds = [e["type"] for e in events]
    stage0_end = next(i for i, e in enumerate(events) if e["type"] == J.STAGE_FINISHED and e["stage"] == 0)
    assert sorted(events[stage0_end]["promoted"]) == winners
    assert sorted(e["trial_id"] for e in events if e["type"] == J.TRIAL_PROMOTED) == winners

    # stage 1 restarts the survivors from their checkpoints with 2 workers each (a resize)
    stage1 = [e for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    assert sorted(e["trial_id"] for e in stage1) == winners
    assert all(e["workers"] == 2 and e["start_epoch"] == 1 and e["end_epoch"] == 3 for e in stage1)

    # no instance ever holds more trials than its slots (2 one-worker trials on a local.cpu2, 2 two-worker
    # trials on a local.cpu4)
    running: dict[str, set[str]] = {}
    for e in events:
        if e["type"] == J.TRIAL_STARTED:
            for instance in set(e["instances"]):
                running.setdefault(instance, set()).add(e["trial_id"])
                assert len(running[instance]) <= 2, (instance, running[instance])
        elif e["type"] == J.TRIAL_STOPPED:
            for trials in running.values():
                trials.discard(e["trial_id"])

    # an instance of stage 0 is released before the stage ends (its last wave leaves it idle)
    releases = [
        i
        for i, e in enumerate(events)
        if e["type"] == J.DECISION and e.get("kind") == "release" and e.get("stage") == 0
    ]
    assert releases and releases[0] < stage0_end

    # every instance requested was terminated; nothing of the run is left alive
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested == terminated
    assert run_pids(run_dir) == []
    assert kinds[-1] == J.RUN_FINISHED

    summary = json.loads((run_dir / "result.json").read_text())
    config = dict(trial_configs(spec, plan)[int(best.split("t")[-1])][3])
    assert summary["status"] == "finished" and summary["best"]["trial_id"] == best
    assert summary["best"]["metric"] == pytest.approx(config["quality"] / 3)
    assert summary["best"]["config"] == config
    assert Path(summary["best"]["checkpoint"]).name == "epoch-2.pt"
    state = J.read_state(run_dir)
    assert summary["actual"]["cost_usd"] == pytest.approx(bill_run(state, now=time.time()).total_usd)
    assert summary["actual"]["cost_usd"] > 0
    assert [s["actual_duration_s"] > 0 for s in summary["stages"]] == [True, True]
    # the JCT counts from the command, the CLI's loading and planning included; the executor worked to what was left
    actual, predicted = summary["actual"], summary["predicted"]
    assert 0 < actual["before_start_s"] < actual["jct_from_start_s"]
    assert actual["jct_s"] == pytest.approx(actual["jct_from_start_s"] + actual["before_start_s"])
    assert predicted["jct_from_start_s"] == plan.predicted.jct_s.p50
    assert predicted["jct_s"] == pytest.approx(plan.predicted.jct_s.p50 + actual["before_start_s"])
    assert summary["deadline_s"] == plan.deadline_s
    assert state.deadline_s == pytest.approx(plan.deadline_s - actual["before_start_s"], abs=0.05)
    assert f"best trial {best}" in result.stdout


def test_resume_after_sigkill_mid_stage(finished_run, tmp_path):
    # one instance a stage (fewer nodes than the finished run's plan; the same trials, so the same winner)
    spec_path, spec, plan = _job(tmp_path, epoch_s=1.0, stages=[("local.cpu2", 1, 1), ("local.cpu4", 1, 2)])
    run_dir = tmp_path / "run"
    env = cli_env(tmp_path)
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )

    def stage1_checkpointed(events: list[dict]) -> bool:
        stage1 = {e["trial_id"] for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 1}
        return any(e["type"] == J.CHECKPOINT and e["trial_id"] in stage1 and e["epoch"] >= 1 for e in events)

    try:  # kill once a stage-1 epoch is checkpointed (mid-stage)
        wait_for_events(proc, run_dir, stage1_checkpointed, timeout_s=240)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    before = _events(run_dir)
    assert run_pids(run_dir), "the killed executor's Ray nodes should still be running"
    checkpoint_before: dict[str, int] = {}
    for e in before:
        if e["type"] == J.CHECKPOINT:
            checkpoint_before[e["trial_id"]] = max(e["epoch"], checkpoint_before.get(e["trial_id"], -1))

    resumed = subprocess.run(
        [sys.executable, "-m", "rubberband", "run", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    events = _events(run_dir)
    after = events[len(before) :]
    assert after[0]["type"] == J.INSTANCE_TERMINATED and after[0]["reason"] == "orphan"
    # finished work stays finished: no stage-0 trial runs again
    assert not [e for e in after if e["type"] == J.TRIAL_STARTED and e["stage"] == 0]
    # no epoch that was checkpointed before the kill runs again
    epochs_before = {(e["trial_id"], e["epoch"]) for e in before if e["type"] == J.EPOCH}
    for e in after:
        if e["type"] == J.EPOCH and (e["trial_id"], e["epoch"]) in epochs_before:
            assert e["epoch"] > checkpoint_before.get(e["trial_id"], -1), e
    # running trials restart right after their newest checkpoint: the one on disk, which may be newer than
    # the journal's last checkpoint event when the kill fell between writing the file and recording it
    restarted = [e for e in after if e["type"] == J.TRIAL_STARTED]
    assert restarted
    for e in restarted:
        assert e["from_checkpoint"] is not None and e["from_checkpoint"] >= checkpoint_before.get(e["trial_id"], 0), e
        assert e["start_epoch"] == e["from_checkpoint"] + 1, e
        rerun = [a["epoch"] for a in after if a["type"] == J.EPOCH and a["trial_id"] == e["trial_id"]]
        assert all(epoch > e["from_checkpoint"] for epoch in rerun), (e, rerun)

    summary = json.loads((run_dir / "result.json").read_text())
    uninterrupted = json.loads((finished_run["run_dir"] / "result.json").read_text())
    assert summary["status"] == "finished" and summary["attempts"] == 2
    assert summary["best"]["trial_id"] == uninterrupted["best"]["trial_id"] == _expected(spec, plan)[1]
    assert run_pids(run_dir) == []


def _one_line_error(result) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("rubberband: error:")
    return result.stderr


def test_bad_inputs_exit_2_with_one_line(finished_run, cli, tmp_path):
    base, run_dir, spec_path = finished_run["base"], finished_run["run_dir"], finished_run["spec_path"]
    env = cli_env(tmp_path)
    assert "already finished" in _one_line_error(cli("run", "--resume", str(run_dir), env=env))
    other = write_job(tmp_path / "other", name="another-job")
    assert "another job" in _one_line_error(cli("run", str(other), "--resume", str(run_dir), env=env))
    assert "not found" in _one_line_error(cli("run", "--resume", str(tmp_path / "nope"), env=env))
    assert "missing SPEC" in _one_line_error(cli("run", env=env))
    # a plan made for 27 trials does not match the 9-trial spec
    spec27 = load_spec(write_job(tmp_path / "big", trials=27))
    write_plan(make_plan(spec27, [("local.cpu2", 2, 1), ("local.cpu2", 1, 1)]), tmp_path / "plan27.json")
    assert "stage 0 runs 27 trials" in _one_line_error(
        cli("run", str(spec_path), "--plan", str(tmp_path / "plan27.json"), "--yes", env=env)
    )
    assert "--cloud is aws" in _one_line_error(
        cli("run", str(spec_path), "--plan", str(base / "plan.json"), "--cloud", "aws", "--yes", env=env)
    )
    assert "already holds a run" in _one_line_error(
        cli("run", str(spec_path), "--plan", str(base / "plan.json"), "--run-dir", str(run_dir), env=env)
    )
    assert "--deadline" in _one_line_error(
        cli("run", str(spec_path), "--plan", str(base / "plan.json"), "--deadline", "soon", env=env)
    )
    assert "--overrun: cannot read overrun 'a bit'" in _one_line_error(
        cli("run", str(spec_path), "--plan", str(base / "plan.json"), "--overrun", "a bit", env=env)
    )
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_report_of_a_run_shows_predicted_vs_actual(finished_run, cli, tmp_path):
    """`rubberband report RUN_DIR`: the plan's report plus the actual JCT, cost and allocation."""
    from html.parser import HTMLParser

    run_dir = finished_run["run_dir"]
    summary = json.loads((run_dir / "result.json").read_text())
    out = tmp_path / "run-report"
    result = cli("report", run_dir, "--out", out, "--no-replan")
    assert result.returncode == 0, result.stderr

    class Fields(HTMLParser):
        def __init__(self):
            super().__init__()
            self.values, self.images = {}, 0

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if "data-field" in attrs and "data-value" in attrs:
                self.values[attrs["data-field"]] = attrs["data-value"]
            if tag == "img" and attrs.get("src", "").startswith("data:image/png;base64,"):
                self.images += 1

    page = Fields()
    page.feed((out / "report.html").read_text())
    assert float(page.values["actual.jct_from_start_s"]) == pytest.approx(summary["actual"]["jct_from_start_s"])
    assert float(page.values["actual.cost_usd"]) == pytest.approx(summary["actual"]["cost_usd"])
    markdown = (out / "report.md").read_text()
    assert "(gantt_actual.png)" in markdown and (out / "gantt_actual.png").stat().st_size > 1000
    assert "before the executor started (result.json's JCT counts from it)" in markdown  # the CLI's loading, planning
    assert page.images >= 2  # the planned and the actual allocation at least, inline
