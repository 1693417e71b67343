"""The executor's clock: wall time for real runs, virtual time for runs on a simulated cluster.

Every reading of time in the executor (journal timestamps, elapsed time against the deadline, how
long a trial or a start-up took, when to poll again) goes through one :class:`Clock`, injected into
the executor. :class:`WallClock` is the real one. :class:`VirtualClock` starts at a given instant
and moves only when the executor sleeps (or a simulated cluster advances it to its next event), so the
same executor code can run a plan in virtual time, as Syne Tune's ``TimeKeeper`` lets one tuner run on
wall or simulated time.
"""

from __future__ import annotations

import math
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What the executor asks of time."""

    def time(self) -> float:
        """Seconds since the epoch (POSIX): journal timestamps, billing."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: timeouts and intervals."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...


class WallClock:
    """The machine's clock (``time.time``, ``time.monotonic``, ``time.sleep``)."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """A clock that moves only when told: :meth:`sleep` and :meth:`advance_to` move it forward at once.

    ``start``: its first reading of :meth:`time` (POSIX seconds); :meth:`monotonic` reads the same instant.
    """

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise ValueError(f"a virtual clock starts at a finite instant, not {start!r}")
        self._now = float(start)

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        if not seconds >= 0:  # NaN included
            raise ValueError(f"cannot sleep {seconds!r} seconds")
        self._now += seconds

    def advance_to(self, instant: float) -> None:
        """Move to ``instant`` (never back: an earlier instant leaves the clock where it is)."""
        if not math.isfinite(instant):
            raise ValueError(f"cannot advance a virtual clock to {instant!r}")
        self._now = max(self._now, float(instant))


#: The clock of every real run.
WALL_CLOCK = WallClock()
