"""Work in a forked child process, for the planner's :data:`~rubberband.planner.beside.Beside` seam.

``rubberband plan`` and ``rubberband run`` simulate the plan's ASHA baseline (Ray Tune's ASHA on a fixed cluster)
in a child forked from the CLI while the parent searches for the plan: on two cores Hyperband R=243 plans from the
command line in about the search's time instead of the search's plus the baseline's (bench/bench_planner.py).

A fork copies the parent as it is, so nothing is pickled on the way in and the child starts in milliseconds. It is
used only where that is safe and useful: Linux (macOS frameworks do not survive a fork), at least two usable CPUs,
and no other Python thread in the process (a Ray driver's or a test runner's threads could hold locks the child
would inherit). Elsewhere the work runs in this process after the search, as the planner's default does. The
result (or the exception) comes back pickled through a pipe; a child that dies without one is run again here.
The child is ours: :meth:`ForkedWork.cancel` kills it by its pid, and it is a daemon process, so an exiting CLI
never leaves it behind.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable, Generic, TypeVar

from rubberband.planner.beside import Deferred, Pending

T = TypeVar("T")


def can_fork() -> bool:
    """Whether forking a worker is safe and useful here (module docstring)."""
    if sys.platform != "linux" or threading.active_count() > 1:
        return False
    return len(os.sched_getaffinity(0)) >= 2


def _child(work: Callable[[], Any], conn: Connection) -> None:
    try:
        outcome: tuple[str, Any] = ("ok", work())
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        outcome = ("error", exc)
    try:
        conn.send(outcome)
    except Exception:  # noqa: BLE001 - an unpicklable outcome: the parent runs the work itself
        pass
    finally:
        conn.close()


class ForkedWork(Generic[T]):
    """``work`` running in a forked child: :meth:`result` waits for it, :meth:`cancel` kills it."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        ctx = multiprocessing.get_context("fork")
        self._conn, theirs = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_child, args=(work, theirs), daemon=True, name="rubberband-beside")
        self._process.start()
        theirs.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def result(self) -> T:
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):  # the child died, or its outcome could not be pickled
            self.cancel()
            return self._work()
        self.cancel()
        if kind == "error":
            raise value
        return value

    def cancel(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._conn.close()


def beside_in_child(work: Callable[[], T]) -> Pending[T]:
    """A :data:`~rubberband.planner.beside.Beside` that runs ``work`` in a forked child where :func:`can_fork`,
    else in this process when its result is asked for."""
    return ForkedWork(work) if can_fork() else Deferred(work)
