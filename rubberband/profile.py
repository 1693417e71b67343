"""The profile: measured training latencies, epoch times and instance startup latencies (schema v2).

A profile is what ``rubberband profile`` writes and what the planner's performance
model is fitted from. It is plain JSON; ``docs/profile.md`` documents every field.

Iteration latencies are recorded per device (``V100``, ``CPU``...), per trial width
(data-parallel workers) and per node span (how many instances the trial's workers are
spread over). Devices that were not measured may be given a relative speed in
``device_speed`` (1.0 = the reference device) so the planner can still consider them.

Schema v2 adds ``epoch_measurements``: whole-epoch times of several configurations sampled from
the search space, from which the planner fits per-epoch noise and the spread of configuration
speed. A v1 profile loads as v2 without them (the planner then assumes no such variation, and
says so in ``fitted.variation.source``).
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rubberband.errors import ProfileError
from rubberband.versioned import DocumentSchema, read_json, validate_versioned
from rubberband.files import write_text_atomic

PROFILE_SCHEMA_VERSION = 2
#: Versions this rubberband reads (v1: no ``epoch_measurements``).
PROFILE_SCHEMA_VERSIONS = (1, 2)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Workload(_Model):
    """What was trained: sizes that turn iteration latency into epoch time."""

    name: str
    origin: str = Field(description="how the figures were obtained (measured where, or modelled on what)")
    dataset_size: int = Field(gt=0, description="training samples per epoch")
    batch_size_per_worker: int = Field(gt=0)
    checkpoint_size_gb: float = Field(default=0.1, ge=0)
    restart_overhead_s: float = Field(
        default=5.0, ge=0, description="checkpoint save + new workers + restore, per resize"
    )
    eval_time_s: float = Field(default=0.0, ge=0, description="validation pass after each stage")
    epoch_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="per epoch, the trial's time outside the timed iterations: evaluation, "
        "data loading, reporting, checkpoint save",
    )
    task_start_s: float = Field(
        default=0.0,
        ge=0,
        description="per trial run on warm worker processes: process-group init and the "
        "user's code up to the first iteration (model build, data, checkpoint load)",
    )
    checkpoint_save_s: float = Field(
        default=0.0,
        ge=0,
        description="one checkpoint save (ctx.save_checkpoint), part of epoch_overhead_s where train() saves "
        "each epoch: what a longer checkpoint interval saves on spot (0: not measured)",
    )
    worker_start_s: float = Field(
        default=0.0,
        ge=0,
        description="a new instance's worker processes starting (process start + framework "
        "import) after it joined; its first trial waits for them",
    )
    restart_overhead_cold_s: float | None = Field(
        default=None,
        ge=0,
        description="restart_overhead_s when the new workers are fresh processes "
        "(restart_overhead_s itself may reuse warm worker processes)",
    )

    def iterations_per_epoch(self, workers: int) -> int:
        global_batch = self.batch_size_per_worker * workers
        return max(1, -(-self.dataset_size // global_batch))


class LatencyMeasurement(_Model):
    """Iteration latencies of one trial shape: device × workers × node span."""

    device: str
    instance_type: str | None = None
    workers: int = Field(ge=1)
    nodes: int = Field(default=1, ge=1)
    iteration_latencies_s: list[float] = Field(min_length=1)
    source: Literal["measured", "modelled"] = "measured"

    @model_validator(mode="after")
    def _check(self) -> "LatencyMeasurement":
        if self.nodes > self.workers:
            raise ValueError("nodes cannot exceed workers")
        if any(not (x > 0) for x in self.iteration_latencies_s):
            raise ValueError("iteration latencies must be positive seconds")
        return self


class EpochMeasurement(_Model):
    """Whole-epoch times (training + evaluation + report + checkpoint) of one sampled configuration."""

    config: dict[str, Any] = Field(default_factory=dict, description="the hyperparameters sampled")
    device: str
    instance_type: str | None = None
    workers: int = Field(default=1, ge=1)
    nodes: int = Field(default=1, ge=1)
    iterations_per_epoch: int = Field(
        ge=1, description="iterations each timed epoch ran (capped epochs: fewer than the dataset's)"
    )
    epoch_times_s: list[float] = Field(min_length=1, description="seconds per epoch, first epoch (warm-up) excluded")
    quality: float | None = Field(
        default=None,
        description="the configuration's score after its timed epochs, oriented so that higher is better (the "
        "spec's metric, negated when it is minimised): what promotion ranks by, fitted against its speed",
    )
    source: Literal["measured", "modelled"] = "measured"
    run_id: str | None = Field(
        default=None,
        description="the real run whose first stage timed this configuration (`rubberband profile --from-run`); "
        "absent: the profiler sampled it. Scores are ranked against speed within one run or the profiler's set",
    )

    @model_validator(mode="after")
    def _check(self) -> "EpochMeasurement":
        if self.nodes > self.workers:
            raise ValueError("nodes cannot exceed workers")
        if any(not (x > 0) for x in self.epoch_times_s):
            raise ValueError("epoch times must be positive seconds")
        if self.quality is not None and not math.isfinite(self.quality):
            raise ValueError("quality must be a finite number (or absent)")
        return self


class StartupSamples(_Model):
    """Seconds from provisioning request to 'ready to run a worker', per cloud (and type)."""

    cloud: str
    instance_type: str | None = Field(default=None, description="None: any type of that cloud")
    samples_s: list[float] = Field(min_length=1)
    source: Literal["measured", "default"] = "measured"

    @model_validator(mode="after")
    def _check(self) -> "StartupSamples":
        if any(x < 0 for x in self.samples_s):
            raise ValueError("startup samples must be non-negative seconds")
        return self


class TerminationSamples(_Model):
    """Seconds from the terminate request until the instance is gone (billing runs until then)."""

    cloud: str
    instance_type: str | None = Field(default=None, description="None: any type of that cloud")
    samples_s: list[float] = Field(min_length=1)
    source: Literal["measured", "default"] = "measured"

    @model_validator(mode="after")
    def _check(self) -> "TerminationSamples":
        if any(x < 0 for x in self.samples_s):
            raise ValueError("termination samples must be non-negative seconds")
        return self


class StartupOverlap(_Model):
    """Start-ups that overlap on one host (the local cloud, whose instances share this machine's cores): an
    instance's worker processes starting while the next instance boots, as a run's serial provisioning overlaps
    them, each timed against the same start alone. The planner adds the differences to the overlapped starts."""

    cloud: str
    instance_type: str
    workers: int = Field(ge=1, description="worker processes started on the first instance")
    boot_alone_s: float = Field(ge=0)
    boot_overlapped_s: float = Field(ge=0, description="the next instance's boot while those workers start")
    workers_alone_s: float = Field(ge=0)
    workers_overlapped_s: float = Field(ge=0, description="the first instance's workers while the next boots")
    source: Literal["measured"] = "measured"


class TuneTrialStart(_Model):
    """Ray Tune's trial start, as ASHA on a fixed Ray Tune cluster pays it (the plan's ASHA baseline): with Tune's
    default ``reuse_actors=False`` every trial is a new actor, a new worker process whose interpreter and imports
    run on the host's cores, started by Tune's driver loop. Measured with Ray Tune itself on the profiling machine:
    trials one after another (each start alone), then a stream of trials keeping ``concurrent`` CPUs starting."""

    serial_s: list[float] = Field(
        min_length=1, description="seconds from one trial's end to the next trial's start, one trial at a time"
    )
    concurrent: int = Field(ge=2, description="trials starting at once in the concurrent stream")
    concurrent_s: list[float] = Field(
        min_length=1,
        description="seconds from a trial's end to the start of the trial taking its CPU, while ``concurrent`` start",
    )
    host_cores: int = Field(ge=1, description="the profiling machine's cores the starts shared")
    ray_version: str
    source: Literal["measured"] = "measured"
    busy_concurrent: int | None = Field(
        default=None,
        ge=1,
        description="trials at once in a stream whose trials train a moment before they report (the host's "
        "cores); absent: not measured (profiles before it), and a start is its CPU work only",
    )
    busy_concurrent_s: list[float] | None = Field(
        default=None,
        min_length=1,
        description="as ``concurrent_s``, while ``busy_concurrent`` trials start and train in turn: a start amid "
        "other trials' results and ends, as in an ASHA run",
    )

    @model_validator(mode="after")
    def _check(self) -> "TuneTrialStart":
        if any(not x > 0 for x in self.serial_s + self.concurrent_s + (self.busy_concurrent_s or [])):
            raise ValueError("Ray Tune trial starts must be positive seconds")
        if (self.busy_concurrent is None) != (self.busy_concurrent_s is None):
            raise ValueError("busy_concurrent and busy_concurrent_s go together: give both or neither")
        return self


class Profile(_Model):
    schema_version: Literal[1, 2] = PROFILE_SCHEMA_VERSION
    workload: Workload
    measurements: list[LatencyMeasurement] = Field(min_length=1)
    epoch_measurements: list[EpochMeasurement] = Field(default_factory=list)
    startup: list[StartupSamples] = Field(default_factory=list)
    termination: list[TerminationSamples] = Field(default_factory=list)
    head_startup: list[StartupSamples] = Field(
        default_factory=list,
        description="seconds from starting the run's head until it takes nodes, per cloud where it boots before "
        "any instance (local: the Ray head on this machine); absent: one node's start-up stands in",
    )
    startup_overlap: list[StartupOverlap] = Field(
        default_factory=list,
        description="start-ups overlapping on a shared host (local), each against the same start alone; absent: "
        "starts are taken as independent",
    )
    tune_trial_start: TuneTrialStart | None = Field(
        default=None,
        description="Ray Tune's own trial start (the ASHA baseline's); absent: not measured (no ray[tune] where the "
        "profile was taken), the baseline starts trials as this executor does",
    )
    reference_device: str | None = None
    device_speed: dict[str, float] = Field(default_factory=dict)
    machine: dict[str, Any] = Field(default_factory=dict)
    torch_version: str | None = None
    created_at: str | None = None
    fitted: dict[str, Any] | None = Field(
        default=None,
        description="the fitted model, for inspection; a device fit whose fit_key matches the measurements is reused",
    )
    sources: dict[str, str] = Field(
        default_factory=dict, description="how each workload figure was obtained (field -> how)"
    )

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        for device, speed in self.device_speed.items():
            if not speed > 0:
                raise ValueError(f"device_speed.{device} must be positive")
        if self.device_speed and self.reference_device is None:
            raise ValueError("device_speed needs reference_device (the device speeds are relative to)")
        return self

    def devices(self) -> list[str]:
        return sorted({m.device for m in self.measurements})


def parse_profile(data: Any, *, source: str = "<profile>") -> Profile:
    """A profile of any version this rubberband reads (v1 loads without ``epoch_measurements``)."""
    found = data.get("schema_version") if isinstance(data, dict) else None
    if found is not None and found not in PROFILE_SCHEMA_VERSIONS:
        raise ProfileError(
            f"{source}: profile schema_version {found!r} is not supported; this rubberband reads versions "
            f"{' and '.join(str(v) for v in PROFILE_SCHEMA_VERSIONS)} (see docs/profile.md or re-run `rubberband "
            f"profile`)"
        )
    version = found if found in PROFILE_SCHEMA_VERSIONS else PROFILE_SCHEMA_VERSION
    schema = DocumentSchema(
        Profile,
        kind="profile",
        version=version,
        error=ProfileError,
        remedy="see docs/profile.md or re-run `rubberband profile`",
    )
    return validate_versioned(schema, data, source=source)


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    data = read_json(
        path,
        kind="profile",
        error=ProfileError,
        missing="run `rubberband profile` or set `profile:` in the spec",
        remedy="re-run `rubberband profile`",
    )
    return parse_profile(data, source=str(path))


def write_profile(profile: Profile, path: str | Path) -> None:
    """Write atomically: a half-written profile never appears under ``path``."""
    write_text_atomic(path, profile.model_dump_json(indent=2, exclude_none=True) + "\n")
