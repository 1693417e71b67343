"""What a profile run measures, as values: its options, each shape's result, a resize, and the whole run's figures.

:mod:`~rubberband.profiler.runner` fills them in; :mod:`~rubberband.profiler.assemble` turns them into a
:class:`~rubberband.profile.Profile`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rubberband.catalog import InstanceType
from rubberband.devices import DevicePolicy, WorkerDevice
from rubberband.profile import (
    EpochMeasurement,
    Profile,
    StartupOverlap,
    StartupSamples,
    TerminationSamples,
    TuneTrialStart,
)
from rubberband.profiler.shapes import Shape

#: Iterations per timed epoch at least, when whole epochs do not fit the budget (partial epochs).
MIN_EPOCH_ITERATIONS = 5


@dataclass(frozen=True)
class ProfileOptions:
    """What to profile (an instance type of a cloud at these worker counts) and within what budget."""

    cloud: str
    instance_type: InstanceType
    workers: tuple[int, ...]
    budget_s: float = 300.0
    iterations: int = 20
    startup_samples: int = 0
    batch_size: int | None = None
    dataset_size: int | None = None
    cross_node: bool = True
    measure_restart: bool = True
    #: Configurations whose whole epochs are timed (at least; more as the budget allows); 0: none.
    configs: int = 3
    #: Epochs timed per configuration (one more runs first, as warm-up, and is not counted).
    config_epochs: int = 3
    #: Chooses the workers' device from ``instance_type`` (tests inject ``DevicePolicy(cpu_stand_in=True)``).
    device_policy: DevicePolicy = DevicePolicy()
    #: The type whose start-ups are timed side by side on a shared host (:mod:`~rubberband.profiler.overlap`):
    #: the widest the run may start (its workers contend most); None: ``instance_type``.
    overlap_type: InstanceType | None = None
    #: Time Ray Tune's own trial starts (:mod:`~rubberband.profiler.tune_start`), for the plan's ASHA baseline,
    #: where Ray Tune is installed and the budget is at least :data:`~rubberband.profiler.runner.TUNE_START_MIN_BUDGET_S`.
    tune_start: bool = True

    @property
    def device(self) -> WorkerDevice:
        return self.device_policy.for_type(self.instance_type)


@dataclass(frozen=True)
class ConfigRunCost:
    """What one run of a sampled configuration's epochs costs, to fit their iterations to the budget.

    ``setup_s`` is what the measured shape's run took to set up. It was the first run on its workers, so
    it paid their cold start (Python, torch, the entry point's imports): tens of seconds on a loaded
    machine. When the pool holds warm workers for the placement (``warm``), the configurations reuse
    them and pay a process-group init instead, so charging the cold start per configuration would cap
    their epochs for nothing.
    """

    epochs: int
    iteration_s: float
    epoch_gap_s: float
    setup_s: float
    warm: bool
    #: Per run, beyond set-up: the entry point's own start, the first report, the worker's hand-back.
    slack_s: float = 1.0

    def seconds(self, iterations: int) -> float:
        """One run of ``epochs`` epochs of ``iterations`` iterations each."""
        setup = self.slack_s + (0.0 if self.warm else self.setup_s)
        return setup + self.epochs * (iterations * self.iteration_s + self.epoch_gap_s)

    def iterations_within(self, available_s: float, *, runs: int, wanted: int) -> int:
        """``wanted`` when ``runs`` runs of it fit ``available_s``; else the most that fit, but at least
        ``MIN_EPOCH_ITERATIONS`` (partial epochs)."""
        if self.seconds(wanted) * runs <= available_s:
            return wanted
        per_epoch = (available_s / runs - self.seconds(0)) / self.epochs
        fit = int(per_epoch / max(self.iteration_s, 1e-6))
        return max(MIN_EPOCH_ITERATIONS, min(wanted, fit))


@dataclass(frozen=True)
class ShapeResult:
    """One shape's run: rank 0's iteration latencies, its set-up, its checkpoint, what its batches told (their
    lengths and batch size) and the device it trained on; ``skipped`` says why it did not run."""

    shape: Shape
    latencies_s: tuple[float, ...] = ()
    setup_s: float = 0.0
    checkpoint_dir: str = ""
    checkpoint_saved_s: float | None = None
    pass_lengths: tuple[int | None, ...] = ()
    batch_size_seen: int | None = None
    skipped: str | None = None
    #: Seconds between consecutive passes over ctx.batches (the per-epoch time outside iterations).
    epoch_gaps_s: tuple[float, ...] = ()
    #: What the workers trained on: rank 0's device ("cuda:0", "cpu") and the process group's backend.
    device: str = ""
    backend: str = ""

    @property
    def median_s(self) -> float:
        return float(np.median(self.latencies_s))


@dataclass
class ProfileRun:
    """A finished profile plus what the CLI reports about it."""

    profile: Profile
    shapes: list[ShapeResult]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass(frozen=True)
class Restart:
    """A resize as the profile timed it: a checkpoint at ``source_shape``'s workers, restarted at
    ``target_shape``'s (warm or fresh worker processes), and what it took."""

    overhead_s: float
    source_shape: Shape
    target_shape: Shape
    checkpoint_bytes: int | None
    #: The run's start → its first iteration (without the checkpoint save before it).
    start_s: float = 0.0
    #: The checkpoint save before the restart (None: train() saved none).
    save_s: float | None = None


@dataclass(frozen=True)
class Measured:
    """What a profile run measured: the shapes, start-ups and terminations, the restart with warm and with fresh
    worker processes (None: not measured) and the configurations' epochs."""

    shapes: list[ShapeResult]
    startup: list[StartupSamples]
    termination: list[TerminationSamples] | None = None
    warm: Restart | None = None
    cold: Restart | None = None
    epochs: list[EpochMeasurement] | None = None
    head_startup: list[StartupSamples] | None = None
    overlap: list[StartupOverlap] | None = None
    tune_start: TuneTrialStart | None = None
