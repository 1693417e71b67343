"""Trials in flight: started on their slots through the trial runtime, gathered when done, stopped when their
instance goes.

:class:`TrialRunner` starts a trial's task (a stage's epochs, or an ASHA rung's) where the scheduler placed it,
journals its start and end, and turns a finished handle into a :class:`~rubberband.executor.observations.
TrialEnded`: finished with its metric, failed, stopped on a preemption notice, or lost with its instance (a trial
error is checked against the cloud and Ray before it counts as a training failure). What it measures (epoch
times, set-up times, iteration latencies) goes to the fleet's :class:`~rubberband.executor.fleet.Measurements`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rubberband.catalog import InstanceType
from rubberband.errors import GpuUnavailableError, TrainingError, TrialPreempted
from rubberband.executor import journal as J
from rubberband.executor import spot as S
from rubberband.executor.actions import StartTrial
from rubberband.executor.checkpoints import latest_epoch
from rubberband.executor.fleet import Fleet
from rubberband.executor.notices import WATCHERS_ENV
from rubberband.executor.observations import Ending, TrialEnded
from rubberband.executor.placement import Slot
from rubberband.executor.runtime import TrialRuntime
from rubberband.executor.services import Services
from rubberband.plan import StagePlan

RESULT_TIMEOUT_S = 60.0
#: After a trial error, how long to wait for the backend or Ray to call its instances lost (Ray marks a dead node
#: within ~2 s on the run's head) before calling it a training failure.
LOSS_CONFIRM_S = 5.0


@dataclass
class RunningTrial:
    trial_id: str
    stage: int
    slot: Slot
    handle: Any
    start_epoch: int
    end_epoch: int
    started_at: float
    cold: bool = False  # the first trial on one of its instances: its time includes the node's worker start


ConfirmLost = Callable[[tuple[str, ...], float], dict[str, str]]


class TrialRunner:
    """The run's trials in flight (see the module docstring).

    ``confirm_lost(instances, wait_s)``: which of a failed trial's instances are gone (the loss desk's).
    """

    def __init__(
        self, services: Services, fleet: Fleet, runtime: TrialRuntime, *, timeout_s: float, confirm_lost: ConfirmLost
    ) -> None:
        self.services = services
        self.fleet = fleet
        self.runtime = runtime
        self.timeout_s = timeout_s
        self.confirm_lost = confirm_lost
        self.journal = services.journal
        self.running: dict[Any, RunningTrial] = {}
        self.sink: Any = None

    def refs(self) -> list[Any]:
        return list(self.running)

    def runs(self) -> list[RunningTrial]:
        return list(self.running.values())

    def checkpoint_dir(self, trial_id: str) -> Any:
        return self.services.run_dir / "checkpoints" / trial_id

    # -- start ------------------------------------------------------------------------------------
    def start(self, action: StartTrial, stage: StagePlan) -> None:
        """Start a trial's task as the scheduler placed it, and journal it."""
        trial = self.journal.current.trials[action.trial_id]
        slot = action.slot
        ckpt_dir = self.checkpoint_dir(action.trial_id)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        names = self.fleet.watchers.names(slot.instance_ids)
        env = {"env": {WATCHERS_ENV: ",".join(names)}} if names else {}  # a stand-in runtime need not know env
        handle = self.runtime.start(
            event_sink=self.sink,
            trial_id=action.trial_id,
            config=trial.config,
            entry_point=self.services.spec.train,
            code_dir=self.services.spec.base_dir,
            start_epoch=action.start_epoch,
            end_epoch=action.end_epoch,
            placement=slot.placement,
            checkpoint_dir=str(ckpt_dir),
            checkpoint_every=S.checkpoint_every(self.fleet.runplan.plan, stage),
            device=self.fleet.devices.for_type(self._slot_itype(slot, stage)),
            timeout_s=self.timeout_s,
            pool=self.fleet.workers,
            **env,
        )
        slot.trial_id = action.trial_id
        cold = not set(slot.instance_ids) <= self.fleet.ran_on
        self.fleet.ran_on.update(slot.instance_ids)
        now = self.services.clock.time()
        run = RunningTrial(action.trial_id, action.stage, slot, handle, action.start_epoch, action.end_epoch, now, cold)
        self.running[handle.done_ref] = run
        self.journal.record(
            J.TrialStarted(
                trial_id=action.trial_id,
                stage=action.stage,
                start_epoch=action.start_epoch,
                end_epoch=action.end_epoch,
                workers=len(slot.placement),
                instances=list(slot.instance_ids),
                placement=list(slot.placement),
                from_checkpoint=_newest(trial.checkpoint_epoch, latest_epoch(ckpt_dir)),
            )
        )

    def _slot_itype(self, slot: Slot, stage: StagePlan) -> InstanceType:
        """The type of the instance a slot is on (one kept across a re-plan or a failover may be of another type
        than its new stage's): a trial's workers ask Ray for what that node has."""
        entry = self.fleet.entry(slot.instance_ids[0]) if slot.instance_ids else None
        return entry.itype if entry is not None else self.fleet.runplan.stage_itype(stage)

    # -- gather -----------------------------------------------------------------------------------
    def collect(self, ready: list[Any]) -> list[TrialEnded]:
        """The trials among ``ready`` refs, gathered and journaled; a GPU type without usable CUDA raises
        :class:`GpuUnavailableError` once its trial is journaled (every trial there would fail alike)."""
        ended = []
        for ref in ready:
            run = self.running.pop(ref, None)
            if run is not None:
                run.slot.trial_id = None
                ended.append(self._gather(run))
        return ended

    def _gather(self, run: RunningTrial) -> TrialEnded:
        unusable: GpuUnavailableError | None = None
        outcome, error = None, None
        try:
            outcome = run.handle.result(timeout_s=RESULT_TIMEOUT_S)
        except TrialPreempted as exc:  # its instance got a notice: checkpointed, restarts on the replacement
            return self._stopped(run, Ending.PREEMPTED, str(exc), {})
        except TrainingError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a dead worker or a timeout fails the trial, not the run
            error = f"{type(exc).__name__}: {exc}"
            unusable = exc if isinstance(exc, GpuUnavailableError) else None
        finally:
            run.handle.stop()
        if outcome is None:
            lost = self.confirm_lost(run.slot.instance_ids, LOSS_CONFIRM_S)
            if lost:
                return self._stopped(run, Ending.LOST, error, lost)
        ended = self._finished(run, outcome, error)
        if unusable is not None:
            raise unusable
        return ended

    def _finished(self, run: RunningTrial, outcome: Any, error: str | None) -> TrialEnded:
        seconds = self.services.clock.time() - run.started_at
        metric = None
        trial = self.journal.current.trials[run.trial_id]
        ckpt = trial.checkpoint_epoch
        if outcome is not None:
            metric, error = self._measure(run, outcome)
            seconds = outcome.finished_at - run.started_at
            ckpt = ckpt if outcome.checkpoint_epoch is None else outcome.checkpoint_epoch
        self.journal.record(
            J.TrialStopped(
                trial_id=run.trial_id,
                stage=run.stage,
                reason="finished" if error is None else "failed",
                metric=metric,
                error=error,
                start_epoch=run.start_epoch,
                end_epoch=run.end_epoch,
                seconds=seconds,
                setup_s=None if outcome is None else outcome.setup_s,
                checkpoint_epoch=ckpt,
                **_devices_used(outcome),
            )
        )
        ending = Ending.FINISHED if error is None else Ending.FAILED
        return TrialEnded(run.trial_id, run.stage, ending, run.slot.instance_ids, metric, error, seconds, run.cold)

    def _measure(self, run: RunningTrial, outcome: Any) -> tuple[float | None, str | None]:
        """Note what a finished task measured; its stage metric (and an error when it reported none)."""
        stage = self.fleet.runplan.stage(run.stage)
        measured = self.fleet.measured
        reports = sorted(outcome.reports, key=lambda r: r.epoch)
        key = f"{stage.instance_type}/{stage.workers_per_trial}"
        measured.epoch_seconds.setdefault(key, []).extend(float(r.seconds) for r in reports)
        measured.setup_seconds.append(float(outcome.setup_s))
        device = self.fleet.runplan.planned_type(stage).device
        shape = f"{device}/{len(run.slot.placement)}/{len(run.slot.instance_ids)}"
        measured.iteration_latencies.setdefault(shape, []).extend(float(x) for x in outcome.iteration_latencies_s)
        name = self.services.spec.metric.name
        final = [r for r in reports if r.epoch == run.end_epoch - 1] or reports[-1:]
        metric = final[0].metrics.get(name) if final else None
        if metric is None:
            return None, f"trial {run.trial_id} reported no metric {name!r} for epoch {run.end_epoch - 1}"
        return metric, None

    def _stopped(self, run: RunningTrial, ending: Ending, error: str | None, lost: dict[str, str]) -> TrialEnded:
        """Journal a task that stopped before its end (a notice, a lost instance): it restarts from its checkpoint."""
        seconds = self.services.clock.time() - run.started_at
        trial = self.journal.state.trials[run.trial_id]  # with the checkpoints its workers journaled until now
        self.journal.record(
            J.TrialStopped(
                trial_id=run.trial_id,
                stage=run.stage,
                reason="preempted" if ending is Ending.PREEMPTED else "instance_lost",
                metric=None,
                error=error,
                lost=sorted(lost) if ending is Ending.LOST else None,
                start_epoch=run.start_epoch,
                end_epoch=run.end_epoch,
                seconds=seconds,
                setup_s=None,
                checkpoint_epoch=_newest(trial.checkpoint_epoch, latest_epoch(self.checkpoint_dir(run.trial_id))),
            )
        )
        gone = tuple(sorted(lost.items()))
        return TrialEnded(
            run.trial_id, run.stage, ending, run.slot.instance_ids, error=error, seconds=seconds, gone=gone
        )

    # -- stop -------------------------------------------------------------------------------------
    def stop_on(self, gone: set[str]) -> list[TrialEnded]:
        """Stop the trials running on instances that are gone (their workers died with them), journaled."""
        ended = []
        for ref, run in list(self.running.items()):
            hit = gone & set(run.slot.instance_ids)
            if not hit:
                continue
            del self.running[ref]
            try:
                run.handle.stop()
            except Exception:  # noqa: BLE001 - its workers are gone already
                pass
            run.slot.trial_id = None
            lost = {ident: "lost" for ident in hit}
            ended.append(self._stopped(run, Ending.LOST, f"instance {', '.join(sorted(hit))} lost", lost))
        return ended

    def stop_all(self) -> None:
        """Teardown: stop every trial in flight (journaled ``interrupted``)."""
        for run in list(self.running.values()):
            try:
                run.handle.stop()
            except Exception:  # noqa: BLE001
                pass
            self.journal.record(J.TrialStopped(trial_id=run.trial_id, stage=run.stage, reason="interrupted"))
        self.running.clear()


def _newest(*epochs: int | None) -> int | None:
    """The newest of the checkpoints the journal and the disk know (None: none)."""
    known = [e for e in epochs if e is not None]
    return max(known) if known else None


def _devices_used(outcome: Any) -> dict[str, Any]:
    """Per rank, the device a trial trained on and the GPUs Ray assigned it (for the journal; {} if not known)."""
    out: dict[str, Any] = {}
    if getattr(outcome, "devices", ()):
        out["devices"] = list(outcome.devices)
    if any(getattr(outcome, "gpu_ids", ())):
        out["gpu_ids"] = [list(ids) for ids in outcome.gpu_ids]
    return out
