"""Validation of option values shared by several commands (one message per flag, everywhere)."""

from __future__ import annotations

from rubberband.errors import InputError
from rubberband.units import parse_duration


def deadline_flag(value: str | None, flag: str = "--deadline") -> float | None:
    """Seconds for a ``--deadline`` value, or None when the flag was not given."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(f"{flag}: {exc}") from None
