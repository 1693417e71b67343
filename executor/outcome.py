"""How a run ended, in one word, one exit code and one line; and the best configuration found so far.

Every run writes ``result.json``, whatever the outcome, with the best configuration found so far,
its metric and the rung (stage, epochs) it was measured at:

======================  ===========  ====  ===================================================
outcome                 status       exit  when
======================  ===========  ====  ===================================================
``met``                 finished     0     every stage ran, the JCT is within the deadline
``late``                finished     4     every stage ran, past the deadline (``--on-late finish``)
``stopped``             stopped      5     stopped early with a partial result: ``--on-late stop``
                                           at a stage boundary, or the deadline plus ``--overrun``
``failed``              failed       1     an error (cloud, every trial of a stage failed, ...)
``interrupted``         interrupted  130   SIGINT / SIGTERM
======================  ===========  ====  ===================================================

(2 is bad input and 3 an infeasible plan: both before a run starts.) Pure functions of the journal's
folded state: no I/O.
"""

from __future__ import annotations

from typing import Any

from rubberband.executor.journal import RunState
from rubberband.plan import Plan
from rubberband.units import format_duration

EXIT_CODES = {"met": 0, "late": 4, "stopped": 5, "failed": 1, "interrupted": 130}


def best_so_far(state: RunState, plan: Plan, *, metric: str, mode: str) -> dict[str, Any] | None:
    """The best trial at the deepest rung measured so far, or None before any metric.

    A rung is a stage's epoch count: among every (trial, stage) the trial finished, the ones at the
    most epochs compete (a trial trained longer outranks one measured earlier, as successive halving
    has it); ties in the metric go to the lower trial id. ``complete`` says whether every trial of
    that stage finished. With no stage finished by any trial, the epochs reported so far count:
    the deepest epoch any trial reported, best metric there.
    """
    sign = 1.0 if mode == "min" else -1.0
    points: list[tuple[int, float, str, int | None]] = []  # (epochs, metric, trial, stage)
    for trial_id, trial in state.trials.items():
        for g, value in trial.finished_stages.items():
            if value is not None and 0 <= g < len(plan.stages):
                points.append((plan.stages[g].epochs, float(value), trial_id, g))
    if not points:
        for trial_id, trial in state.trials.items():
            for epoch, metrics in trial.epochs.items():
                if metrics.get(metric) is not None:
                    points.append((epoch + 1, float(metrics[metric]), trial_id, None))
    if not points:
        return None
    epochs = max(p[0] for p in points)
    # the stage a rung belongs to: at equal epochs (Hyperband brackets) the best trial's own
    epochs_, value, trial_id, stage = min((p for p in points if p[0] == epochs), key=lambda p: (sign * p[1], p[2]))
    complete = False
    if stage is not None:
        rec = state.stages.get(stage)
        complete = rec is not None and rec.finished_at is not None
    return {
        "trial_id": trial_id,
        "metric": value,
        "rung": {
            "stage": stage,
            "bracket": plan.stages[stage].bracket if stage is not None else None,
            "epochs": epochs_,
            "complete": complete,
        },
    }


def outcome_of(status: str, met_deadline: bool) -> str:
    """``met`` | ``late`` | ``stopped`` | ``failed`` | ``interrupted`` from the run's status."""
    if status == "finished":
        return "met" if met_deadline else "late"
    return status if status in EXIT_CODES else "failed"


def exit_code(result: dict[str, Any]) -> int:
    """The CLI's exit code for a ``result.json`` (older results without ``outcome``: from ``status``)."""
    outcome = result.get("outcome") or outcome_of(result.get("status", "failed"), bool(result.get("met_deadline")))
    return EXIT_CODES.get(outcome, 1)


def outcome_line(result: dict[str, Any]) -> str:
    """One line saying how the run ended, with the best so far where it stopped early or failed."""
    outcome = result.get("outcome") or outcome_of(result.get("status", "failed"), bool(result.get("met_deadline")))
    jct, deadline = result["actual"]["jct_s"], result.get("deadline_s") or 0.0
    code = EXIT_CODES.get(outcome, 1)
    if outcome == "met":
        text = f"met the deadline: JCT {format_duration(jct)} ≤ {format_duration(deadline)}"
    elif outcome == "late":
        text = (
            f"finished late: {format_duration(jct - deadline)} past the deadline "
            f"(JCT {format_duration(jct)}, deadline {format_duration(deadline)})"
        )
    elif outcome == "stopped":
        text = f"stopped after {format_duration(jct)} (deadline {format_duration(deadline)}): {result.get('error')}"
    elif outcome == "interrupted":
        text = "interrupted"
    else:
        text = f"failed: {result.get('error')}"
    if outcome not in ("met", "late"):
        best = result.get("best")
        if best:
            rung = best.get("rung") or {}
            stage = f"stage {rung['stage']}, " if rung.get("stage") is not None else ""
            where = f"{stage}{rung.get('epochs')} epochs"
            text += f"; best so far {best['trial_id']} {best.get('metric_name')}={best.get('metric')} ({where})"
        else:
            text += "; no configuration measured yet"
    return f"outcome: {outcome} (exit {code}): {text}"
