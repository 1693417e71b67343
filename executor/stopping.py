"""How a run stops before its end: on a signal, past its deadline plus the allowed overrun, or on purpose.

:class:`RunGuard` is what the loop checks on every wake: a SIGINT / SIGTERM that arrived (turned into
:class:`Interrupted` there, so teardown runs and Ray's C code is never interrupted mid-call), and the
deadline (:class:`~rubberband.executor.decisions.DeadlineWatch`): past it, the run goes on for the allowed
overrun (journaled once, ``deadline_passed``), then everything stops (:class:`DeadlineExceeded`).
"""

from __future__ import annotations

import math
import signal
import threading
from typing import Any

from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor.decisions import DeadlineState, DeadlineWatch
from rubberband.executor.services import Services
from rubberband.units import format_duration


class RunStopped(ExecutionError):
    """The run was stopped early on purpose, with a partial result (outcome ``stopped``, exit 5)."""

    exit_code = 5


class DeadlineExceeded(RunStopped):
    """The run passed its deadline by more than its allowed overrun; everything was stopped."""


class Interrupted(ExecutionError):
    """SIGINT / SIGTERM arrived; everything was stopped."""

    exit_code = 130


class RunGuard:
    """Signals and the deadline, checked by the loop (see the module docstring)."""

    def __init__(self, services: Services, watch: DeadlineWatch) -> None:
        self.services = services
        self.watch = watch
        self._signal: str | None = None
        self._saved: dict[int, Any] = {}

    # -- signals --------------------------------------------------------------------------------------
    def catch_signals(self) -> None:
        """SIGINT / SIGTERM become :class:`Interrupted` at the loop's next check (main thread only; after
        ``ray.init``, which installs its own SIGTERM handler that aborts)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupted(signum: int, frame: Any) -> None:  # raising inside Ray's C code would garble it
            self._signal = signal.Signals(signum).name
            self.services.cluster.wake()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, interrupted)

    def ignore_signals(self) -> None:
        """Teardown: a second Ctrl-C must not cut it short."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved.setdefault(sig, signal.signal(sig, signal.SIG_IGN))

    def restore_signals(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._saved.clear()

    # -- the check ------------------------------------------------------------------------------------
    def check(self, stage: int) -> None:
        """Raise :class:`Interrupted` after a signal, :class:`DeadlineExceeded` past the deadline plus the
        overrun; journal the deadline's passing once (``stage``: the stage running, for the record)."""
        run_dir = self.services.run_dir
        if self._signal is not None:
            raise Interrupted(
                f"run stopped by {self._signal}; every instance was terminated; "
                f"resume with `rubberband run --resume {run_dir}`"
            )
        elapsed = self.services.elapsed()
        state = self.watch.state(elapsed)
        journal = self.services.journal
        if state is not DeadlineState.ON_TIME and not journal.current.choices.deadline_passed:
            overrun = self.watch.overrun_s
            journal.record(
                J.DeadlinePassed(
                    stage=stage,
                    elapsed_s=round(elapsed, 3),
                    deadline_s=self.watch.deadline_s,
                    overrun_s=None if math.isinf(overrun) else overrun,
                    note="late: the run goes on until the deadline plus the allowed overrun",
                )
            )
        if state is DeadlineState.OVER:
            overrun = self.watch.overrun_s
            allowed = f" plus the allowed overrun ({format_duration(overrun)})" if overrun else ""
            raise DeadlineExceeded(
                f"run passed its deadline ({format_duration(self.watch.deadline_s)}){allowed} in stage "
                f"{stage}; every instance was terminated; to finish it anyway: "
                f"rubberband run --resume {run_dir} --overrun none"
            )

    def next_due_s(self) -> float:
        """Seconds until the deadline, or until the deadline plus the overrun once past it (inf: never)."""
        elapsed = self.services.elapsed()
        end = self.watch.deadline_s
        if elapsed > end:
            end += self.watch.overrun_s
        return max(0.0, end - elapsed)
