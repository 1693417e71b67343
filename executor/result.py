"""``RUN_DIR/result.json``: what a run found, what it took and what it cost, against the plan.

Built from the journal (:class:`~rubberband.executor.journal.RunState`) and the plan the run
ended with: the outcome (:mod:`rubberband.executor.outcome`: met, late, stopped, failed,
interrupted) and its exit code; the best configuration found so far, whatever the outcome, with its
metric, the rung it was measured at and its checkpoint; the actual job
completion time (from the user's command: what went before the executor's first start, then first start → last
stage finished, downtime between resumes included) against the user's deadline, the
actual cost under the billing rules, the plan's predictions, and per-stage actual versus
predicted duration and cost. In head mode the run's head instance is in the actual cost
(``actual.head_usd``, and ``head`` with its bill) as the prediction has it
(``predicted.head_usd``); per-stage costs are the workers' only.
"""

from __future__ import annotations

from dataclasses import dataclass

import json
from pathlib import Path
from typing import Any

from rubberband.executor.accounting import bill_run
from rubberband.executor.journal import RunState
from rubberband.executor.outcome import EXIT_CODES, best_so_far, outcome_of
from rubberband.plan import Plan
from rubberband.spec import JobSpec
from rubberband.files import write_text_atomic

RESULT_NAME = "result.json"


def _latest_checkpoint(run_dir: Path, trial_id: str, recorded: str | None) -> str | None:
    if recorded and Path(recorded).exists():
        return recorded
    directory = run_dir / "checkpoints" / trial_id
    files = sorted(
        directory.glob("epoch-*"), key=lambda p: int(p.stem.split("-")[1]) if p.stem.split("-")[1].isdigit() else -1
    )
    return str(files[-1]) if files else (str(directory) if directory.exists() else None)


def _static(plan: Plan, actual_usd: float) -> dict[str, Any] | None:
    """The best static plan the planner compared with (predicted), and what this run cost against it."""
    static = plan.baselines.get("static")
    if static is None or not static.stages:
        return None
    first = static.stages[0]
    predicted = static.predicted.cost_usd.mean
    return {
        "instance_type": first.instance_type,
        "instances": first.instances,
        "workers_per_trial": first.workers_per_trial,
        "predicted_cost_usd": predicted,
        "predicted_jct_s": static.predicted.jct_s.p50,
        "cost_ratio": actual_usd / predicted if predicted > 0 else None,
    }


def deadline_from_command(state: RunState) -> float:
    """The user's deadline, counting from their command: journaled since the executor works to what its start left
    of it; for an older journal, the executor's own plus what went before its start (the verdict it had then)."""
    if state.deadline_from_command_s is not None:
        return state.deadline_from_command_s
    return state.deadline_s + state.before_start_s


@dataclass(frozen=True)
class Ending:
    """How a run ended: its status (finished, stopped, failed, interrupted), the error or reason (None when it
    finished), and when (POSIX seconds)."""

    status: str
    error: str | None
    now: float


def build_result(state: RunState, plan: Plan, spec: JobSpec, ending: Ending, run_dir: Path) -> dict[str, Any]:
    """The result of a run from its folded journal (the best trial is found in the journal,
    :func:`~rubberband.executor.outcome.best_so_far`, so a stopped run has one too)."""
    status, error, now = ending.status, ending.error, ending.now
    bill = bill_run(state, now=now)
    finished = [rec.finished_at for rec in state.stages.values() if rec.finished_at is not None]
    end = max(finished) if status == "finished" and finished else now
    stages = []
    for g, stage in enumerate(plan.stages):
        rec = state.stages.get(g)
        actual = None
        if rec is not None and rec.started_at is not None and rec.finished_at is not None:
            actual = rec.finished_at - rec.started_at
        stages.append(
            {
                "stage": g,
                "bracket": stage.bracket,
                "stage_in_bracket": stage.stage,
                "trials": stage.trials,
                "epochs": stage.epochs,
                "instance_type": stage.instance_type,
                "instances": stage.instances,
                "workers_per_trial": stage.workers_per_trial,
                "actual_duration_s": actual,
                "predicted_duration_s": stage.predicted_duration_s,
                "actual_cost_usd": bill.by_stage.get(g, 0.0),
                "predicted_cost_usd": stage.predicted_cost_usd,
            }
        )
    # the best configuration so far, whatever the outcome (for a finished run: the final ranking's winner)
    best = None
    found = best_so_far(state, plan, metric=spec.metric.name, mode=spec.metric.mode)
    if found is not None:
        trial = state.trials[found["trial_id"]]
        best = {
            "trial_id": found["trial_id"],
            "config": trial.config,
            "metric": found["metric"],
            "metric_name": spec.metric.name,
            "mode": spec.metric.mode,
            "rung": found["rung"],
            "checkpoint": _latest_checkpoint(run_dir, found["trial_id"], trial.checkpoint_path),
        }
    from_start = end - state.first_started_at
    jct, deadline = from_start + state.before_start_s, deadline_from_command(state)
    # the part of the head's start the plan counts after the executor's start that ran before it (begun while planning)
    early = min(state.head_early_s, plan.head_start_s)
    met = status == "finished" and jct <= deadline
    outcome = outcome_of(status, met)
    return {
        "run_id": state.run_id,
        "status": status,
        "outcome": outcome,
        "exit_code": EXIT_CODES[outcome],
        "error": error,
        "spec_sha256": state.spec_sha256,
        "attempts": state.attempts,
        "best": best,
        "late_by_s": max(0.0, jct - deadline),
        # JCT counts from the user's command, as their deadline does: what the command spent before the executor
        # started (loading, planning; in head mode the head's boot and the upload) and the executor's own part. The
        # plan predicts the executor's part; the prediction from the command adds what went before, as measured,
        # less the head's start where it ran during that time (a local head started while planning).
        "actual": {
            "jct_s": jct,
            "cost_usd": bill.total_usd,
            "head_usd": bill.head_usd,
            "before_start_s": state.before_start_s,
            "head_early_s": state.head_early_s,
            "jct_from_start_s": from_start,
        },
        "predicted": {
            "jct_s": plan.predicted.jct_s.p50 + state.before_start_s - early,
            "jct_p95_s": plan.predicted.jct_s.p95 + state.before_start_s - early,
            "jct_from_start_s": plan.predicted.jct_s.p50 - early,
            "cost_usd": plan.predicted.cost_usd.mean,
            "p_meet_deadline": plan.predicted.p_meet_deadline,
            "head_usd": plan.predicted.cost_breakdown.head_usd,
        },
        "deadline_s": deadline,
        "met_deadline": met,
        "stages": stages,
        "instances": [
            {
                "id": b.id,
                "instance_type": b.instance_type,
                "cloud": b.cloud,
                "price_hr": b.price_hr,
                "lifetime_s": b.lifetime_s,
                "billed_s": b.billed_s,
                "cost_usd": b.cost_usd,
            }
            for b in bill.instances
        ],
        "head": None
        if bill.head is None
        else {
            "id": bill.head.id,
            "instance_type": bill.head.instance_type,
            "cloud": bill.head.cloud,
            "price_hr": bill.head.price_hr,
            "lifetime_s": bill.head.lifetime_s,
            "billed_s": bill.head.billed_s,
            "cost_usd": bill.head.cost_usd,
            "grace_s": state.head.grace_s if state.head is not None else 0.0,
        },
        "static": _static(plan, bill.total_usd),
        "decisions": len(state.decisions),
        "instances_lost": sum(1 for life in state.instances.values() if life.lost),
    }


def write_result(result: dict[str, Any], run_dir: Path) -> Path:
    return write_text_atomic(Path(run_dir) / RESULT_NAME, json.dumps(result, indent=2, default=str) + "\n")
