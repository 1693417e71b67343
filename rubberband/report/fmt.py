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


def before_start(value: float) -> str:
    """The sentence a run's report adds for what the user's command spent before the executor started (its JCT,
    like the plan's prediction, counts from the start; result.json's counts from the command); empty for none."""
    if value <= 0:
        return ""
    return f" The command ran {duration(value)} before the executor started (result.json's JCT counts from it)."
