"""How a run ended: the best configuration so far (with its rung), the outcome, its exit code and line."""

from __future__ import annotations

import time

import pytest
from executor_helpers import make_plan, write_job

from rubberband.executor import journal as J
from rubberband.executor.outcome import EXIT_CODES, best_so_far, exit_code, outcome_line
from rubberband.executor.result import Ending, build_result
from rubberband.spec import load_spec


@pytest.fixture
def job(tmp_path):
    spec = load_spec(write_job(tmp_path / "job"))  # 9 trials → 3 (3 epochs), loss: min
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu4", 1, 2)])
    return spec, plan


def _state(spec, plan, events):
    t = time.time() - 50
    start = {
        "type": J.RUN_STARTED,
        "t": t,
        "run_id": "r1",
        "spec_sha256": spec.sha256(),
        "spec": spec.model_dump(mode="json"),
        "plan": plan.model_dump(mode="json"),
        "cloud": "local",
        "deadline_s": 40.0,
    }
    trials = [
        {
            "type": J.TRIAL_CREATED,
            "t": t,
            "trial_id": f"b0-t{i:03d}",
            "bracket": 0,
            "index": i,
            "config": {"quality": i / 10},
        }
        for i in range(9)
    ]
    return J.fold([start, *trials, *events])


def _finished(trial, stage, metric):
    return {"type": J.TRIAL_STOPPED, "trial_id": trial, "stage": stage, "reason": "finished", "metric": metric}


def test_best_so_far_is_the_best_trial_of_the_deepest_rung(job):
    spec, plan = job
    events = [_finished(f"b0-t{i:03d}", 0, m) for i, m in [(0, 0.5), (1, 0.2), (2, 0.9)]]
    state = _state(spec, plan, events)
    best = best_so_far(state, plan, metric="loss", mode="min")
    assert best["trial_id"] == "b0-t001" and best["metric"] == 0.2
    assert best["rung"] == {"stage": 0, "bracket": 0, "epochs": 1, "complete": False}
    # a deeper rung outranks a better metric measured earlier
    state = _state(
        spec, plan, events + [{"type": J.STAGE_FINISHED, "stage": 0, "metrics": {}}, _finished("b0-t002", 1, 0.3)]
    )
    best = best_so_far(state, plan, metric="loss", mode="min")
    assert best["trial_id"] == "b0-t002" and best["rung"]["stage"] == 1 and best["rung"]["epochs"] == 3
    assert best_so_far(state, plan, metric="loss", mode="max")["trial_id"] == "b0-t002"  # alone at that rung


def test_before_any_stage_the_reported_epochs_count(job):
    spec, plan = job
    assert best_so_far(_state(spec, plan, []), plan, metric="loss", mode="min") is None
    epochs = [
        {"type": J.EPOCH, "trial_id": "b0-t004", "epoch": 0, "metrics": {"loss": 0.7}},
        {"type": J.EPOCH, "trial_id": "b0-t005", "epoch": 0, "metrics": {"loss": 0.6}},
    ]
    best = best_so_far(_state(spec, plan, epochs), plan, metric="loss", mode="min")
    assert best["trial_id"] == "b0-t005" and best["rung"] == {
        "stage": None,
        "bracket": None,
        "epochs": 1,
        "complete": False,
    }


@pytest.mark.parametrize(
    "status, late, outcome",
    [
        ("finished", False, "met"),
        ("finished", True, "late"),
        ("stopped", True, "stopped"),
        ("failed", False, "failed"),
        ("interrupted", False, "interrupted"),
    ],
)
def test_result_json_says_the_outcome_with_its_exit_code_and_the_best_so_far(job, tmp_path, status, late, outcome):
    spec, plan = job
    events = [_finished("b0-t003", 0, 0.4)]
    state = _state(spec, plan, events)
    state.deadline_s = 10.0 if late else 3600.0
    result = build_result(
        state,
        plan,
        spec,
        Ending(status, "why" if status != "finished" else None, time.time()),
        tmp_path,
    )
    assert result["outcome"] == outcome and result["exit_code"] == EXIT_CODES[outcome] == exit_code(result)
    assert result["best"]["trial_id"] == "b0-t003" and result["best"]["rung"]["epochs"] == 1  # whatever the outcome
    assert (result["late_by_s"] > 0) == late
    line = outcome_line(result)
    assert line.startswith(f"outcome: {outcome} (exit {EXIT_CODES[outcome]}): ") and "\n" not in line
    if outcome not in ("met", "late"):
        assert "best so far b0-t003 loss=0.4 (stage 0, 1 epochs)" in line


def test_exit_codes_are_distinct_and_documented():
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    assert set(EXIT_CODES.values()).isdisjoint({2, 3})  # bad input, infeasible
    from conftest import REPO

    docs = (REPO / "docs" / "executor.md").read_text()
    for outcome, code in EXIT_CODES.items():
        assert f"`{code}` {outcome}" in docs
    assert exit_code({"status": "finished", "met_deadline": True}) == 0  # an older result.json
