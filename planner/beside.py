"""Work the planner can run beside its search: the seam, and the in-process default.

The ASHA baseline a plan reports does not depend on the plan the search finds, so the two can run at once. The
planner stays free of processes and threads: :class:`~rubberband.planner.job.PlanOptions` takes a
:data:`Beside` (a callable that starts a piece of work and returns its :class:`Pending` result), and the CLI
passes one that runs it in a forked child on a second core (:func:`rubberband.forked.beside_in_child`).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """A piece of work started beside the search."""

    def result(self) -> T_co:
        """Its result (waiting for it where it still runs); raises what the work raised."""
        ...

    def cancel(self) -> None:
        """Stop it where it still runs; nothing once its result is in."""
        ...


#: Starts ``work`` and returns its pending result.
Beside = Callable[[Callable[[], Any]], Pending[Any]]


class Deferred(Generic[T]):
    """Work run in this process when its result is asked for (never, when cancelled first): the planner's
    default, so a search that fails (an infeasible deadline) spends nothing on it."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work

    def result(self) -> T:
        return self._work()

    def cancel(self) -> None:
        pass


def in_turn(work: Callable[[], T]) -> Pending[T]:
    """The default :data:`Beside`: ``work`` runs after the search, in this process."""
    return Deferred(work)
