"""Assemble a :class:`~rubberband.profile.Profile` from what a profile run measured.

Every figure gets its source (measured, and how; given; or a documented default where nothing was measured), the
workload's batch and dataset sizes are read from the options, the spec or what the training was given, and the
planner's fitted model is described beside the measurements (``profile.fitted``) where the planner is installed.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any

import numpy as np

from rubberband.clouds import CLOUDS
from rubberband.errors import InputError, RubberbandError
from rubberband.profile import PROFILE_SCHEMA_VERSION, LatencyMeasurement, Profile, StartupSamples, Workload
from rubberband.profiler.machine import machine_info
from rubberband.profiler.measured import Measured, ProfileOptions, ShapeResult
from rubberband.spec import JobSpec


def workload_sizes(
    spec: JobSpec, options: ProfileOptions, results: list[ShapeResult], sources: dict[str, str]
) -> tuple[int, int]:
    """(dataset size, per-worker batch size): given (options), from the spec's config, or read off what the
    training was given; ``sources`` records which. Neither known: InputError saying what to set."""
    measured = [r for r in results if not r.skipped]
    if options.batch_size is not None:
        batch, sources["batch_size_per_worker"] = options.batch_size, "given: --batch-size"
    elif isinstance(spec.config.get("batch_size"), int) and spec.config["batch_size"] > 0:
        batch, sources["batch_size_per_worker"] = int(spec.config["batch_size"]), "spec: config.batch_size"
    else:
        seen = [r.batch_size_seen for r in measured if r.batch_size_seen]
        if not seen:
            raise InputError(
                "cannot tell the per-worker batch size (the batches are not tensors): set "
                "config.batch_size in the spec or pass --batch-size"
            )
        batch = max(seen)
        sources["batch_size_per_worker"] = "measured: first dimension of the first batch given to ctx.batches"
    if options.dataset_size is not None:
        size, sources["dataset_size"] = options.dataset_size, "given: --dataset-size"
    elif isinstance(spec.config.get("dataset_size"), int) and spec.config["dataset_size"] > 0:
        size, sources["dataset_size"] = int(spec.config["dataset_size"]), "spec: config.dataset_size"
    else:
        lengths = [(r.shape.workers, r.pass_lengths[0]) for r in measured if r.pass_lengths and r.pass_lengths[0]]
        if not lengths:
            raise InputError(
                "cannot tell the dataset size (ctx.batches got an iterable without len()): set "
                "config.dataset_size in the spec or pass --dataset-size"
            )
        workers, length = min(lengths)
        size = length * batch * workers
        sources["dataset_size"] = (
            f"measured: len() of the iterable given to ctx.batches ({length} iterations "
            f"at {workers} worker{'s' if workers > 1 else ''}) × batch size × workers"
        )
    return size, batch


def build_profile(
    spec: JobSpec, options: ProfileOptions, config: dict, notes: list[str], measured: Measured
) -> Profile:
    """The :class:`~rubberband.profile.Profile` of ``measured``: every figure with its source, documented defaults
    for what was not measured, and the fitted model's description (``notes`` gets what could not be done)."""
    results, startup, termination = measured.shapes, measured.startup, measured.termination
    warm, cold, epochs = measured.warm, measured.cold, measured.epochs
    it = options.instance_type
    info = machine_info()
    # what the workers really used (a GPU type's profile is taken on GPUs: one per worker, nccl)
    used = sorted(
        {
            f"{r.backend} on {'one GPU per worker' if r.device.startswith('cuda') else r.device}"
            for r in results
            if not r.skipped and r.backend
        }
    ) or [options.device.backend]
    sources: dict[str, str] = {
        "iteration_latencies": f"measured: every iteration of ctx.batches on rank 0, ≤ {options.iterations} per "
        f"shape, real DDP ({', '.join(used)}) on {options.cloud} Ray nodes",
        "config": json.dumps(config, sort_keys=True, default=str),
    }
    dataset_size, batch = workload_sizes(spec, options, results, sources)
    workload: dict[str, Any] = {
        "name": spec.name,
        "dataset_size": dataset_size,
        "batch_size_per_worker": batch,
        "origin": f"measured by `rubberband profile` on {info['hostname']} "
        f"({options.cloud} {it.name}, {info['cpu_model']})",
    }
    chosen = warm or cold
    if chosen is not None:
        workload["restart_overhead_s"] = round(chosen.overhead_s, 4)
        if chosen.save_s is not None:
            workload["checkpoint_save_s"] = round(chosen.save_s, 4)
            sources["checkpoint_save_s"] = "measured: the checkpoint save before the restart (ctx.save_checkpoint)"
        how = "warm worker processes (WorkerPool)" if chosen is warm else "fresh worker processes"
        sources["restart_overhead_s"] = (
            f"measured: checkpoint save at {chosen.source_shape.workers} workers → "
            f"restart at {chosen.target_shape.workers} with {how} → first iteration"
        )
        if chosen.checkpoint_bytes is not None:
            workload["checkpoint_size_gb"] = chosen.checkpoint_bytes / 1e9
            sources["checkpoint_size_gb"] = "measured: size of the checkpoint file train() saved"
    else:
        sources["restart_overhead_s"] = "default: not measured"
    if cold is not None and warm is not None:
        workload["restart_overhead_cold_s"] = round(cold.overhead_s, 4)
        sources["restart_overhead_cold_s"] = "measured: as restart_overhead_s, with fresh worker processes"
        workload["worker_start_s"] = round(max(0.0, cold.start_s - warm.start_s), 4)
        sources["worker_start_s"] = (
            "measured: the restart's start → first iteration with fresh worker processes "
            "minus with warm ones (process start, torch and training-module import)"
        )
    else:
        sources["worker_start_s"] = "default: not measured"
    if warm is not None:
        workload["task_start_s"] = round(warm.start_s, 4)
        sources["task_start_s"] = (
            "measured: warm worker processes, run start → first iteration (process group, "
            "the training function's set-up, checkpoint load)"
        )
    else:
        sources["task_start_s"] = "default: not measured"
    gaps = [g for r in results if not r.skipped for g in r.epoch_gaps_s]
    if gaps:
        workload["epoch_overhead_s"] = round(float(np.median(gaps)), 4)
        sources["epoch_overhead_s"] = (
            f"measured: median gap between two epochs' passes over ctx.batches "
            f"(evaluation, data loading, report, checkpoint save), {len(gaps)} shapes"
        )
    else:
        sources["epoch_overhead_s"] = "default: not measured (too few iterations per shape for two epochs)"
    sources.setdefault("checkpoint_size_gb", "default: not measured")
    sources.setdefault("checkpoint_save_s", "default: not measured")
    if epochs:
        m = epochs[0]
        sources["epoch_measurements"] = (
            f"measured: {len(epochs)} configurations sampled from the search space, "
            f"{len(m.epoch_times_s)} epochs each after a warm-up epoch, "
            f"{m.iterations_per_epoch} iterations per epoch at {m.workers} worker"
            f"{'s' if m.workers > 1 else ''}; start of one pass over ctx.batches to "
            f"the start of the next"
        )
    else:
        sources["epoch_measurements"] = (
            "not measured (--configs 0 or no budget left): the planner assumes "
            "every configuration as fast as the profiled one and no per-epoch noise"
        )
    sources["eval_time_s"] = "not measured separately: per-epoch evaluation is part of epoch_overhead_s"
    measured_clouds = {s.cloud for s in startup}
    for cloud in sorted(set(spec.resources.clouds) | {options.cloud}):
        if cloud not in measured_clouds and cloud in CLOUDS:
            startup.append(StartupSamples(cloud=cloud, samples_s=list(CLOUDS[cloud].startup_s), source="default"))
    sources["startup"] = (
        "measured: `ray start` node request → registered with the run head (LocalProvider)"
        if measured_clouds
        else "default: documented per-cloud figures (docs/profiling.md)"
    )
    if measured.overlap:
        sources["startup_overlap"] = (
            "measured: a node's WorkerPool workers starting while the next node boots (as a run's serial "
            "provisioning overlaps them), against the same starts alone"
        )
    if measured.tune_start is not None:
        sources["tune_trial_start"] = (
            f"measured with Ray Tune {measured.tune_start.ray_version}: trials one after another, then a stream "
            f"keeping {measured.tune_start.concurrent} starting at once on {measured.tune_start.host_cores} cores"
        )
    sources["termination"] = (
        "measured: terminate request to a start-up probe node → its processes gone "
        "(LocalProvider: SIGTERM, SIGKILL after the grace)"
        if termination
        else "default: documented per-cloud figures (docs/profiling.md)"
    )
    import torch

    profile = Profile(
        schema_version=PROFILE_SCHEMA_VERSION,
        workload=Workload(**workload),
        measurements=[
            LatencyMeasurement(
                device=it.device,
                instance_type=it.name,
                workers=r.shape.workers,
                nodes=r.shape.nodes,
                iteration_latencies_s=[round(x, 6) for x in r.latencies_s],
                source="measured",
            )
            for r in results
            if not r.skipped
        ],
        epoch_measurements=list(epochs or []),
        startup=startup,
        termination=list(termination or []),
        head_startup=list(measured.head_startup or []),
        startup_overlap=list(measured.overlap or []),
        tune_trial_start=measured.tune_start,
        machine=info,
        torch_version=torch.__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        sources=sources,
    )
    fitted = fit_description(profile, notes)
    return profile.model_copy(update={"fitted": fitted}) if fitted is not None else profile


def fit_description(profile: Profile, notes: list[str]) -> dict[str, Any] | None:
    """The planner's fitted model, described, if the planner is installed (it does the fitting)."""
    try:
        from rubberband.planner.model import fit_performance_model
    except ImportError:
        notes.append("the planner's performance model is not installed; profile.fitted left empty")
        return None
    try:
        described = fit_performance_model(profile).describe()
        return json.loads(json.dumps(described, default=_jsonable))
    except (RubberbandError, ValueError, TypeError) as exc:
        notes.append(f"fitting the performance model failed ({type(exc).__name__}: {exc}); profile.fitted left empty")
        return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
