"""How a run's search went: the incumbent's metric over the run, from its journal's epoch reports (pure).

At any moment the incumbent is the configuration with the best result at the highest fidelity reached so far (the
most epochs any trial has reported), the definition ``bench/bench_search_regret.py`` measures regret with. Its
metric, step by step as reports arrive, is what a user watches to see whether the search is still finding better
configurations, beside the epochs trained so far (the budget spent). The report draws it for a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ProgressPoint:
    """The incumbent after one epoch report: seconds since the run started, epochs trained by then, the fidelity
    (epochs) of the incumbent's result, its metric and its trial."""

    t_s: float
    epochs_trained: int
    fidelity: int
    value: float
    trial_id: str


def search_progress(events: Iterable[dict[str, Any]], metric: str, mode: str, t0: float) -> tuple[ProgressPoint, ...]:
    """The incumbent after each epoch report that carried ``metric`` (``mode``: min or max), times from ``t0``; a
    point only where the incumbent or its value changed."""
    better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    best: dict[int, tuple[float, str]] = {}  # fidelity (epochs) -> best result there
    trained = 0
    points: list[ProgressPoint] = []
    for event in events:
        if event.get("type") != "epoch":
            continue
        trained += 1
        value = (event.get("metrics") or {}).get(metric)
        if value is None:
            continue
        fidelity = int(event["epoch"]) + 1
        held = best.get(fidelity)
        if held is None or better(float(value), held[0]):
            best[fidelity] = (float(value), str(event["trial_id"]))
        top = max(best)
        value_now, trial = best[top]
        if not points or (points[-1].value, points[-1].trial_id, points[-1].fidelity) != (value_now, trial, top):
            points.append(ProgressPoint(float(event.get("t") or t0) - t0, trained, top, value_now, trial))
    return tuple(points)
