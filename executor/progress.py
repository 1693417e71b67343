"""The run's progress display on stderr: stage, trials alive, epochs, spend vs predicted, time left.

On a terminal it is one live-updating line (rich); otherwise one plain line per stage change,
so logs stay readable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.text import Text

from rubberband.units import format_duration, format_usd


@dataclass
class Progress:
    """A snapshot for the progress display."""

    stage: int
    stages: int
    bracket: int
    trials_alive: int
    trials_pending: int
    epochs_done: int
    instances: int
    spent_usd: float
    predicted_usd: float
    elapsed_s: float
    deadline_s: float


def describe(p: Progress) -> str:
    """One line; stages are numbered from 0 as in the plan table and the journal."""
    left = p.deadline_s - p.elapsed_s
    clock = f"{format_duration(left)} to deadline" if left >= 0 else f"{format_duration(-left)} past the deadline"
    return (
        f"stage {p.stage} ({p.stage + 1} of {p.stages}, bracket {p.bracket}) · trials running {p.trials_alive}, "
        f"waiting {p.trials_pending} · epochs done {p.epochs_done} · instances {p.instances} · "
        f"spent {format_usd(p.spent_usd)} of {format_usd(p.predicted_usd)} predicted · {clock}"
    )


class ProgressView:
    """Callable the executor reports to; use as a context manager."""

    def __init__(self, console: Console, *, min_interval_s: float = 0.5) -> None:
        self.console = console
        self.min_interval_s = min_interval_s
        self._live: Live | None = None
        self._last = 0.0
        self._stage: int | None = None

    def __enter__(self) -> "ProgressView":
        if self.console.is_terminal:
            self._live = Live(Text("starting…"), console=self.console, transient=False, auto_refresh=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        if self._live is not None:
            now = time.monotonic()
            if now - self._last >= self.min_interval_s:
                self._live.update(Text(describe(p)), refresh=True)
                self._last = now
        elif p.stage != self._stage:
            self._stage = p.stage
            self.console.print(describe(p), markup=False, highlight=False)
