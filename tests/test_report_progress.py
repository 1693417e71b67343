"""The run report's search progress: the incumbent's metric over the run, from the journal's epoch reports."""

from __future__ import annotations

import json

import pytest
from executor_helpers import write_job
from sim_helpers import write_cpu_profile

from rubberband.cli import run as cli
from rubberband.report.progress import search_progress


def _epoch(t: float, trial: str, epoch: int, value: float | None) -> dict:
    return {"type": "epoch", "t": t, "trial_id": trial, "epoch": epoch, "metrics": {"loss": value}}


def test_the_incumbent_is_the_best_result_at_the_highest_fidelity_reached():
    events = [
        _epoch(1.0, "a", 0, 0.9),
        _epoch(2.0, "b", 0, 0.5),  # better at the same fidelity
        _epoch(3.0, "c", 0, 0.7),  # worse: no change
        {"type": "checkpoint", "t": 3.5, "trial_id": "b", "epoch": 0},
        _epoch(4.0, "a", 1, 0.8),  # the first result at 2 epochs: the incumbent though worse than b's 1-epoch one
        _epoch(5.0, "a", 1, None),  # no metric: trained, but no change
        _epoch(6.0, "b", 1, 0.3),
    ]
    points = search_progress(events, "loss", "min", t0=0.0)
    assert [(p.t_s, p.trial_id, p.fidelity, p.value) for p in points] == [
        (1.0, "a", 1, 0.9),
        (2.0, "b", 1, 0.5),
        (4.0, "a", 2, 0.8),
        (6.0, "b", 2, 0.3),
    ]
    assert points[-1].epochs_trained == 6
    assert [p.value for p in search_progress(events, "loss", "max", t0=0.0)][:2] == [0.9, 0.8]


def test_a_runs_report_draws_its_search_progress(tmp_path, capsys):
    spec = write_job(tmp_path / "job")
    run_dir = tmp_path / "run"
    data = json.loads(spec.read_text())
    data["profile"] = str(write_cpu_profile(tmp_path / "profile.json"))
    spec.write_text(json.dumps(data))
    assert cli(["run", str(spec), "--cloud", "sim", "--yes", "--run-dir", str(run_dir)]) == 0
    assert cli(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    html = (tmp_path / "report" / "report.html").read_text()
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert 'id="progress"' in html and "## Search progress" in markdown
    assert (tmp_path / "report" / "progress.png").stat().st_size > 1000
    # a plan alone has no run to show
    assert cli(["report", str(run_dir / "plan.json"), "--out", str(tmp_path / "plan-report")]) == 0
    assert 'id="progress"' not in (tmp_path / "plan-report" / "report.html").read_text()


@pytest.mark.parametrize("mode", ["min", "max"])
def test_no_epoch_reports_draw_no_progress(mode):
    assert search_progress([{"type": "trial_started"}], "loss", mode, t0=0.0) == ()
