"""A run's heartbeat on the cloud itself, and the pure rule that tells a live run from an orphan.

``rubberband down --all-orphans --older-than T`` must not depend on files of the machine it runs on
(a CLI killed right after starting a head leaves nothing local that could be trusted). So the run
says it is alive where the sweep looks anyway: the executor rewrites the tag / label
:data:`~rubberband.cloud.provider.TAG_HEARTBEAT` (POSIX seconds) every :data:`INTERVAL_S` on the
run's head instance (head mode) or on the run's workers (``--head local``: the CLI machine is the
head and has no instance). :class:`Heartbeat` is that loop, on a daemon thread, with an injected
clock; a failed write is logged and retried at the next beat (it must never stop a run).

:func:`last_sign_of_life` is the newest of an instance's heartbeat and its launch time (a new
instance counts as alive before its first beat); :func:`orphaned_runs` (pure) says which runs have
shown no sign of life for ``T``: every instance of theirs is then an orphan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable

from rubberband.cloud.provider import TAG_HEARTBEAT, Instance

log = logging.getLogger("rubberband.cloud.heartbeat")

#: Seconds between two beats. ``--older-than`` below a few intervals can end a live run.
INTERVAL_S = 60.0


def beat_labels(now: float) -> dict[str, str]:
    """The tag / label a beat writes (digits only: a valid GCP label value)."""
    return {TAG_HEARTBEAT: str(int(now))}


def heartbeat_of(instance: Instance) -> float | None:
    """The instance's last heartbeat (POSIX seconds), None when it has none (or an unreadable one)."""
    value = instance.tags.get(TAG_HEARTBEAT, "")
    return float(value) if value.isdigit() else None


def last_sign_of_life(instance: Instance) -> float | None:
    """The newest of its heartbeat and its launch time; None when the cloud says neither."""
    times = [t for t in (heartbeat_of(instance), instance.launched_at) if t is not None]
    return max(times, default=None)


def orphaned_runs(
    instances: Iterable[Instance], *, now: float, older_than_s: float, protected: Collection[str] = ()
) -> set[str]:
    """Runs none of whose instances showed a sign of life within ``older_than_s`` before ``now`` (pure).

    An instance with no time at all counts as old. ``protected``: runs never called orphans."""
    newest: dict[str, float] = {}
    for inst in instances:
        seen = last_sign_of_life(inst)
        newest[inst.run_id] = max(newest.get(inst.run_id, float("-inf")), seen if seen is not None else float("-inf"))
    return {run for run, seen in newest.items() if now - seen >= older_than_s and run not in set(protected)}


class Heartbeat:
    """Call ``beat(now)`` at once and then every ``interval_s`` until :meth:`stop` (a daemon thread).

    ``beat`` writes the heartbeat (e.g. :func:`beat_instances`); its failures are logged, never raised."""

    def __init__(
        self, beat: Callable[[float], None], *, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.beat = beat
        self.interval_s = interval_s
        self.clock = clock
        self.beats = 0  # successful beats (tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Heartbeat":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rubberband-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                self.beat(self.clock())
                self.beats += 1
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried; it must not end the run
                log.warning("heartbeat not written (%s); retrying in %gs", exc, self.interval_s)
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def beat_instances(targets: Callable[[], Iterable[tuple[object, list[str]]]]) -> Callable[[float], None]:
    """A ``beat`` that writes the heartbeat on instances: ``targets()`` gives (provider, instance ids) pairs, each
    provider having ``set_labels(id, labels)`` (AWS CreateTags, GCP setLabels)."""

    def beat(now: float) -> None:
        labels = beat_labels(now)
        for provider, ids in targets():
            for ident in ids:
                provider.set_labels(ident, labels)  # type: ignore[attr-defined]

    return beat
