"""Parsing and formatting of durations and money, shared by the spec and the CLI."""

from __future__ import annotations

import math

import re

_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|hr|min|m|sec|s)")


def parse_duration(value: str | int | float) -> float:
    """Return seconds for ``90m``, ``2h``, ``1h30m``, ``45s``, ``3600`` or a number.

    Raises ``ValueError`` with the accepted forms on anything else.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90m, 2h, 1h30m or seconds")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        text = str(value).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        else:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(f"cannot read duration {value!r}: use forms like 90m, 2h, 1h30m, 45s or seconds")
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"duration {str(value)[:40]!r} is too large; use forms like 90m, 2h, 1h30m, 45s or seconds")
    return seconds


def parse_overrun(value: str, deadline_s: float) -> float:
    """Seconds a late run may go past its deadline: ``10%`` (of the deadline), ``15m``, ``0`` or ``none`` (no limit).

    Raises ``ValueError`` with the accepted forms on anything else.
    """
    text = str(value).strip().lower()
    if text in ("none", "inf", "unlimited"):
        return math.inf
    if re.fullmatch(r"0+(\.0*)?s?", text):
        return 0.0
    try:
        if not text.endswith("%"):
            return parse_duration(text)
        share = float(text[:-1])
        if 0 <= share < math.inf:
            return share / 100.0 * deadline_s
    except ValueError:
        pass
    raise ValueError(f"cannot read overrun {value!r}: use a share of the deadline (10%), a duration (15m), 0 or none")


def format_duration(seconds: float) -> str:
    """Human form: ``1h 23m``, ``4m 05s``, ``12.3s``."""
    if seconds != seconds:  # NaN
        return "n/a"
    if seconds < 60:
        return f"{seconds:.1f}s"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s"


def format_usd(amount: float) -> str:
    """Dollars with cents, four decimals below one dollar, two significant digits below $0.0001."""
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    if amount == 0 or abs(amount) >= 0.0001:
        return f"${amount:.4f}"
    return f"${amount:.{_two_digits(amount)}f}"


def format_usd_column(amounts: list[float]) -> list[str]:
    """Dollars for one table column, all with the same decimals: two, or as many as give the smallest
    non-zero amount two significant digits (``$3.79``, ``$0.94`` rather than ``$3.79``, ``$0.9376``)."""
    decimals = max(2, _two_digits(min((abs(a) for a in amounts if a), default=1.0)))
    return [f"${a:,.{decimals}f}" for a in amounts]


def _two_digits(amount: float) -> int:
    """Decimals that show a non-zero ``amount`` with two significant digits."""
    return 1 - math.floor(math.log10(abs(amount)))
