"""A sampler that learns is asked as late as it can be: each trial's configuration right before it starts, after
every rung result told so far (SHA's later waves, parallel Hyperband's brackets side by side) — with the same
start times as a run that asks every configuration up front (the executor on virtual time, its search recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from executor_helpers import make_plan, write_hyperband_job, write_job
from sim_helpers import KillingJournal, Killed, SimCase, cpu_model

from rubberband.executor import journal as J
from rubberband.executor import run as executor_run
from rubberband.executor.plan_checks import trial_configs
from rubberband.search import ConfigSource
from rubberband.spec import load_spec

pytest.importorskip("optuna")


class Recording:
    """A :class:`ConfigSource` that logs what it is asked and told, in order, and hands both on."""

    def __init__(self, inner: ConfigSource, log: list[tuple[str, str]]) -> None:
        self.inner, self.log = inner, log

    def propose(self, trial_id: str) -> dict[str, Any]:
        self.log.append(("ask", trial_id))
        return self.inner.propose(trial_id)

    def restore(self, trial_id: str, config: dict[str, Any]) -> None:
        self.inner.restore(trial_id, config)

    def rung_finished(self, epochs: int, metrics: dict[str, float | None], promoted: list[str] | None) -> None:
        self.log.extend(("told", trial_id) for trial_id, value in metrics.items() if value is not None)
        self.inner.rung_finished(epochs, metrics, promoted)


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, str]]:
    """The run's search, recorded (the executor builds it with ``make_config_source``)."""
    log: list[tuple[str, str]] = []
    real = executor_run.make_config_source
    monkeypatch.setattr(executor_run, "make_config_source", lambda *a, **k: Recording(real(*a, **k), log))
    return log


def _with_search(spec_path: Path, sampler: str) -> Any:
    data = json.loads(spec_path.read_text())
    data["search"] = {"sampler": sampler, "seed": 3}
    spec_path.write_text(json.dumps(data))
    return load_spec(spec_path)


def _sha(directory: Path, sampler: str):
    """SHA, 9 trials of 1 epoch on two 1-worker nodes (five waves), the best 3 to 3 epochs on one."""
    spec = _with_search(write_job(directory, epoch_s=0.5), sampler)
    return spec, make_plan(spec, [("local.cpu1", 2, 1), ("local.cpu1", 1, 1)], durations=[6.0, 9.0])


def _parallel_hyperband(directory: Path, sampler: str):
    """Hyperband side by side from offset 0: bracket 0's 3 trials on two nodes, bracket 1's 2 on one."""
    spec_path, _ = write_hyperband_job(directory, epoch_s=0.5)
    spec = _with_search(spec_path, sampler)
    plan = make_plan(spec, [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)], durations=[6.0] * 3)
    return spec, plan.model_copy(update={"brackets": "parallel", "bracket_offsets_s": [0.0, 0.0]})


def _run(spec, plan, run_dir: Path):
    out = SimCase(spec, plan, model=cpu_model(epoch_s=0.5)).run(run_dir)
    assert out.result is not None and out.result.status == "finished", out.error
    return out


def _asked_after_a_result(log: list[tuple[str, str]]) -> list[str]:
    first_told = next(i for i, (what, _) in enumerate(log) if what == "told")
    return [trial_id for what, trial_id in log[first_told:] if what == "ask"]


@pytest.mark.parametrize("layout", [_sha, _parallel_hyperband], ids=["sha", "parallel-hyperband"])
def test_tpe_is_asked_after_rung_results_and_each_config_is_journaled_before_its_trial_starts(
    tmp_path, recorded, layout
):
    spec, plan = layout(tmp_path / "job", "tpe")
    out = _run(spec, plan, tmp_path / "run")
    later = _asked_after_a_result(recorded)
    assert later, recorded  # today's code asked every bracket's trials when it opened: none came after a result
    asked = [trial_id for what, trial_id in recorded if what == "ask"]
    assert sorted(asked) == sorted(out.state.trials)  # each trial asked once
    events = out.events
    created = {e["trial_id"]: i for i, e in enumerate(events) if e["type"] == J.TRIAL_CREATED}
    for i, e in enumerate(events):
        if e["type"] == J.TRIAL_STARTED:
            assert created[e["trial_id"]] < i  # journaled before it starts
    told = [trial_id for what, trial_id in recorded if what == "told"]
    assert len(set(told)) == len(out.state.trials)  # every trial's result was told


def test_parallel_hyperband_brackets_side_by_side_ask_their_later_trials_after_results(tmp_path, recorded):
    spec, plan = _parallel_hyperband(tmp_path / "job", "tpe")
    _run(spec, plan, tmp_path / "run")
    later = _asked_after_a_result(recorded)
    assert {"b0-t002", "b1-t001"} <= set(later)  # each bracket's second wave heard the first waves' results


@pytest.mark.parametrize("layout", [_sha, _parallel_hyperband], ids=["sha", "parallel-hyperband"])
def test_asking_at_the_start_keeps_the_start_times_and_random_search_its_configurations(tmp_path, recorded, layout):
    """TPE (asked as trials start) and random search (asked as brackets open) start every task at the same
    virtual time; random search still creates the configurations it always did, all before any result."""
    runs = {}
    for sampler in ("tpe", "random"):
        spec, plan = layout(tmp_path / sampler, sampler)
        recorded.clear()
        out = _run(spec, plan, tmp_path / f"run-{sampler}")
        starts = [(e["trial_id"], e["stage"], e["t"] - out.events[0]["t"]) for e in out.of(J.TRIAL_STARTED)]
        runs[sampler] = (spec, plan, out, starts, list(recorded))
    assert runs["tpe"][3] == runs["random"][3]
    spec, plan, out, _, log = runs["random"]
    assert not _asked_after_a_result(log)
    configs = {e["trial_id"]: e["config"] for e in out.of(J.TRIAL_CREATED)}
    assert configs == {trial_id: config for trial_id, _, _, config in trial_configs(spec, plan)}


def test_a_tpe_run_killed_mid_bracket_resumes_with_its_journaled_configurations(tmp_path, recorded):
    """Killed right after its fourth trial was created (the first waves asked, the rest not yet): the resumed run
    keeps the journaled configurations, asks only the trials never created — each once, after the results the
    resumed search was told — and finishes."""
    spec, plan = _sha(tmp_path / "job", "tpe")
    case = SimCase(spec, plan, model=cpu_model(epoch_s=0.5))
    run_dir = tmp_path / "run"
    created: list[str] = []

    def fourth_created(event) -> bool:
        if isinstance(event, J.TrialCreated):
            created.append(event.trial_id)
        return len(created) == 4

    sim = case.world()
    killed = case.run(run_dir, sim=sim, journal=KillingJournal(run_dir, clock=sim.clock, when=fourth_created))
    assert isinstance(killed.error, Killed), killed.error
    before = {t: trial.config for t, trial in J.read_state(run_dir).trials.items()}
    assert len(before) == 4
    recorded.clear()
    resumed = case.run(run_dir, sim=sim, resume=True)
    assert resumed.result is not None and resumed.result.status == "finished", resumed.error
    after = {t: trial.config for t, trial in resumed.state.trials.items()}
    assert {t: after[t] for t in before} == before
    asked = [trial_id for what, trial_id in recorded if what == "ask"]
    assert sorted(asked) == sorted(set(after) - set(before))
    assert _asked_after_a_result(recorded)
    created_events = [e["trial_id"] for e in resumed.events if e["type"] == J.TRIAL_CREATED]
    assert sorted(created_events) == sorted(after)  # each trial created once, across both executors


def test_asha_tells_tpe_each_result_and_each_stop_as_it_happens(tmp_path, recorded):
    """ASHA (9 trials, rungs 1, 3, 9 epochs, on 3 → 2 → 1 instances) with TPE: every trial's rung result is told
    when the trial ends its rung, so asks follow results; today's code told nothing before the run's end."""
    spec_path = write_job(tmp_path / "job", trials=9, eta=3, min_epochs=1, max_epochs=9, epoch_s=0.5)
    data = json.loads(spec_path.read_text())
    data["scheduler"]["kind"] = "asha"
    data["search"] = {"sampler": "tpe", "seed": 3}
    spec_path.write_text(json.dumps(data))
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu1", n, 1) for n in (3, 2, 1)], durations=[20.0] * 3)
    out = _run(spec, plan, tmp_path / "run")
    later = _asked_after_a_result(recorded)
    assert later and len(later) >= len(out.state.trials) - 3, recorded  # all but the first slots' trials
    stops = [e["trial_id"] for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "pruned"]
    assert stops and set(stops) <= {trial_id for what, trial_id in recorded if what == "told"}
