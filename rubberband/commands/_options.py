"""Validation of option values shared by several commands (one message per flag, everywhere)."""

from __future__ import annotations

from rubberband.errors import InputError
from rubberband.units import parse_duration, parse_overrun


def deadline_flag(value: str | None, flag: str = "--deadline") -> float | None:
    """Seconds for a ``--deadline`` value, or None when the flag was not given."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(f"{flag}: {exc}") from None


def on_late_flag(value: str) -> str:
    """``--on-late``: what a run does at a stage boundary once no plan meets the deadline (finish | stop)."""
    from rubberband.planner.policies import ON_LATE

    choice = value.strip().lower()
    if choice not in ON_LATE:
        raise InputError(
            f"--on-late {value!r}: use 'finish' (go on and say how late) or 'stop' (stop now and "
            f"return the best configuration so far)"
        )
    return choice


def overrun_flag(value: str, deadline_s: float) -> float:
    """Seconds for ``--overrun`` (a share of ``deadline_s``, a duration, 0 or none → math.inf)."""
    try:
        return parse_overrun(value, deadline_s)
    except ValueError as exc:
        raise InputError(f"--overrun: {exc}") from None
