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
