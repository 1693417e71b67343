"""Lost instances: told apart from failed training, journaled, billed up to the loss and dropped.

A lost instance (spot interruption, or any node that dies mid-stage) is found two ways: a trial on it ends
with an error, and the backend or Ray's view of its ``rb-node-<id>`` resource says it is gone
(:meth:`LossDesk.confirm`); or the periodic liveness check finds a ready instance's node gone from Ray
(:meth:`LossDesk.poll`). Either way :meth:`LossDesk.record` journals it (``instance_lost``, then
``instance_terminated``: billed up to the loss), makes sure the cloud stops billing it and hands the scheduler
an :class:`~rubberband.executor.observations.InstancesLost`; replacing it is the scheduler's decision. Past the
loss limit (:class:`~rubberband.executor.decisions.LossPolicy`; spot interruptions not counted) the run gives up.
"""

from __future__ import annotations

from rubberband.cloud.provider import node_resource
from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor.decisions import LossPolicy
from rubberband.executor.fleet import Fleet
from rubberband.executor.observations import InstancesLost
from rubberband.executor.services import Services


class LossDesk:
    """Loss detection and its record (see the module docstring)."""

    def __init__(self, services: Services, fleet: Fleet, policy: LossPolicy) -> None:
        self.services = services
        self.fleet = fleet
        self.policy = policy
        self._seen_in_ray: set[str] = set()  # instances whose rb-node-<id> resource Ray has shown
        self.last_check = -float("inf")
        self.every_s = services.cluster.liveness_every_s

    def confirm(self, instance_ids: tuple[str, ...], wait_s: float) -> dict[str, str]:
        """Which of these instances are gone (id → ``spot-interruption`` | ``lost``), asking for up to ``wait_s``.

        The backend says whether the cloud (or the local process group) still runs it, and why not; Ray says
        whether its node still offers ``rb-node-<id>`` (only for nodes Ray has shown before).
        """
        ids = list(dict.fromkeys(instance_ids))
        clock = self.services.clock
        deadline = clock.monotonic() + wait_s
        while True:
            lost: dict[str, str] = {}
            try:
                lost.update(self.services.backend.check_lost(ids))
            except Exception:  # noqa: BLE001 - a cloud hiccup: Ray's view below still counts
                pass
            try:
                for ident in self._gone_from_ray(ids, self.services.cluster.node_resources()):
                    lost.setdefault(ident, "lost")
            except Exception:  # noqa: BLE001 - Ray's view is asked again on the next try
                pass
            if lost or clock.monotonic() >= deadline:
                return lost
            clock.sleep(0.5)

    def _gone_from_ray(self, ids: list[str], resources: dict[str, float]) -> list[str]:
        """Those of ``ids`` whose ``rb-node-<id>`` resource Ray showed before and no longer does."""
        gone = []
        for ident in ids:
            if node_resource(ident) in resources:
                self._seen_in_ray.add(ident)
            elif ident in self._seen_in_ray:
                gone.append(ident)
        return gone

    def due(self) -> bool:
        """Whether the periodic liveness check is due (the cluster's ``liveness_every_s``; 0: every turn)."""
        return self.services.clock.monotonic() - self.last_check >= self.every_s

    def next_due_s(self) -> float:
        return max(0.0, self.every_s - (self.services.clock.monotonic() - self.last_check))

    def poll(self) -> dict[str, str]:
        """Ready instances whose Ray node is gone, confirmed (id → reason); none when Ray does not answer."""
        self.last_check = self.services.clock.monotonic()
        try:
            resources = self.services.cluster.node_resources()
        except Exception:  # noqa: BLE001 - the next poll asks again
            return {}
        ready = [p.id for p in self.fleet.entries.values() if p.id is not None and p.ready and not p.released]
        suspects = self._gone_from_ray(ready, resources)
        return self.confirm(tuple(suspects), 0.0) if suspects else {}

    def record(self, lost: dict[str, str], stopped: list[tuple[str, tuple[str, ...]]], current: int) -> InstancesLost:
        """Journal and bill the lost instances (``stopped``: the trials that ran on them and their instances, in
        the order they go first again) and drop them; past the loss limit, give up (ExecutionError)."""
        journal, now = self.services.journal, self.services.clock.time()
        affected: dict[str, list[str]] = {ident: [] for ident in lost}
        for trial_id, instance_ids in stopped:
            for ident in set(lost) & set(instance_ids):
                affected[ident].append(trial_id)
        stages: dict[str, int] = {}
        for ident, reason in lost.items():
            entry = self.fleet.entry(ident)
            stages[ident] = entry.assigned_stage if entry is not None else current
            if ident in journal.current.choices.lost:  # handled already (another of its trials reported first)
                continue
            journal.record(
                J.InstanceLost(
                    t=now,
                    id=ident,
                    reason=reason,
                    stage=stages[ident],
                    instance_type=entry.itype.name if entry is not None else None,
                    trials=sorted(set(affected[ident])),
                    losses=journal.current.choices.losses + 1,
                )
            )
            journal.record(J.InstanceTerminated(t=now, id=ident, reason="lost"))  # billed up to the loss
            self._seen_in_ray.discard(ident)
            self.fleet.lost(ident, now)
        counted = journal.current.choices.counted_losses
        if self.policy.exhausted(counted):
            raise ExecutionError(
                f"{counted} instances were lost during this run, not counting spot "
                f"interruptions (limit {self.policy.max_losses}); the cloud keeps taking them "
                f"away — resume later with `rubberband run --resume {self.services.run_dir}`"
            )
        return InstancesLost(lost=dict(lost), stage=stages, trials=tuple(trial_id for trial_id, _ in stopped))
