"""The performance model: iteration latency, stragglers and start-up latency, fitted from a profile.

Iteration latency follows Pollux (OSDI'21), per device:

* ``T_grad(m) = α_g + β_g·m`` for per-worker batch ``m``. Profiles measure one batch size, so
  ``T_grad`` is one fitted constant (``β_g = 0``) unless several batch sizes are recorded.
* ``T_sync(w, nodes) = 0`` for one worker, otherwise ``α_s + β_s·(w − 2)`` with separate
  ``(α, β)`` for a trial inside one node and one spanning several nodes.
* ``T_iter = (T_grad^γ + T_sync^γ)^(1/γ)`` with ``γ ≥ 1`` (overlap of compute and communication).

Parameters are fitted in log space with :func:`scipy.optimize.least_squares` on the log of the
median latency of every measured shape, plus weak priors (relative to ``T_grad``) so that a
profile with one or two shapes still yields a stable, sensible model. Devices that were not
measured but have a ``device_speed`` scale the reference device's compute term. The fit is stored in the
profile it was made from (``fitted.devices[].fit_key``: a digest of its points and priors) and reused from
there while that key still matches, so planning from a profile rubberband wrote does not fit (nor import
scipy.optimize) again.

Stragglers: each node of a trial runs at a lognormal slowdown factor (median 1) whose σ is the
robust spread (MAD of log latency, warm-up iterations dropped) of the measured latencies; a
trial runs at the pace of its slowest node.

Per-epoch noise and per-configuration speed (:mod:`rubberband.planner.noise`): fitted from the
profile's whole-epoch times of several sampled configurations, relative to this model's epoch
time for the shape they ran at; absent (v1 profiles), both are 0 and ``variation.source`` says so.

Start-up latency: empirical samples per (cloud, instance type), else per cloud, else the
documented defaults below (marked ``source="default"``). A new instance runs its first trial
``worker_start_s`` after it is up (its worker processes start). Termination latency (billed
after the release) follows the same lookup as start-up.

Per task (one trial's run in one stage): ``task_start_s`` on warm workers (or the restart
overhead and checkpoint transfer when the placement changed), then per epoch the iterations
plus ``epoch_overhead_s`` (evaluation, data loading, reporting, checkpoint save), then
``eval_time_s`` once (see :meth:`PerformanceModel.task_overhead`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rubberband.clouds import facts_or_like
from rubberband.errors import ProfileError
from rubberband.planner.noise import Variation, fit_variation
from rubberband.profile import Profile, TuneTrialStart

# Checkpoint transfer bandwidth between instances (GB/s), ~10 Gbit/s networking.
TRANSFER_GB_PER_S = 1.0
MAX_SIGMA = 0.5

# Priors, relative to the fitted compute time T_grad (log-space, weak): intra-node sync costs a few
# percent of compute per iteration, cross-node much more; γ ≈ 1.5 (partial overlap).
_PRIOR_REL = {"a1": 0.05, "b1": 0.01, "aN": 0.25, "bN": 0.05}
_PRIOR_GAMMA = 1.5
_PRIOR_WEIGHT = 0.02
#: Bumped when :func:`_fit_device` changes in a way its priors do not show: a stored fit's key then differs.
_FIT_VERSION = 1
_DEVICE_PARAMS = (
    "alpha_grad",
    "beta_grad",
    "alpha_sync_node",
    "beta_sync_node",
    "alpha_sync_cross",
    "beta_sync_cross",
    "gamma",
)


@dataclass(frozen=True)
class DeviceModel:
    """Fitted Pollux parameters of one device (seconds)."""

    alpha_grad: float
    beta_grad: float
    alpha_sync_node: float
    beta_sync_node: float
    alpha_sync_cross: float
    beta_sync_cross: float
    gamma: float
    source: str = "fitted"  # fitted | scaled from <ref> | ...
    points: int = 0
    rms_log_error: float = 0.0
    #: What the fit was made from (:func:`fit_key`); empty: not fitted here.
    fit_key: str = ""

    def t_grad(self, batch: int) -> float:
        return self.alpha_grad + self.beta_grad * batch

    def t_sync(self, workers: int, nodes: int) -> float:
        if workers <= 1:
            return 0.0
        if nodes <= 1:
            return self.alpha_sync_node + self.beta_sync_node * (workers - 2)
        return self.alpha_sync_cross + self.beta_sync_cross * (workers - 2)

    def t_iter(self, batch: int, workers: int, nodes: int) -> float:
        g = self.t_grad(batch)
        s = self.t_sync(workers, nodes)
        if s <= 0:
            return g
        return (g**self.gamma + s**self.gamma) ** (1.0 / self.gamma)

    def scaled(self, speed: float, reference: str) -> "DeviceModel":
        """The same interconnect with compute ``speed`` times faster than the reference device."""
        return DeviceModel(
            self.alpha_grad / speed,
            self.beta_grad / speed,
            self.alpha_sync_node,
            self.beta_sync_node,
            self.alpha_sync_cross,
            self.beta_sync_cross,
            self.gamma,
            source=f"scaled from {reference} by device_speed {speed:g}",
            points=0,
        )


@dataclass(frozen=True)
class StartupModel:
    """Empirical start-up latencies of one (cloud, instance type), sorted; ``source`` says whence."""

    samples_s: tuple[float, ...]
    source: str

    def quantile(self, q: float) -> float:
        values = self.samples_s
        pos = q * (len(values) - 1)  # numpy's default (linear) quantile, without its overhead
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(values) - 1)
        return float(values[lo] + (values[hi] - values[lo]) * (pos - lo))

    def sample(self, uniforms: np.ndarray) -> np.ndarray:
        """Bootstrap draws from uniforms in [0, 1) (common random numbers across plans)."""
        values = np.asarray(self.samples_s)  # sorted
        idx = np.minimum((uniforms * len(values)).astype(np.int64), len(values) - 1)
        return values[idx]


@dataclass(frozen=True)
class StartOverlap:
    """What overlapping start-ups on one shared host add (profile ``startup_overlap``): an instance whose worker
    processes start while the next instance boots takes ``worker_extra_s`` longer to be ready, and that next
    instance boots ``boot_extra_s`` longer, with ``workers`` worker processes starting (scaled linearly for other
    counts: the contention is the workers' CPU)."""

    workers: int
    boot_extra_s: float
    worker_extra_s: float

    def extras(self, workers: int) -> tuple[float, float]:
        """(boot, worker) seconds added where ``workers`` worker processes start beside the next boot."""
        scale = workers / self.workers
        return self.boot_extra_s * scale, self.worker_extra_s * scale

    def serial(self, boot: np.ndarray, workers: int) -> tuple[np.ndarray, np.ndarray]:
        """Instances started one after another (``boot``: samples × instances, in order), each with ``workers``
        worker processes: every boot after the first overlaps the workers of the one before. Returns the boots and
        the seconds each instance's ready time gains (all but the last: their workers overlap the next boot)."""
        boot_extra, worker_extra = self.extras(workers)
        k = boot.shape[-1]
        later = np.full(k, boot_extra)
        gained = np.full(k, worker_extra)
        if k:
            later[0], gained[-1] = 0.0, 0.0
        return boot + later, gained


@dataclass(frozen=True)
class TuneStart:
    """Ray Tune's trial start (profile ``tune_trial_start``): ``start_s`` alone (the mean serial gap), the lognormal
    spread ``sigma`` of those gaps, and ``lanes_per_core``: how many starts progress at full speed per core of the
    host they share, from the concurrent stream (``concurrent`` starts that took ``T`` each against ``start_s`` alone
    ran on ``concurrent × start_s / T`` lanes, by processor sharing; never fewer than one, never more than were
    started). A start is mostly a new process's interpreter and imports, so its lanes scale with the cores.
    ``busy_s``: what a start takes on top amid other trials' results and ends (Tune's driver loop handles them
    between a trial's end and the next one's start), holding no core."""

    start_s: float
    sigma: float
    lanes_per_core: float
    #: The cores of the machine it was measured on (the local cloud's instances share them).
    host_cores: int
    #: Seconds a start takes on top amid other trials (0: profiles before the busy stream).
    busy_s: float = 0.0

    def lanes(self, cores: float) -> float:
        """Start lanes on ``cores`` cores (at least one)."""
        return max(1.0, self.lanes_per_core * cores)


@dataclass(frozen=True)
class PerformanceModel:
    """Everything the simulator needs to time and cost a trial shape; pure and immutable."""

    dataset_size: int
    batch_size_per_worker: int
    restart_overhead_s: float
    checkpoint_size_gb: float
    eval_time_s: float
    reference_device: str
    devices: dict[str, DeviceModel]
    straggler_sigma: float
    startup_by_type: dict[tuple[str, str], StartupModel] = field(default_factory=dict)
    startup_by_cloud: dict[str, StartupModel] = field(default_factory=dict)
    transfer_gb_per_s: float = TRANSFER_GB_PER_S
    epoch_overhead_s: float = 0.0
    task_start_s: float = 0.0
    worker_start_s: float = 0.0
    #: One checkpoint save, part of ``epoch_overhead_s`` (which has one per epoch); 0: not measured.
    checkpoint_save_s: float = 0.0
    termination_by_type: dict[tuple[str, str], StartupModel] = field(default_factory=dict)
    termination_by_cloud: dict[str, StartupModel] = field(default_factory=dict)
    #: Per-epoch noise and per-configuration speed (none: every configuration as fast as the profiled one).
    variation: Variation = field(default_factory=Variation)
    #: Measured starts of the run's head per cloud where it boots before any instance (profile ``head_startup``).
    head_startup_by_cloud: dict[str, StartupModel] = field(default_factory=dict)
    #: Measured contention of overlapping start-ups per shared-host cloud (profile ``startup_overlap``).
    start_overlap_by_cloud: dict[str, StartOverlap] = field(default_factory=dict)
    #: Ray Tune's own trial start, for the ASHA baseline (profile ``tune_trial_start``); None: not measured.
    tune_start: TuneStart | None = None

    # -- latency ---------------------------------------------------------------------------
    def plannable(self, device: str) -> bool:
        return device in self.devices

    def require(self, device: str) -> DeviceModel:
        try:
            return self.devices[device]
        except KeyError:
            raise ProfileError(
                f"device {device!r} was neither measured nor given a device_speed in the "
                f"profile; add profile field device_speed.{device} (relative to "
                f"{self.reference_device}) or restrict resources.instance_types"
            ) from None

    def iterations_per_epoch(self, workers: int) -> int:
        global_batch = self.batch_size_per_worker * workers
        return max(1, -(-self.dataset_size // global_batch))

    def iteration_time(self, device: str, workers: int, nodes: int) -> float:
        return self.require(device).t_iter(self.batch_size_per_worker, workers, nodes)

    def epoch_time(self, device: str, workers: int, nodes: int) -> float:
        """Median seconds for one epoch of one trial with ``workers`` data-parallel workers."""
        return self.iterations_per_epoch(workers) * self.iteration_time(device, workers, nodes)

    def transfer_time(self) -> float:
        return self.checkpoint_size_gb / self.transfer_gb_per_s if self.transfer_gb_per_s > 0 else 0.0

    def task_overhead(self, epochs: int, moved: bool, checkpoint_every: int = 1) -> float:
        """Seconds of one task outside its timed iterations (not slowed by stragglers).

        ``epochs`` × the per-epoch overhead, the evaluation pass, and the start of the run: on
        warm workers (``task_start_s``) or, when the trial's placement changed at this promotion,
        the measured restart overhead plus the checkpoint transfer. ``checkpoint_every`` > 1: a checkpoint
        every that many epochs (and at the task's last), so the other epochs' saves are not paid.
        """
        start = self.restart_overhead_s + self.transfer_time() if moved else self.task_start_s
        save = min(self.checkpoint_save_s, self.epoch_overhead_s)
        saves = -(-epochs // max(1, checkpoint_every))
        return epochs * (self.epoch_overhead_s - save) + saves * save + self.eval_time_s + start

    # -- start-up --------------------------------------------------------------------------
    def startup(self, cloud: str, instance_type: str) -> StartupModel:
        """Seconds from a provisioning request until the instance can run a worker."""
        measured = _measured(self.startup_by_type, self.startup_by_cloud, cloud, instance_type)
        return measured or _documented(facts_or_like(cloud).startup_s, cloud, "typical boot + Ray join")

    def head_start(self, cloud: str, instance_type: str) -> StartupModel:
        """Seconds from a run's start until its head takes nodes, where the head boots before any instance: as
        measured (the profile's ``head_startup``), else one ``instance_type`` node's start-up stands in."""
        return self.head_startup_by_cloud.get(cloud) or self.startup(cloud, instance_type)

    def head_wait_s(self, cloud: str, instance_type: str) -> float:
        """Seconds from a fresh run's start until it requests its first instances: where the run's Ray head comes
        up before any instance (a cloud whose head boots first: local), its start's median (:meth:`head_start`);
        elsewhere 0 (the head is up before the run starts, or is the instances' own). The one figure the
        simulator, the ASHA simulator, the plan (``Plan.head_start_s``) and the simulated cloud use."""
        if not facts_or_like(cloud).head_boots_first:
            return 0.0
        return self.head_start(cloud, instance_type).quantile(0.5)

    def start_overlap(self, cloud: str) -> StartOverlap | None:
        """The measured contention of start-ups overlapping on ``cloud``'s shared host; None: not measured (taken
        as independent)."""
        return self.start_overlap_by_cloud.get(cloud)

    def termination(self, cloud: str, instance_type: str) -> StartupModel:
        """Seconds from a terminate request until the instance is gone (and no longer billed)."""
        measured = _measured(self.termination_by_type, self.termination_by_cloud, cloud, instance_type)
        return measured or _documented(facts_or_like(cloud).termination_s, cloud, "terminate request until gone")

    def describe(self) -> dict[str, Any]:
        """Fitted parameters as plain data (stored as ``profile.fitted`` for inspection)."""
        return {
            "model": "pollux",
            "reference_device": self.reference_device,
            "batch_size_per_worker": self.batch_size_per_worker,
            "straggler_sigma": round(self.straggler_sigma, 6),
            "epoch_overhead_s": self.epoch_overhead_s,
            "task_start_s": self.task_start_s,
            "worker_start_s": self.worker_start_s,
            "variation": self.variation.describe(),
            "devices": {
                name: {
                    "alpha_grad": d.alpha_grad,
                    "beta_grad": d.beta_grad,
                    "alpha_sync_node": d.alpha_sync_node,
                    "beta_sync_node": d.beta_sync_node,
                    "alpha_sync_cross": d.alpha_sync_cross,
                    "beta_sync_cross": d.beta_sync_cross,
                    "gamma": d.gamma,
                    "source": d.source,
                    "points": d.points,
                    "rms_log_error": d.rms_log_error,
                    **({"fit_key": d.fit_key} if d.fit_key else {}),
                }
                for name, d in sorted(self.devices.items())
            },
            "startup": {
                **{
                    f"{c}:{t}": {"median_s": m.quantile(0.5), "n": len(m.samples_s), "source": m.source}
                    for (c, t), m in sorted(self.startup_by_type.items())
                },
                **{
                    c: {"median_s": m.quantile(0.5), "n": len(m.samples_s), "source": m.source}
                    for c, m in sorted(self.startup_by_cloud.items())
                },
            },
            "head_startup": {
                c: {"median_s": m.quantile(0.5), "n": len(m.samples_s), "source": m.source}
                for c, m in sorted(self.head_startup_by_cloud.items())
            },
            "start_overlap": {
                c: {"workers": o.workers, "boot_extra_s": o.boot_extra_s, "worker_extra_s": o.worker_extra_s}
                for c, o in sorted(self.start_overlap_by_cloud.items())
            },
            "tune_start": None
            if self.tune_start is None
            else {
                "start_s": round(self.tune_start.start_s, 4),
                "sigma": round(self.tune_start.sigma, 4),
                "lanes_per_core": round(self.tune_start.lanes_per_core, 4),
                "busy_s": round(self.tune_start.busy_s, 4),
                "host_cores": self.tune_start.host_cores,
            },
            "termination": {
                **{
                    f"{c}:{t}": {"median_s": m.quantile(0.5), "n": len(m.samples_s), "source": m.source}
                    for (c, t), m in sorted(self.termination_by_type.items())
                },
                **{
                    c: {"median_s": m.quantile(0.5), "n": len(m.samples_s), "source": m.source}
                    for c, m in sorted(self.termination_by_cloud.items())
                },
            },
        }


# -- fitting --------------------------------------------------------------------------------


def _steady(latencies: list[float]) -> np.ndarray:
    """Latencies with warm-up iterations dropped (first 10%, at least one when there are ≥ 5)."""
    values = np.asarray(latencies, dtype=float)
    if len(values) >= 5:
        values = values[max(1, len(values) // 10) :]
    return values


def fit_key(points: list[tuple[int, int, int, float]]) -> str:
    """What one device's fit depends on, digested: its (batch, workers, nodes, median latency) points, the priors and
    :data:`_FIT_VERSION`. A fit stored in ``profile.fitted`` under the same key is the fit these points give."""
    payload = [_FIT_VERSION, _PRIOR_REL, _PRIOR_GAMMA, _PRIOR_WEIGHT, [[b, w, n, repr(lat)] for b, w, n, lat in points]]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _stored_fit(entry: Any, key: str) -> DeviceModel | None:
    """The device fit ``profile.fitted`` holds for these points (``key``), or None: absent, made from other points
    (the profile changed since), or not a fit."""
    if not isinstance(entry, dict) or entry.get("fit_key") != key or entry.get("source") != "fitted":
        return None
    try:
        params = {name: float(entry[name]) for name in _DEVICE_PARAMS}
        points, rms = int(entry["points"]), float(entry["rms_log_error"])
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(x) and x >= 0 for x in params.values()) or params["gamma"] < 1.0:
        return None
    return DeviceModel(**params, source="fitted", points=points, rms_log_error=rms, fit_key=key)


def _fit_device(points: list[tuple[int, int, int, float]]) -> DeviceModel:
    """Fit Pollux parameters to (batch, workers, nodes, median latency) points of one device.

    scipy.optimize is imported here, not with the module: it takes ~0.4 s, and a profile written by rubberband
    carries its fit (``fit_key``), so planning from it does not fit again."""
    from scipy.optimize import least_squares

    batches = {b for b, _, _, _ in points}
    single = [lat for b, w, n, lat in points if w == 1]
    base = float(np.median(single)) if single else min(lat for *_, lat in points) * 0.8
    fit_beta_grad = len(batches) > 1
    priors = np.log([base * _PRIOR_REL[k] for k in ("a1", "b1", "aN", "bN")] + [_PRIOR_GAMMA - 1.0])

    def unpack(theta: np.ndarray) -> tuple[float, float, float, float, float, float, float]:
        a_g = math.exp(theta[0])
        b_g = math.exp(theta[1]) if fit_beta_grad else 0.0
        a1, b1, an, bn = (math.exp(x) for x in theta[2:6])
        gamma = 1.0 + math.exp(theta[6])
        return a_g, b_g, a1, b1, an, bn, gamma

    def model(theta: np.ndarray) -> DeviceModel:
        return DeviceModel(*unpack(theta))

    def residuals(theta: np.ndarray) -> np.ndarray:
        d = model(theta)
        r = [math.log(d.t_iter(b, w, n)) - math.log(lat) for b, w, n, lat in points]
        prior = _PRIOR_WEIGHT * (theta[2:7] - priors)
        extra = [_PRIOR_WEIGHT * (theta[1] - math.log(base / max(batches) * 0.1))] if fit_beta_grad else [0.0]
        return np.concatenate([np.asarray(r), prior, np.asarray(extra)])

    theta0 = np.concatenate([[math.log(base)], [math.log(base / max(batches) * 0.1) if fit_beta_grad else 0.0], priors])
    lower = np.full(7, -25.0)
    upper = np.full(7, 10.0)
    upper[6] = math.log(20.0)  # γ ≤ 21
    lower[6] = math.log(1e-3)
    theta0 = np.clip(theta0, lower + 1e-9, upper - 1e-9)
    result = least_squares(residuals, theta0, bounds=(lower, upper), method="trf", x_scale=1.0)
    fitted = model(result.x)
    errors = [math.log(fitted.t_iter(b, w, n)) - math.log(lat) for b, w, n, lat in points]
    return DeviceModel(
        *unpack(result.x),
        source="fitted",
        points=len(points),
        rms_log_error=float(np.sqrt(np.mean(np.square(errors)))),
        fit_key=fit_key(points),
    )


def _sigma(profile: Profile) -> float:
    """Robust per-node slowdown σ: median over shapes of 1.4826·MAD(log latency)."""
    spreads = []
    for m in profile.measurements:
        values = np.log(_steady(m.iteration_latencies_s))
        if len(values) >= 3:
            spreads.append(1.4826 * float(np.median(np.abs(values - np.median(values)))))
    return float(min(MAX_SIGMA, np.median(spreads))) if spreads else 0.0


def fit_performance_model(profile: Profile) -> PerformanceModel:
    """Fit the performance model of a profile (pure; raises ProfileError if nothing is usable)."""
    by_device: dict[str, list[tuple[int, int, int, float]]] = {}
    batch = profile.workload.batch_size_per_worker
    for m in profile.measurements:
        latency = float(np.median(_steady(m.iteration_latencies_s)))
        by_device.setdefault(m.device, []).append((batch, m.workers, m.nodes, latency))
    stored = (profile.fitted or {}).get("devices") or {}
    devices = {
        name: _stored_fit(stored.get(name), fit_key(points)) or _fit_device(points)
        for name, points in sorted(by_device.items())
    }
    reference = profile.reference_device or (sorted(by_device)[0] if len(by_device) == 1 else None)
    if reference is None:
        reference = max(by_device, key=lambda d: len(by_device[d]))
    if profile.device_speed and reference not in devices:
        raise ProfileError(
            f"profile field 'reference_device': {reference!r} has no measurements; "
            f"measure it or name a measured device ({', '.join(sorted(devices))})"
        )
    ref_speed = profile.device_speed.get(reference, 1.0)
    for name, speed in profile.device_speed.items():
        if name not in devices:
            devices[name] = devices[reference].scaled(speed / ref_speed, reference)
    variation = _variation(profile, devices, batch)
    startup_by_type, startup_by_cloud = _latency_models(profile.startup)
    termination_by_type, termination_by_cloud = _latency_models(profile.termination)
    _, head_startup_by_cloud = _latency_models(profile.head_startup)
    start_overlap_by_cloud = _start_overlaps(profile)
    return PerformanceModel(
        dataset_size=profile.workload.dataset_size,
        batch_size_per_worker=batch,
        restart_overhead_s=profile.workload.restart_overhead_s,
        checkpoint_size_gb=profile.workload.checkpoint_size_gb,
        eval_time_s=profile.workload.eval_time_s,
        reference_device=reference,
        devices=devices,
        straggler_sigma=_sigma(profile),
        startup_by_type=startup_by_type,
        startup_by_cloud=startup_by_cloud,
        epoch_overhead_s=profile.workload.epoch_overhead_s,
        task_start_s=profile.workload.task_start_s,
        worker_start_s=profile.workload.worker_start_s,
        checkpoint_save_s=profile.workload.checkpoint_save_s,
        termination_by_type=termination_by_type,
        termination_by_cloud=termination_by_cloud,
        variation=variation,
        head_startup_by_cloud=head_startup_by_cloud,
        start_overlap_by_cloud=start_overlap_by_cloud,
        tune_start=_tune_start(profile),
    )


def _tune_start(profile: Profile) -> TuneStart | None:
    """Ray Tune's trial start from the profile's measurement (None where it has none)."""
    return None if profile.tune_trial_start is None else tune_start_model(profile.tune_trial_start)


def tune_start_model(m: TuneTrialStart) -> TuneStart:
    """Ray Tune's trial start as the ASHA simulator plays it, from the profiler's measurement: the serial gaps give
    a start alone and its spread, the concurrent stream the start lanes, and the busy stream (trials that train a
    moment before they report, ``busy_concurrent`` at once) what a start takes on top amid other trials: its mean
    gap less what its starts take on the lanes alone (``start_s × max(1, busy_concurrent / lanes)``), never
    below 0."""
    alone = float(np.mean(m.serial_s))
    together = float(np.mean(m.concurrent_s))
    lanes = min(float(m.concurrent), max(1.0, m.concurrent * alone / together))
    busy = 0.0
    if m.busy_concurrent is not None and m.busy_concurrent_s is not None:
        busy = max(0.0, float(np.mean(m.busy_concurrent_s)) - alone * max(1.0, m.busy_concurrent / lanes))
    logs = np.log(m.serial_s)
    return TuneStart(
        start_s=alone,
        sigma=float(np.std(logs)) if len(logs) > 1 else 0.0,
        lanes_per_core=lanes / m.host_cores,
        host_cores=m.host_cores,
        busy_s=busy,
    )


def _start_overlaps(profile: Profile) -> dict[str, StartOverlap]:
    """Per cloud, the median extra seconds overlapping start-ups took over the same starts alone (never
    negative: an overlapped start measured faster than alone is noise, not a speed-up)."""
    by_cloud: dict[str, list] = {}
    for o in profile.startup_overlap:
        by_cloud.setdefault(o.cloud, []).append(o)
    return {
        cloud: StartOverlap(
            workers=int(np.median([o.workers for o in found])),
            boot_extra_s=max(0.0, float(np.median([o.boot_overlapped_s - o.boot_alone_s for o in found]))),
            worker_extra_s=max(0.0, float(np.median([o.workers_overlapped_s - o.workers_alone_s for o in found]))),
        )
        for cloud, found in by_cloud.items()
    }


def _variation(profile: Profile, devices: dict[str, DeviceModel], batch: int) -> Variation:
    """Per-epoch and per-configuration variation from the profile's whole-epoch times.

    Each configuration's epochs are compared with this model's time for such an epoch (its
    iterations at its shape plus the per-epoch overhead), so the configuration speed is relative
    to what the simulator assumes for every trial.
    """
    usable = [m for m in profile.epoch_measurements if m.device in devices]
    if not usable:
        return Variation()
    predicted = [
        m.iterations_per_epoch * devices[m.device].t_iter(batch, m.workers, m.nodes) + profile.workload.epoch_overhead_s
        for m in usable
    ]
    return fit_variation(
        [m.epoch_times_s for m in usable],
        predicted,
        [m.quality for m in usable],
        groups=[m.run_id or "" for m in usable],
    )


def _latency_models(entries: list) -> tuple[dict[tuple[str, str], StartupModel], dict[str, StartupModel]]:
    """Empirical latency models (start-up or termination samples) per (cloud, type) and per cloud."""
    by_type: dict[tuple[str, str], list[float]] = {}
    by_cloud: dict[str, list[float]] = {}
    type_source: dict[tuple[str, str], str] = {}
    cloud_source: dict[str, str] = {}
    typed_by_cloud: dict[str, list[float]] = {}
    for s in entries:
        if s.instance_type:
            by_type.setdefault((s.cloud, s.instance_type), []).extend(s.samples_s)
            type_source[(s.cloud, s.instance_type)] = s.source
            typed_by_cloud.setdefault(s.cloud, []).extend(s.samples_s)
        else:
            by_cloud.setdefault(s.cloud, []).extend(s.samples_s)
            cloud_source[s.cloud] = s.source
    # A cloud's other types behave like the types measured there: better than documented defaults.
    for cloud, samples in typed_by_cloud.items():
        if cloud not in by_cloud:
            by_cloud[cloud] = samples
            cloud_source[cloud] = "measured on other types of this cloud"
    return (
        {k: StartupModel(tuple(sorted(v)), type_source[k]) for k, v in by_type.items()},
        {k: StartupModel(tuple(sorted(v)), cloud_source[k]) for k, v in by_cloud.items()},
    )


def _measured(
    by_type: dict[tuple[str, str], StartupModel], by_cloud: dict[str, StartupModel], cloud: str, instance_type: str
) -> StartupModel | None:
    """A latency's measured samples for the type, else for its cloud (None: neither was measured)."""
    return by_type.get((cloud, instance_type)) or by_cloud.get(cloud)


def _documented(default: tuple[float, ...], cloud: str, what: str) -> StartupModel:
    """The documented default of a latency (``what`` it spans; catalogs/clouds.yaml), marked as such."""
    return StartupModel(tuple(sorted(default)), f"default ({cloud}: {what})")
