"""A local run's Ray head, started as ``rubberband run`` begins so that it comes up while the plan is made.

On the local backend the run's head takes 3.5–5 s to start on two cores, and making the plan about a second: done
one after the other, the user waits for both (issue 30: "start the head while planning, so that time is not spent
twice"). So a fresh run on a cloud whose nodes are this machine's picks its run id and directory first, begins its
head (:meth:`~rubberband.cloud.local.provider.LocalProvider.begin_head`: the ``ray start`` process is launched,
nothing waits for it, no thread), then plans; the executor's ``start_head`` takes the head over and waits only for
what is left of its start. The journal's ``head_started.requested_at`` says when it began, and ``result.json``'s
prediction from the command counts the overlap (``actual.head_early_s``).

When the run never starts (planning fails, no plan meets the deadline, the user declines it, SIGINT or SIGTERM
arrives while planning), :meth:`EarlyHead.cancel` stops the head and removes the run directory it was begun in,
which nothing else had written to: nothing is left half-written. It is begun only in a run directory of its own
(one that does not exist yet) for that reason. Until then a SIGTERM raises KeyboardInterrupt (on the main thread),
so the head goes with the command as it would on Ctrl-C; the executor installs its own handler once it runs.
"""

from __future__ import annotations

import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

if TYPE_CHECKING:
    from rubberband.cloud.backend import ExecutorBackend


@runtime_checkable
class BeginsHead(Protocol):
    """A backend whose head can be started ahead of the executor (the local provider)."""

    def begin_head(self, run_id: str) -> None: ...

    def stop_head(self) -> bool: ...


@dataclass
class EarlyHead:
    """A run's head begun before its plan was made, on ``backend`` (which the executor then runs on), in
    ``run_dir``, which did not exist before."""

    backend: "ExecutorBackend"
    run_dir: Path
    #: the SIGTERM handler before the head began (restored by :meth:`cancel`); None: not replaced
    previous_sigterm: Any = field(default=None, repr=False)

    def begin(self, run_id: str) -> None:
        """Begin ``run_id``'s head; from now until :meth:`cancel`, SIGTERM raises KeyboardInterrupt (main thread)."""
        if threading.current_thread() is threading.main_thread():
            self.previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:
            cast(BeginsHead, self.backend).begin_head(run_id)
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        """The run is over, or is not started after all: stop the head, remove its run directory unless a journal
        (an executor's) is in it, put SIGTERM's handler back. Safe to call again, and after the executor has
        stopped the head itself."""
        from rubberband.executor import journal as J

        try:
            self.backend.stop_head()
            if not (self.run_dir / J.JOURNAL_NAME).exists():
                shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            if self.previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self.previous_sigterm)
                self.previous_sigterm = None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def early_head_for(cloud: str | None, run_dir: Path) -> EarlyHead | None:
    """The head a run on ``cloud``'s backend can begin in ``run_dir`` (nothing started yet: :meth:`EarlyHead.begin`
    starts it, so the caller holds it before anything needs stopping); None when that backend's head cannot start
    ahead (its nodes are not this machine's), or when ``run_dir`` exists already (the directory must be the run's
    own, so a run that never starts leaves nothing)."""
    from rubberband.clouds import rented_clouds
    from rubberband.executor.backends import make_backend

    if cloud is None or cloud in rented_clouds() or run_dir.exists():
        return None
    backend = make_backend(cloud, run_dir)
    return EarlyHead(backend, run_dir) if isinstance(backend, BeginsHead) else None
