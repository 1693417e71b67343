"""How every number in a report is written: one place, so HTML, Markdown and tests agree."""

from __future__ import annotations

from rubberband.units import format_duration, format_usd

DASH = "—"


def usd(value: float | None) -> str:
    return DASH if value is None else format_usd(value)


def duration(value: float | None) -> str:
    return DASH if value is None else format_duration(value)


def percent(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}×"


def count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def before_start(value: float, head_early_s: float = 0.0) -> str:
    """The sentence a run's report adds for what the user's command spent before the executor started (its JCT,
    like the plan's prediction, counts from the start; result.json's counts from the command), and how much of the
    head's start that overlapped (a local head begun while planning: the executor waited that much less for it);
    empty for none."""
    if value <= 0:
        return ""
    overlap = (
        f"; the run's Ray head was starting for {duration(head_early_s)} of it, which the executor did not wait for"
        if head_early_s > 0
        else ""
    )
    return (
        f" The command ran {duration(value)} before the executor started (result.json's JCT counts from it){overlap}."
    )
