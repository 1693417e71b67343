"""`rubberband profile --from-run`: what real runs measured (the head's start, boots and worker starts as the run
overlapped them, per-trial overheads) folded into the profile the next plan is made from (issue 30, item 3)."""

from __future__ import annotations

import json

import pytest
from executor_helpers import write_job
from sim_helpers import write_cpu_profile, write_spread_profile

from rubberband.cli import run as cli
from rubberband.executor.backends import SIM_RUNTIME
from rubberband.planner.model import fit_performance_model
from rubberband.profile import load_profile
from rubberband.profiler.from_runs import ConfigSample, calibrated, read_run, run_measurements

SLOTS = {"local.cpu2": 2}
METRIC = {"name": "loss", "mode": "min"}


def _epoch(t: float, trial: str, epoch: int, seconds: float, **metrics: float) -> dict:
    return {"type": "epoch", "t": t, "trial_id": trial, "epoch": epoch, "seconds": seconds, "metrics": metrics}


def _started(t: float, trial: str, stage: int, epochs: tuple[int, int], instance: str) -> dict:
    start, end = epochs
    return {"type": "trial_started", "t": t, "trial_id": trial, "stage": stage, "start_epoch": start,
            "end_epoch": end, "workers": 2, "instances": [instance]}  # fmt: skip


def _stopped(t: float, trial: str, stage: int, epochs: tuple[int, int], reason: str = "finished") -> dict:
    start, end = epochs
    return {"type": "trial_stopped", "t": t, "trial_id": trial, "stage": stage, "reason": reason,
            "start_epoch": start, "end_epoch": end}  # fmt: skip


def _journal() -> list[dict]:
    """A local run as the executor journals it: the second node's request is journaled once it is up, after
    the first node's first trial (the events are not in time order)."""
    return [
        {"type": "run_started", "t": 100.0, "run_id": "r1", "cloud": "local", "spec": {"metric": METRIC}},
        {"type": "trial_created", "t": 100.1, "trial_id": "a", "bracket": 0, "index": 0, "config": {"lr": 0.1}},
        {"type": "trial_created", "t": 100.1, "trial_id": "b", "bracket": 0, "index": 1, "config": {"lr": 0.2}},
        {"type": "decision", "t": 103.5, "kind": "head_started"},
        {"type": "instance_requested", "t": 103.6, "id": "n1", "stage": 0, "instance_type": "local.cpu2"},
        {"type": "instance_ready", "t": 106.0, "id": "n1", "startup_s": 2.4},
        _started(109.5, "a", 0, (0, 1), "n1"),
        {"type": "instance_requested", "t": 106.1, "id": "n2", "stage": 0, "instance_type": "local.cpu2"},
        {"type": "instance_ready", "t": 110.1, "id": "n2", "startup_s": 4.0},
        _epoch(110.3, "a", 0, 0.6, loss=0.5),
        _stopped(110.4, "a", 0, (0, 1)),
        _started(112.6, "b", 0, (0, 1), "n2"),
        _epoch(113.0, "b", 0, 0.2, loss=0.9),
        _stopped(113.0, "b", 0, (0, 1)),
        {"type": "stage_finished", "t": 113.05, "stage": 0, "bracket": 0, "metrics": {"a": 0.5, "b": 0.9}},
        _started(113.1, "a", 1, (1, 3), "n1"),
        _epoch(113.5, "a", 1, 0.3, loss=0.4),
        _epoch(113.9, "a", 2, 0.3, loss=0.3),
        _stopped(114.0, "a", 1, (1, 3)),
        _stopped(114.0, "b", 1, (1, 2), "stopped"),
    ]


def test_a_runs_journal_says_what_its_starts_and_trials_cost_as_the_run_met_them():
    m = run_measurements(_journal(), SLOTS)
    assert (m.run_id, m.cloud, m.head_start_s) == ("r1", "local", pytest.approx(3.5))
    # the burst in request order (not journal order): n1 booted alone, n2 while n1's workers started
    assert m.boots_alone == {"local.cpu2": [2.4]} and m.boots_overlapped == {"local.cpu2": [4.0]}
    assert m.workers_overlapped == {"local.cpu2": [pytest.approx(3.5)]}  # n1 up at 106.0, its first trial 109.5
    assert m.workers_alone == {"local.cpu2": [pytest.approx(2.5)]}  # n2, the burst's last: alone
    assert m.workers == {"local.cpu2": 2}
    # wall less the epochs' own seconds; a trial stopped on purpose says nothing of the overhead
    assert m.fresh_overheads == [(pytest.approx(0.3), 1), (pytest.approx(0.2), 1)]
    assert m.resumed_overheads == [(pytest.approx(0.3), 2)]


def test_a_trials_last_epoch_journaled_after_its_stop_still_counts():
    """The journal is not in time order: a trial's last epoch may be journaled after its stop (15 of 99 real local
    runs here had one). Its overhead and its configuration sample are read as if in order."""
    events = _journal()
    b_epoch, b_stop = events.index(_epoch(113.0, "b", 0, 0.2, loss=0.9)), events.index(_stopped(113.0, "b", 0, (0, 1)))
    events[b_epoch], events[b_stop] = events[b_stop], events[b_epoch]
    m, in_order = run_measurements(events, SLOTS), run_measurements(_journal(), SLOTS)
    assert (m.fresh_overheads, m.configurations) == (in_order.fresh_overheads, in_order.configurations)
    assert len(m.fresh_overheads) == 2 and len(m.configurations) == 2


def test_a_head_begun_while_planning_is_timed_from_its_own_start():
    """`rubberband run` begins a local head while it plans: the head's start is what it took from then, not the
    part left when the executor started (run_started at 100.0, head begun at 98.8, up at 102.0)."""
    events = _journal()
    events[3] = {"type": "decision", "t": 102.0, "kind": "head_started", "requested_at": 98.8}
    assert run_measurements(events, SLOTS).head_start_s == pytest.approx(3.2)


def test_every_trial_of_a_brackets_first_stage_is_a_configuration_sample():
    """Not only the survivors: the whole first stage, at the shape it ran, its score oriented (loss: negated)."""
    m = run_measurements(_journal(), SLOTS)
    assert m.configurations == [
        ConfigSample({"lr": 0.1}, "local.cpu2", 2, 1, (0.6,), -0.5),
        ConfigSample({"lr": 0.2}, "local.cpu2", 2, 1, (0.2,), -0.9),
    ]


def test_a_first_stage_of_several_epochs_leaves_each_trials_warm_up_epoch_out():
    from rubberband.profiler.from_runs import first_stage_samples

    events = [
        {"type": "run_started", "t": 0.0, "run_id": "r2", "spec": {"metric": {"name": "acc", "mode": "max"}}},
        {"type": "trial_created", "t": 0.1, "trial_id": "a", "bracket": 0, "index": 0, "config": {"lr": 0.1}},
        {"type": "instance_requested", "t": 0.2, "id": "n1", "stage": 0, "instance_type": "local.cpu2"},
        _started(1.0, "a", 0, (0, 3), "n1"),
        _epoch(2.0, "a", 0, 0.9, acc=0.1),
        _epoch(2.5, "a", 1, 0.5, acc=0.2),
        _epoch(3.0, "a", 2, 0.5, acc=0.3),
        _stopped(3.0, "a", 0, (0, 3)),
        {"type": "stage_finished", "t": 3.1, "stage": 0, "bracket": 0, "metrics": {"a": 0.3}},
    ]
    assert first_stage_samples(events) == [ConfigSample({"lr": 0.1}, "local.cpu2", 2, 1, (0.5, 0.5), 0.3)]


def test_the_runs_configurations_join_the_profiles_and_narrow_the_population_mean(tmp_path):
    profile = load_profile(write_spread_profile(tmp_path / "p.json", sigma=0.5, rho=0.0))
    runs = [run_measurements(_journal(), SLOTS)]
    updated = calibrated(profile, runs, devices={"local.cpu2": "CPU"})
    added = updated.epoch_measurements[len(profile.epoch_measurements) :]
    assert [(m.run_id, m.workers, m.epoch_times_s, m.quality) for m in added] == [
        ("r1", 2, [0.6], -0.5),
        ("r1", 2, [0.2], -0.9),
    ]
    assert all(m.iterations_per_epoch == profile.workload.iterations_per_epoch(2) for m in added)
    assert "first-stage trials of real runs (r1)" in updated.sources["epoch_measurements"]
    before, after = fit_performance_model(profile).variation, fit_performance_model(updated).variation
    assert (before.configs, after.configs) == (10, 12)
    # folding the same run in again replaces its samples; a type the catalog does not place on a profiled device
    # adds none
    assert len(calibrated(updated, runs, devices={"local.cpu2": "CPU"}).epoch_measurements) == 12
    assert calibrated(profile, runs, devices={"local.cpu2": "GPU"}).epoch_measurements == profile.epoch_measurements


def test_a_journal_that_is_not_a_runs_is_refused_in_one_line(tmp_path):
    with pytest.raises(Exception, match="not a run's journal"):
        run_measurements([{"type": "epoch", "t": 1.0}], SLOTS)
    with pytest.raises(Exception, match="no journal.jsonl there"):
        read_run(tmp_path, SLOTS)


def test_the_profile_takes_what_the_runs_measured_and_says_so(tmp_path):
    profile = load_profile(write_cpu_profile(tmp_path / "p.json", startup_s=2.0))
    runs = [run_measurements(_journal(), SLOTS)]
    updated = calibrated(profile, runs, epoch_overhead_s=0.05)
    w = updated.workload
    # less the per-epoch overhead the model adds for each epoch (one, and two for the resumed trial)
    assert w.task_start_s == pytest.approx(0.25 - 0.05) and w.restart_overhead_s == pytest.approx(0.3 - 2 * 0.05)
    assert w.worker_start_s == pytest.approx(2.5)
    assert [(s.cloud, s.samples_s) for s in updated.head_startup] == [("local", [pytest.approx(3.5)])]
    startup = {(s.instance_type, tuple(s.samples_s)) for s in updated.startup}
    assert startup == {(None, (2.0, 2.0, 2.0)), ("local.cpu2", (2.4,))}
    (overlap,) = updated.startup_overlap
    assert (overlap.boot_alone_s, overlap.boot_overlapped_s) == (2.4, 4.0)
    assert (overlap.workers_alone_s, overlap.workers_overlapped_s) == (2.5, 3.5)
    for field in ("task_start_s", "restart_overhead_s", "worker_start_s", "head_startup", "startup_overlap"):
        assert updated.sources[field].startswith("measured in real runs (r1)"), field
    model = fit_performance_model(updated)
    assert model.head_start("local", "local.cpu2").quantile(0.5) == pytest.approx(3.5)
    assert model.start_overlap("local").boot_extra_s == pytest.approx(1.6)
    assert calibrated(profile, []) is profile  # no run: nothing changes


def test_profile_from_run_folds_a_finished_runs_journal_into_the_specs_profile(tmp_path, capsys):
    """The real boundary: a run's journal as the executor writes it, read by the CLI. The run is played on virtual
    time (a real local run starts Ray, which this tier does not), which --from-run refuses, since its timings are
    the model's own; the same journal marked as the local trial runtime's is folded in."""
    spec = write_job(tmp_path / "job")
    data = json.loads(spec.read_text())
    data["profile"] = str(write_cpu_profile(tmp_path / "profile.json", startup_s=2.0))
    spec.write_text(json.dumps(data))
    run_dir = tmp_path / "run"
    assert cli(["run", str(spec), "--cloud", "sim", "--yes", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    before = (tmp_path / "profile.json").read_text()
    assert cli(["profile", str(spec), "--from-run", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "played on virtual time (--cloud sim)" in err[0] and str(run_dir) in err[0]
    assert (tmp_path / "profile.json").read_text() == before
    journal = run_dir / "journal.jsonl"
    lines = journal.read_text().splitlines()
    started = json.loads(lines[0])
    assert started["trial_runtime"] == SIM_RUNTIME
    journal.write_text("\n".join([json.dumps({**started, "trial_runtime": "rubberband.executor.trials"}), *lines[1:]]))
    assert cli(["profile", str(spec), "--from-run", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "from 1 run(s)" in out and "head start" in out
    assert "configurations:" in out and "from runs" in out and "their mean speed known to ±" in out
    updated = load_profile(tmp_path / "profile.json")
    assert updated.sources["task_start_s"].startswith("measured in real runs")
    assert [s.source for s in updated.head_startup] == ["measured"]
    # its fitted model, for inspection and reuse, is the profile's as it now stands (configurations folded in)
    assert updated.fitted["variation"]["configs"] == fit_performance_model(updated).variation.configs > 0
    # bad input: one line, exit 2, the profile untouched
    before = (tmp_path / "profile.json").read_text()
    assert cli(["profile", str(spec), "--from-run", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--from-run" in err[0] and "no journal.jsonl there" in err[0]
    assert (tmp_path / "profile.json").read_text() == before


def test_a_plan_says_when_its_configurations_leave_the_population_speed_uncertain(tmp_path):
    import dataclasses

    from rubberband.planner.plan_record import MEAN_SE_NOTE, variation_notes

    model = fit_performance_model(load_profile(write_spread_profile(tmp_path / "p.json", sigma=0.5, rho=0.0)))
    assert model.variation.config_mean_se >= MEAN_SE_NOTE  # ten configurations at σ 0.5
    (note,) = variation_notes(model)
    assert "10 configurations" in note and "--from-run" in note and "±" in note
    pinned = dataclasses.replace(model, variation=dataclasses.replace(model.variation, config_mean_se=0.05))
    assert variation_notes(pinned) == []
