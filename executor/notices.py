"""Preemption notices: a small watcher on each spot instance, as a Ray actor on that instance's node.

Clouds warn a spot instance before they take it back — never guaranteed (an instance may simply be gone,
which loss detection handles): AWS two minutes ahead, GCP about 30 s. How each posts its notice is the cloud's own
(its descriptor's ``notice_reader``: ``cloud/aws/notices.py``, ``cloud/gcp/notices.py``).

:class:`NoticeWatcher` polls its node's metadata server (the base URL is passed in, never read from the
environment: the backend's ``metadata_url``, None for the cloud's own server; tests point it at a local HTTP
endpoint, and ``{instance}`` in it is replaced by the instance id, so one test endpoint can serve many stand-in
instances) and answers ``notice()`` at once, so a trial's workers can ask it at every checkpoint,
and ``wait_notice()`` blocks until the notice, so the executor learns it the moment it comes. It is no agent
of ours: an actor of the run's Ray job (no CPU, pinned to the node), gone with the job.

On a notice, a trial on that instance stops right after its next checkpoint (:class:`PreemptionNotice`,
raised by the worker's ``save_checkpoint``), and the executor requests the replacement at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rubberband.cloud.registry import descriptor
from rubberband.clouds import CLOUDS
from rubberband.errors import InputError

#: Environment of a trial's workers: the names of their instances' watchers (set by the executor).
WATCHERS_ENV = "RUBBERBAND_NOTICE_WATCHERS"
#: How often a watcher reads its metadata server (AWS's notice comes 2 min ahead, GCP's 30 s).
POLL_S = 2.0
#: How long one metadata read may take (the link-local servers answer in milliseconds).
READ_TIMEOUT_S = 2.0


class PreemptionNotice(BaseException):
    """Raised in a trial's worker after its checkpoint once its instance got a preemption notice.

    A BaseException, like KeyboardInterrupt, so that a user's ``except Exception`` does not swallow it; the
    worker reports it as a failure of kind ``preempted`` and the trial restarts elsewhere from that checkpoint.
    """


@dataclass(frozen=True)
class NoticeSource:
    """Where a watcher reads its notice: the cloud's metadata flavour and the base URL."""

    cloud: str
    base_url: str

    def for_instance(self, instance_id: str) -> "NoticeSource":
        return NoticeSource(self.cloud, self.base_url.replace("{instance}", instance_id))


def check_metadata_url(value: str | None) -> str | None:
    """A metadata base URL passed in (None or empty: the cloud's own server): ``http(s)://host[:port]/path``, where
    ``{instance}`` stands for the instance id; InputError for anything else."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError for a port that is not a number
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
    except ValueError:
        ok = False
    if not ok:
        raise InputError(
            f"metadata URL {value!r} is not an http(s)://HOST[:PORT]/PATH base URL "
            f"({{instance}} in it stands for the instance id)"
        )
    return value


def notice_source(cloud: str, base_url: str | None = None) -> NoticeSource | None:
    """The notice source of a cloud's spot instances: ``base_url`` (passed in: tests serve notices from a local
    endpoint) or, when None, the cloud's own metadata server; None for a cloud without notices (local, sim)."""
    known = CLOUDS.get(cloud)
    default = known.notice_url if known is not None else None  # the cloud's own server (rubberband/clouds.py)
    if default is None:
        return None
    base = base_url or default
    return NoticeSource(cloud, base if base.endswith("/") else base + "/")


class NoticeReader:
    """One read of the metadata server: the notice as a dict, or None (no notice yet, or no answer). How a cloud
    posts its notice is its own (the descriptor's ``notice_reader``: ``cloud/aws/notices.py``,
    ``cloud/gcp/notices.py``)."""

    def __init__(self, source: NoticeSource, *, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.source = source
        self.timeout_s = timeout_s
        self._reader = descriptor(source.cloud).notice_reader(source.base_url, timeout_s)

    def read(self) -> dict[str, Any] | None:
        if self._reader is None:
            return None
        try:
            return self._reader.read()
        except (OSError, ValueError):  # no metadata server (yet), a timeout: no notice this time
            return None


class NoticeWatcher:
    """The watcher (wrapped as a Ray actor by :func:`start_watcher`): polls in a thread, answers at once."""

    def __init__(self, source: NoticeSource, poll_s: float = POLL_S) -> None:
        self._reader = NoticeReader(source)
        self._poll_s = poll_s
        self._notice: dict[str, Any] | None = None
        self._seen = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._poll, name="rb-notice", daemon=True).start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            notice = self._reader.read()
            if notice is not None:
                self._notice = {**notice, "seen_at": time.time()}
                self._seen.set()
                return
            self._stop.wait(self._poll_s)

    def notice(self) -> dict[str, Any] | None:
        """The notice, once one came (None before)."""
        return self._notice

    def wait_notice(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Block until a notice comes (or ``timeout_s`` passes: None)."""
        self._seen.wait(timeout_s)
        return self._notice

    def stop(self) -> None:
        self._stop.set()


def watcher_name(instance_id: str) -> str:
    """The Ray actor name of an instance's watcher (in the run's namespace)."""
    return f"rb-notice-{instance_id}"


def node_of(resource: str) -> str | None:
    """The Ray node id of the live node that offers ``resource`` (an instance's ``rb-node-<id>``)."""
    import ray

    for node in ray.nodes():
        if node.get("Alive") and resource in node.get("Resources", {}):
            return node["NodeID"]
    return None


def start_watcher(instance_id: str, resource: str, source: NoticeSource, *, poll_s: float = POLL_S) -> Any | None:
    """Start the watcher of one instance on its node (no CPU; threads answer while it polls); None when Ray does
    not show the node (yet)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = node_of(resource)
    if node is None:
        return None
    cls = ray.remote(NoticeWatcher)
    return cls.options(
        num_cpus=0,
        max_concurrency=4,
        name=watcher_name(instance_id),
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(source.for_instance(instance_id), poll_s)


def check_watchers(names: list[str], cache: dict[str, Any], *, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """In a trial's worker: the first notice any of the named watchers has (None: none, or none reachable)."""
    import ray

    for name in names:
        try:
            actor = cache.get(name)
            if actor is None:
                actor = cache[name] = ray.get_actor(name)
            notice = ray.get(actor.notice.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a watcher gone (its instance released) tells nothing
            continue
        if notice is not None:
            return notice
    return None


class NoticeWatchers:
    """The run's notice watchers, one per ready spot instance, as the executor keeps them (the Ray side).

    ``watch`` starts one where the cloud posts notices; ``found`` says which answered (a notice, or None when
    the watcher died with its node) without blocking, and asks ``ask``'s watchers directly; ``names`` are what a
    trial's workers are told (``WATCHERS_ENV``) so they stop after a checkpoint on a notice.

    ``metadata_url``: the metadata server's base URL the watchers read (the backend's ``metadata_url``); None: the
    cloud's own.
    """

    def __init__(self, cloud: str, metadata_url: str | None = None) -> None:
        self.source = notice_source(cloud, metadata_url)
        self._actors: dict[str, Any] = {}  # instance -> its NoticeWatcher actor (None: could not start, not retried)
        self._pending: dict[str, Any] = {}  # instance -> the pending wait_notice() call on its watcher

    def watching(self, instance_id: str) -> bool:
        """Whether a watcher was started (or tried) for this instance."""
        return instance_id in self._actors

    def watch(self, instance_id: str, resource: str) -> str | None:
        """Start the watcher of a ready spot instance; the error when it could not start (then not tried again).

        Nothing when the cloud posts no notices (local) or Ray does not show the node yet (tried again later).
        """
        if self.source is None or instance_id in self._actors:
            return None
        try:
            actor = start_watcher(instance_id, resource, self.source)
        except Exception as exc:  # noqa: BLE001 - no watcher: a preemption is still seen as a lost instance
            self._actors[instance_id] = None
            return f"{type(exc).__name__}: {exc}"
        if actor is not None:
            self._actors[instance_id] = actor
            self._pending[instance_id] = actor.wait_notice.remote()
        return None

    def unwatch(self, instance_id: str) -> None:
        self._pending.pop(instance_id, None)
        actor = self._actors.pop(instance_id, None)
        if actor is not None:
            import ray

            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - gone with its node
                pass

    def refs(self) -> list[Any]:
        """The pending ``wait_notice`` calls: each is ready when its notice comes (or its watcher dies)."""
        return list(self._pending.values())

    def taken(self, instance_id: str) -> None:
        """Its notice was acted on: stop waiting for it."""
        self._pending.pop(instance_id, None)

    def names(self, instance_ids: tuple[str, ...] | list[str]) -> list[str]:
        """The watcher names of those instances that have one (what their trials' workers ask)."""
        return [watcher_name(i) for i in instance_ids if self._actors.get(i) is not None]

    def found(self, ask: tuple[str, ...] = ()) -> dict[str, Any]:
        """Instance → notice (None: none, or its watcher is gone) of the watchers that answered, and of ``ask``."""
        if not self._pending and not ask:
            return {}
        import ray

        refs = {ref: ident for ident, ref in self._pending.items()}
        try:
            ready = ray.wait(list(refs), num_returns=len(refs), timeout=0)[0] if refs else []
        except Exception:  # noqa: BLE001 - asked again on the next poll
            ready = []
        found: dict[str, Any] = {}
        for ref in ready:
            try:
                found[refs[ref]] = ray.get(ref, timeout=1)
            except Exception:  # noqa: BLE001 - its watcher died with its node: loss detection handles it
                found[refs[ref]] = None
        for ident in ask:
            actor = self._actors.get(ident)
            if ident not in found and actor is not None:
                try:
                    found[ident] = ray.get(actor.notice.remote(), timeout=5)
                except Exception:  # noqa: BLE001 - as above
                    continue
        return found
