"""Profile a training function: run it briefly at each trial shape with real DDP and record it all.

For one instance type, :func:`run_profile` starts Ray nodes standing in for instances (local
backend), runs the user's ``train`` through the trial runtime for a bounded number of
iterations at every shape (workers × nodes), and records every iteration latency rank 0 timed.
Each shape runs two epochs (the iterations split between them), so the gap between the two
passes measures the per-epoch time outside the timed iterations (evaluation, data loading,
reporting, checkpoint save). It also measures what a resize costs (checkpoint → restart with
another worker count, with warm and with fresh worker processes: their difference is what a new
instance's first trial waits for its worker processes), the checkpoint size, and optionally how
long a new node takes to be ready and to be gone after its termination. Then it times whole epochs
(training, evaluation, report, checkpoint) of several configurations sampled from the search space
at the narrowest one-instance shape, from which the planner fits per-epoch noise and the spread of
configuration speed. The total stays within the budget: the time left is split across the
shapes still to run and the iteration count is capped from what earlier shapes took.
Figures that are not measured get documented defaults, and ``Profile.sources`` says which.
On a GPU instance type the nodes advertise the type's GPUs and every worker trains on the GPU Ray
assigned it with nccl (``rubberband.devices``), so a GPU type's profile is a GPU
measurement; a node without a usable CUDA stops the profile with GpuUnavailableError.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rubberband.catalog import SERIAL_PROVISIONING
from rubberband.clouds import CLOUDS
from rubberband.cloud.provider import node_resource
from rubberband.errors import InputError, RubberbandError, TrainingError
from rubberband.devices import node_resources
from rubberband.paths import short_tmp_root
from rubberband.profile import (
    EpochMeasurement,
    StartupOverlap,
    StartupSamples,
    TuneTrialStart,
    TerminationSamples,
)
from rubberband.profiler.assemble import build_profile
from rubberband.profiler.measured import (
    ConfigRunCost,
    Measured,
    ProfileOptions,
    ProfileRun,
    Restart,
    ShapeResult,
)
from rubberband.profiler.shapes import Shape, nodes_needed, plan_shapes
from rubberband.search import RandomSource, first_config
from rubberband.spec import JobSpec

#: Callback for progress: (what is happening, steps done, steps in all).
ProgressFn = Callable[[str, int, int], None]

#: Below this many seconds left for a shape, it is skipped rather than started.
MIN_SHAPE_S = 3.0
#: Iterations of the short calibration run before the first shape.
PROBE_ITERATIONS = 3
#: Probe only when more iterations than this are asked for (a few cost less than a probe).
PROBE_ABOVE = 10
#: Each shape runs two epochs (for the per-epoch overhead) when each pass gets at least this many iterations.
MIN_PASS_ITERATIONS = 2
#: Clouds whose instances `rubberband profile` starts itself (catalogs/clouds.yaml: profiling).
CLOUDS_WITH_PROFILING = tuple(name for name, facts in CLOUDS.items() if facts.profiling)
#: Start-up samples taken by default where the instance type can be started (the clouds above).
DEFAULT_STARTUP_SAMPLES = 3
#: Configurations timed at most (more than the minimum only as the budget allows).
MAX_CONFIGS = 8
#: Budget seconds the shapes and the configurations leave for timing Ray Tune's trial starts, and the least left
#: to start them (they take about 50 s on 2 cores; the probe stops at the end of the budget).
TUNE_START_RESERVE_S = 60.0
#: The smallest ``--budget`` that times Ray Tune's trial starts: below it their reserve would squeeze the shapes.
TUNE_START_MIN_BUDGET_S = 120.0


class _Budget:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self._t0 = time.monotonic()

    def spent(self) -> float:
        return time.monotonic() - self._t0

    def left(self) -> float:
        return self.total_s - self.spent()


_IMPORT_CHECK = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
module = importlib.import_module(sys.argv[2])
if not callable(getattr(module, sys.argv[3], None)):
    raise AttributeError(f"module {sys.argv[2]!r} has no function {sys.argv[3]!r}")
"""


def check_entry_point(spec: JobSpec, *, timeout_s: float = 120.0) -> None:
    """Fail fast, before any node starts, when the entry point does not import.

    The module is imported in a separate Python process (as a worker would), so its import-time
    side effects never touch this one.
    """
    import subprocess

    module = spec.train_module
    sys.path.insert(0, spec.base_dir)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path.remove(spec.base_dir)
    if found is None:
        raise TrainingError(
            f"cannot import entry point {spec.train!r} from {spec.base_dir}: no module named "
            f"{module!r}; check the spec's train: field and that the file sits next to the spec"
        )
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_CHECK, spec.base_dir, module, spec.train_function],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=spec.base_dir,
        )
    except subprocess.TimeoutExpired:
        raise TrainingError(
            f"importing entry point {spec.train!r} took over {timeout_s:.0f} s; move slow work out of module import"
        ) from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        raise TrainingError(f"cannot import entry point {spec.train!r} from {spec.base_dir}: {reason}")


def profiling_config(spec: JobSpec) -> dict[str, Any]:
    """The hyperparameters profiled: the first configuration a run proposes (seeded), over ``spec.config``."""
    return {**spec.config, **first_config(spec)}


def validate(spec: JobSpec, options: ProfileOptions) -> list[Shape]:
    """Check the request before anything starts; return the shapes to measure."""
    if options.cloud not in CLOUDS_WITH_PROFILING:
        raise InputError(
            f"profiling on {options.cloud} needs the {options.cloud} cloud provider, which this "
            f"build does not have yet; profile with --cloud local (a local.* instance type) or "
            f"point the spec's profile: at an existing profile"
        )
    if options.instance_type.cloud != options.cloud:
        raise InputError(
            f"--instance-type {options.instance_type.name} is a {options.instance_type.cloud} type; "
            f"pick one of the {options.cloud} catalog"
        )
    if options.iterations < 1:
        raise InputError("--iterations must be at least 1")
    shapes = plan_shapes(options.instance_type, list(options.workers), cross_node=options.cross_node)
    check_entry_point(spec)
    return shapes


def run_profile(spec: JobSpec, options: ProfileOptions, *, progress: ProgressFn | None = None) -> ProfileRun:
    """Measure ``spec``'s training on ``options.instance_type``; raises before writing anything on error."""
    shapes = validate(spec, options)
    from rubberband.profiler.local_cluster import LocalCluster  # sets Ray's loopback env before ray loads

    budget = _Budget(options.budget_s)
    notes: list[str] = []
    tune_skip = _tune_start_skipped(options)
    total_steps = (
        nodes_needed(shapes)
        + options.startup_samples
        + len(shapes)
        + options.configs
        + (2 if options.measure_restart else 0)
        + (0 if tune_skip else 1)
    )
    done = 0

    def tick(message: str, advance: bool = True) -> None:
        nonlocal done
        done += 1 if advance else 0
        if progress is not None:
            progress(message, done, total_steps)

    run_dir = Path(tempfile.mkdtemp(prefix="rb-prof-", dir=short_tmp_root()))
    it = options.instance_type
    config = profiling_config(spec)
    try:
        # Start-ups first, on an otherwise idle machine as a run meets them (the profiling cluster's
        # in-process nodes and its connected driver would be beside them).
        startup, termination, head_startup, overlap = _measure_startup(options, budget, notes, tick)
        with LocalCluster(temp_root=run_dir / "r") as cluster:
            resources = []
            node = node_resources(it)
            for i in range(nodes_needed(shapes)):
                tick(f"starting local instance {i + 1} of {nodes_needed(shapes)} ({it.name})", advance=False)
                cluster.add_instance(f"p{i}", node.slots, num_gpus=node.num_gpus, num_cpus=node.num_cpus)
                resources.append(node_resource(f"p{i}"))
                tick(f"local instance {i + 1} up")
            from rubberband.executor.pool import WorkerPool

            tune_reserve = 0.0 if tune_skip else TUNE_START_RESERVE_S
            steps = _Steps(spec, options, config, resources, run_dir, budget, notes, tick, tune_reserve)
            with WorkerPool(device=options.device) as pool:
                results = _measure_shapes(steps, shapes, pool)
                measured = [r for r in results if not r.skipped]
                if not measured:
                    raise InputError(
                        f"--budget {options.budget_s:.0f}s is too small to measure any shape "
                        f"({'; '.join(r.skipped or '' for r in results)}); give it more time"
                    )
                epochs = _measure_configs(steps, measured, pool)
                warm = _measure_restart(steps, measured, pool) if options.measure_restart else None
            cold = _measure_restart(steps, measured, None) if options.measure_restart else None
            tune_start = _measure_tune_start(cluster, steps, max(options.workers) > 1, tune_skip)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    found = Measured(results, startup, termination, warm, cold, epochs, head_startup, overlap, tune_start)
    profile = build_profile(spec, options, config, notes, found)
    return ProfileRun(profile=profile, shapes=results, notes=notes, wall_s=budget.spent())


# -- steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Steps:
    """What the measuring steps share (the shapes, the configurations, the restarts): the job, the options, the
    profiled configuration, the profiling cluster's instances (their node resources), the scratch run directory,
    the budget, the notes for the user, the progress callback and the seconds kept for Ray Tune's probe."""

    spec: JobSpec
    options: ProfileOptions
    config: dict
    resources: list[str]
    run_dir: Path
    budget: _Budget
    notes: list[str]
    tick: Callable[..., None]
    tune_reserve_s: float = 0.0

    @property
    def reserve_s(self) -> float:
        """Budget seconds the shapes and the configurations leave for the steps after them: the restarts (10 s, or
        a quarter of a smaller budget) and Ray Tune's trial starts."""
        restarts = min(10.0, 0.25 * self.options.budget_s) if self.options.measure_restart else 0.0
        return restarts + self.tune_reserve_s


def _measure_startup(
    options: ProfileOptions, budget: _Budget, notes: list[str], tick: Callable[..., None]
) -> tuple[list[StartupSamples], list[TerminationSamples], list[StartupSamples], list[StartupOverlap]]:
    """Start-up samples through the executor's own local provider (``ray start`` nodes joining a head), the
    head's own start (the run's Ray head, which a local run starts before it requests any node), and on a shared
    host the same starts overlapping as a run's serial provisioning overlaps them (:func:`_measure_overlap`).

    Measured the way a run pays for it: request → node registered with the head, for a throwaway head
    and nodes in a temporary run directory, all stopped before returning, before the profiling cluster
    starts (its in-process nodes start faster than the executor's do). Each probe
    node is then terminated the way a run releases one, and the time until it is gone (billing runs until
    then) is recorded as a termination sample.
    """
    from rubberband.cloud.local.provider import LocalProvider, remove_short_temp_dir
    from rubberband.cloud.provider import InstanceRequest

    samples: list[float] = []
    gone: list[float] = []
    head: list[float] = []
    overlaps: list[StartupOverlap] = []
    with tempfile.TemporaryDirectory(prefix="rb-startup-") as scratch:
        provider = LocalProvider(scratch)
        try:
            tick("start-up: starting a local Ray head", advance=False)
            began = time.time()
            provider.start_head("startup-probe")
            head.append(round(time.time() - began, 3))
            for k in range(options.startup_samples):
                if budget.left() < options.budget_s * 0.75:  # at most a quarter of the budget
                    notes.append(
                        f"start-up: took {len(samples)} of {options.startup_samples} samples "
                        f"(the rest of the budget is for the training shapes)"
                    )
                    break
                tick(f"start-up sample {k + 1}/{options.startup_samples}: starting a local node", advance=False)
                requested = time.time()
                (instance,) = provider.provision(
                    InstanceRequest(run_id="startup-probe", stage=0, instance_type=options.instance_type)
                )
                samples.append(round(time.time() - requested, 3))
                asked = time.time()
                provider.terminate([instance.id])
                gone.append(round(time.time() - asked, 3))
                tick(f"start-up sample {k + 1}: {samples[-1]:.1f} s to a registered node")
            if samples and options.cloud in SERIAL_PROVISIONING and budget.left() >= options.budget_s * 0.7:
                tick("start-up: a node's workers starting while the next node boots", advance=False)
                overlaps += _measure_overlap(Path(scratch), options, notes)
        finally:
            for instance in provider.list():
                provider.terminate([instance.id])
            provider.stop_head()
            remove_short_temp_dir(Path(scratch))  # its Ray temp dir may live outside the scratch dir
    out, ended = [], []
    if samples:
        out.append(
            StartupSamples(
                cloud=options.cloud, instance_type=options.instance_type.name, samples_s=samples, source="measured"
            )
        )
    if gone:
        ended.append(
            TerminationSamples(
                cloud=options.cloud, instance_type=options.instance_type.name, samples_s=gone, source="measured"
            )
        )
    heads = [StartupSamples(cloud=options.cloud, samples_s=head, source="measured")] if head else []
    return out, ended, heads, overlaps


def _measure_overlap(run_dir: Path, options: ProfileOptions, notes: list[str]) -> list[StartupOverlap]:
    """One overlap measurement on the probe's head (empty, with a note, where it could not be taken)."""
    from rubberband.profiler.overlap import OverlapProbe, measure_overlap

    itype = options.overlap_type or options.instance_type
    probe = OverlapProbe(
        instance_type=itype,
        device=options.device_policy.for_type(itype),
        warm_torch=max(options.workers) > 1,  # a run's workers import torch where trials may use DDP
    )
    try:
        return [measure_overlap(run_dir, probe)]
    except RubberbandError as exc:
        notes.append(f"start-up overlap: not measured ({exc}); the plan takes start-ups as independent")
        return []


def _tune_start_skipped(options: ProfileOptions) -> str | None:
    """Why Ray Tune's trial starts will not be timed (None: they will, and the budget keeps time for them)."""
    from rubberband.profiler.tune_start import tune_installed

    if not options.tune_start:
        return "not asked for (--no-tune-start)"
    if options.budget_s < TUNE_START_MIN_BUDGET_S:
        return f"not measured (a --budget under {TUNE_START_MIN_BUDGET_S:.0f}s leaves no time for it)"
    if not tune_installed():
        return "not measured (Ray Tune is not installed: the raytune extra)"
    return None


def _measure_tune_start(cluster: Any, steps: _Steps, torch_trials: bool, skipped: str | None) -> TuneTrialStart | None:
    """Ray Tune's trial starts on a node of their own, within what is left of the budget (None, with a note, where
    ``skipped`` says why not, the budget is spent or the probe failed): the plan's ASHA baseline is Ray Tune's
    ASHA, whose trials start new processes."""
    from rubberband.profiler.tune_start import measure_tune_start, concurrent_starts

    without = "; the ASHA baseline starts its trials as this executor does"
    if skipped:
        steps.notes.append(f"Ray Tune's trial start: {skipped}{without}")
        return None
    if steps.budget.left() < TUNE_START_RESERVE_S:
        steps.notes.append(f"Ray Tune's trial start: not measured (the budget is spent){without}")
        return None
    cores = os.cpu_count() or 1
    cpus = concurrent_starts(cores)
    steps.tick("Ray Tune's trial starts: one after another, then several at once", advance=False)
    try:
        cluster.add_instance("tune-probe", cpus, num_cpus=cpus)
        found = measure_tune_start(
            steps.run_dir / "tune",
            node_resource("tune-probe"),
            cpus=cpus,
            imports=("torch",) if torch_trials else (),
            time_budget_s=steps.budget.left(),
        )
    except RubberbandError as exc:
        steps.notes.append(f"Ray Tune's trial start: not measured ({exc}){without}")
        return None
    finally:
        if "tune-probe" in cluster.nodes:
            cluster.remove_instance("tune-probe")
    steps.tick(f"Ray Tune's trial start: {sum(found.serial_s) / len(found.serial_s):.1f} s alone")
    return found


@dataclass(frozen=True)
class _Bounds:
    """How far one run at a shape may go: ``iterations`` timed iterations (split over its two epochs) within
    ``share_s`` seconds, its share of the budget (a run past it is stopped, and the shape skipped)."""

    iterations: int
    share_s: float


def _run_shape(
    steps: _Steps, shape: Shape, checkpoint_dir: Path, bounds: _Bounds, pool: Any
) -> tuple[ShapeResult, float] | None:
    """One bounded run of ``train`` at ``shape`` (on ``pool``'s workers, checkpointing into ``checkpoint_dir``);
    None when it ran past ``bounds.share_s``.

    Returns the result and the run's seconds outside the timed iterations (start-up, DDP set-up,
    evaluation, checkpointing), which the budget has to pay for as well.
    """
    from rubberband.executor.trials import TrialRun, TrialSpec

    spec, config, iterations, share_s = steps.spec, steps.config, bounds.iterations, bounds.share_s

    # two epochs, the iterations split between them: the gap between the passes is the epoch overhead
    epochs = 2 if iterations >= 2 * MIN_PASS_ITERATIONS else 1
    trial = TrialSpec(
        trial_id=f"profile-w{shape.workers}-n{shape.nodes}",
        config=dict(config),
        entry_point=spec.train,
        code_dir=spec.base_dir,
        start_epoch=0,
        end_epoch=epochs,
        placement=shape.placement(steps.resources),
        checkpoint_dir=str(checkpoint_dir),
        device=steps.options.device,
        max_iterations=-(-iterations // epochs),
        timeout_s=max(30.0, share_s),
    )
    run = TrialRun.start(trial, pool=pool)
    try:
        outcome = run.result(timeout_s=max(share_s, MIN_SHAPE_S))
    except TimeoutError:
        run.stop()
        return None
    if not outcome.iteration_latencies_s:
        raise TrainingError(
            f"{spec.train} never iterated over ctx.batches(...); wrap the training loop's "
            f"iterable in ctx.batches so rubberband can time it"
        )
    result = ShapeResult(
        shape,
        latencies_s=outcome.iteration_latencies_s,
        setup_s=outcome.setup_s,
        checkpoint_dir=str(checkpoint_dir),
        checkpoint_saved_s=outcome.checkpoint_saved_s[-1] if outcome.checkpoint_saved_s else None,
        pass_lengths=outcome.pass_lengths,
        batch_size_seen=outcome.batch_size_seen,
        epoch_gaps_s=tuple(max(0.0, b[0] - a[1]) for a, b in zip(outcome.pass_times, outcome.pass_times[1:])),
        device=outcome.devices[0] if outcome.devices else "",
        backend=outcome.backend,
    )
    overhead = outcome.finished_at - outcome.started_at - sum(outcome.iteration_latencies_s)
    return result, max(0.0, overhead)


def probe_limit_s(left_s: float, *, later_runs: int) -> float:
    """How long the first run (the probe, or the first shape when no probe runs) may take, of ``left_s``
    seconds for it and ``later_runs``.

    That run pays for the workers' cold start (Python, torch, the entry point's imports): a fixed cost
    that no share of the budget scales with, and that a loaded machine can stretch to tens of seconds.
    So it may use all but the smallest share (``MIN_SHAPE_S``) of each run after it: a first run that
    cannot finish leaves nothing to measure, and the shapes after a long one are capped to what is left.
    """
    return max(MIN_SHAPE_S, left_s - later_runs * MIN_SHAPE_S)


def _measure_shapes(steps: _Steps, shapes: list[Shape], pool: Any) -> list[ShapeResult]:
    """Every shape's bounded run on ``pool``'s workers (a short probe first when many iterations are asked for), each
    within its share of what is left of the budget; a shape whose share is too small, or whose run overran it, is
    skipped (with a note saying why)."""
    options, run_dir, budget, notes, tick = steps.options, steps.run_dir, steps.budget, steps.notes, steps.tick
    reserve = steps.reserve_s
    # the configurations' epochs after the shapes get a share like one more shape (unused time rolls forward)
    extra = 1 if options.configs > 0 else 0
    results: list[ShapeResult] = []
    est_iter = est_setup = 0.0
    probed = options.iterations > PROBE_ABOVE
    if probed:
        # A short probe first, so even the first shape's iteration count fits the budget.
        share = probe_limit_s(budget.left() - reserve, later_runs=len(shapes) + extra)
        tick(f"probing {shapes[0].label} ({PROBE_ITERATIONS} iterations)", advance=False)
        probe = _run_shape(steps, shapes[0], run_dir / "ckpt" / "probe", _Bounds(PROBE_ITERATIONS, share), pool)
        if probe is None:
            raise InputError(
                f"--budget {options.budget_s:.0f}s is too small: {PROBE_ITERATIONS} iterations at "
                f"{shapes[0].label} did not finish within {share:.0f} s; "
                f"give it more time"
            )
        est_iter, est_setup = probe[0].median_s, probe[1]
    for index, shape in enumerate(shapes):
        later_runs = len(shapes) - index - 1 + extra
        if index == 0 and not probed:
            # no probe ran: this first shape pays the workers' cold start, as the probe would have
            share = probe_limit_s(budget.left() - reserve, later_runs=later_runs)
        else:
            share = (budget.left() - reserve) / (later_runs + 1)
        if share < MIN_SHAPE_S:
            reason = f"{shape.label}: skipped, {max(share, 0):.1f} s of budget left for it"
            notes.append(reason)
            results.append(ShapeResult(shape, skipped=reason))
            tick(reason)
            continue
        iterations = options.iterations
        if est_iter > 0:
            cap = int((share - est_setup - 1.0) / (est_iter * 1.5))
            if cap < iterations:
                iterations = max(2, cap)
                notes.append(f"{shape.label}: capped at {iterations} iterations to stay within the budget")
        tick(f"measuring {shape.label} ({iterations} iterations, ≤ {share:.0f} s)", advance=False)
        ran = _run_shape(
            steps, shape, run_dir / "ckpt" / f"w{shape.workers}-n{shape.nodes}", _Bounds(iterations, share), pool
        )
        if ran is None:
            reason = f"{shape.label}: skipped, did not finish within its {share:.0f} s share of the budget"
            notes.append(reason + "; lower --iterations or raise --budget")
            results.append(ShapeResult(shape, skipped=reason))
            tick(reason)
            continue
        result, overhead = ran
        results.append(result)
        est_iter = max(est_iter, result.median_s)
        est_setup = max(overhead, 0.5 * est_setup)  # the probe paid for starting processes; later runs reuse them
        tick(f"{shape.label}: median {result.median_s * 1e3:.1f} ms per iteration")
    return results


def profiling_configs(spec: JobSpec, count: int) -> list[dict[str, Any]]:
    """The profiled configuration (:func:`profiling_config`) and the ``count − 1`` a random search of the
    run proposes after it (the spec's fixed configurations first), each over ``spec.config``.

    A spec of fixed configurations only yields at most as many as it lists (distinct ones)."""
    source = RandomSource(spec)
    out: list[dict[str, Any]] = []
    for i in range(max(1, count) if spec.search_space else min(max(1, count), len(spec.trials or []) or 1)):
        config = {**spec.config, **source.propose(f"profile-{i}")}
        if config not in out:
            out.append(config)
    return out


def epoch_times(pass_times: tuple[tuple[float, float], ...]) -> list[float]:
    """Whole-epoch times from the passes over ``ctx.batches``: start of one pass to the start of the next.

    Each covers the epoch's iterations and everything until the next epoch's first batch
    (evaluation, report, checkpoint save, data loading). The first epoch (warm-up) is dropped.
    """
    starts = [start for start, _ in pass_times]
    return [b - a for a, b in zip(starts[1:], starts[2:])]


def configuration_quality(reports: Any, name: str, mode: str) -> float | None:
    """A profiled configuration's score after its last reported epoch, higher better (the metric negated when it is
    minimised): what promotion would rank it by at this fidelity. None when it reported no such finite metric."""
    last = max(reports, key=lambda r: r.epoch, default=None)
    value = None if last is None else last.metrics.get(name)
    if value is None or not math.isfinite(float(value)):
        return None
    return -float(value) if mode == "min" else float(value)


def _measure_configs(steps: _Steps, measured: list[ShapeResult], pool: Any) -> list[EpochMeasurement]:
    """Whole epochs of ``options.configs`` (or more, as the budget allows) sampled configurations.

    Run at the narrowest one-instance shape measured, ``config_epochs + 2`` epochs each: a warm-up, then
    ``config_epochs`` timed from one epoch's start to the next's, and the epoch whose start ends the last
    timing. When whole epochs of the minimum number of configurations do not fit what is left
    of the budget (minus the resize reserve), each epoch is capped to fewer iterations (partial
    epochs, recorded in ``iterations_per_epoch``).
    """
    spec, options, resources, run_dir = steps.spec, steps.options, steps.resources, steps.run_dir
    budget, notes, tick = steps.budget, steps.notes, steps.tick
    if options.configs <= 0:
        return []
    from rubberband.executor.trials import TrialRun, TrialSpec

    reserve = steps.reserve_s
    shape_result = min((r for r in measured if r.shape.nodes == 1), key=lambda r: r.shape.workers, default=measured[0])
    shape = shape_result.shape
    gaps = [g for r in measured for g in r.epoch_gaps_s]
    gap = float(np.median(gaps)) if gaps else 0.0
    full = None
    if shape_result.pass_lengths and shape_result.pass_lengths[0]:
        full = int(shape_result.pass_lengths[0])
    elif options.dataset_size or spec.config.get("dataset_size"):
        size = int(options.dataset_size or spec.config["dataset_size"])
        batch = int(options.batch_size or spec.config.get("batch_size") or shape_result.batch_size_seen or 1)
        full = max(1, -(-size // (batch * shape.workers)))
    placement = shape.placement(resources)
    idle = pool.idle() if pool is not None else {}
    cost = ConfigRunCost(
        epochs=options.config_epochs + 2,  # warm-up, then config_epochs measured (start to next start)
        iteration_s=shape_result.median_s,
        epoch_gap_s=gap,
        setup_s=shape_result.setup_s,
        warm=all(idle.get(r, 0) >= placement.count(r) for r in set(placement)),
    )
    wanted = full or options.iterations
    iterations = cost.iterations_within(budget.left() - reserve, runs=options.configs, wanted=wanted)
    if iterations < wanted:
        notes.append(
            f"configurations: epochs capped at {iterations} of {full or '?'} iterations to fit the budget "
            f"(partial epochs)"
        )
    out: list[EpochMeasurement] = []
    candidates = profiling_configs(spec, MAX_CONFIGS)
    for k, cfg in enumerate(candidates):
        left = budget.left() - reserve
        if k >= options.configs and left < cost.seconds(iterations) * 1.3:
            break
        if left < cost.seconds(iterations) * 0.8:
            notes.append(f"configurations: timed {len(out)} of {options.configs}, the budget is spent")
            tick(f"configuration {k + 1}: skipped", advance=True)
            break
        tick(f"configuration {k + 1}: {cost.epochs} epochs of {iterations} iterations at {shape.label}", advance=False)
        trial = TrialSpec(
            trial_id=f"profile-config-{k}",
            config=dict(cfg),
            entry_point=spec.train,
            code_dir=spec.base_dir,
            start_epoch=0,
            end_epoch=cost.epochs,
            placement=placement,
            checkpoint_dir=str(run_dir / "ckpt" / f"config-{k}"),
            max_iterations=None if full is not None and iterations >= full else iterations,
            timeout_s=max(30.0, left),
            device=options.device,
        )  # a GPU type's epochs on its GPUs
        run = TrialRun.start(trial, pool=pool)
        try:
            outcome = run.result(timeout_s=max(left, MIN_SHAPE_S))
        except TimeoutError:
            run.stop()
            notes.append(f"configuration {k + 1}: ran past the budget, not recorded")
            break
        times = epoch_times(outcome.pass_times)
        ran = outcome.pass_lengths[0] if outcome.pass_lengths and outcome.pass_lengths[0] else None
        if ran is not None:
            ran = min(int(ran), iterations)
        else:
            ran = iterations
        if times:
            out.append(
                EpochMeasurement(
                    quality=configuration_quality(outcome.reports, spec.metric.name, spec.metric.mode),
                    config=json.loads(json.dumps(cfg, default=str)),
                    device=options.instance_type.device,
                    instance_type=options.instance_type.name,
                    workers=shape.workers,
                    nodes=shape.nodes,
                    iterations_per_epoch=max(1, ran),
                    epoch_times_s=[round(t, 6) for t in times],
                    source="measured",
                )
            )
        tick(f"configuration {k + 1}: median epoch {np.median(times) if times else float('nan'):.2f} s")
    if 0 < len(out) < 2:
        notes.append(
            "configurations: fewer than two timed, so configuration speed spread is not measured; raise --budget"
        )
    return out


def _measure_restart(steps: _Steps, measured: list[ShapeResult], pool: Any) -> Restart | None:
    """Checkpoint at one worker count → restart at another; ``pool`` None means fresh processes."""
    spec, options, resources, config = steps.spec, steps.options, steps.resources, steps.config
    budget, notes, tick = steps.budget, steps.notes, steps.tick
    from rubberband.executor.checkpoints import checkpoint_path, latest_epoch
    from rubberband.executor.trials import TrialRun, TrialSpec

    kind = "warm" if pool is not None else "fresh"
    needed = 3.0 if pool is not None else 8.0
    if budget.left() < needed:
        notes.append(f"restart overhead ({kind} workers): not measured, budget spent")
        tick(f"restart ({kind}): skipped")
        return None
    # Restart onto the widest single-instance shape: with fresh processes that is what a new instance's
    # first trial waits for (all its workers starting at once), from a checkpoint saved at another width.
    widest = max((r for r in measured if r.shape.nodes == 1), key=lambda r: r.shape.workers, default=measured[0])
    others = sorted(
        (r for r in measured if r.shape.workers != widest.shape.workers), key=lambda r: (r.shape.nodes, r.shape.workers)
    )
    source = others[0] if others else widest
    target = widest.shape
    tick(f"restart ({kind} workers): {source.shape.workers} → {target.workers} workers", advance=False)
    epoch = latest_epoch(source.checkpoint_dir)
    after = 1 if epoch is None else epoch + 1
    trial = TrialSpec(
        trial_id=f"profile-restart-{kind}",
        config=dict(config),
        entry_point=spec.train,
        code_dir=spec.base_dir,
        start_epoch=after,
        end_epoch=after + 1,
        placement=target.placement(resources),
        device=options.device,
        checkpoint_dir=source.checkpoint_dir,
        max_iterations=1,
        timeout_s=max(30.0, budget.left()),
    )
    run = TrialRun.start(trial, pool=pool)
    try:
        outcome = run.result(timeout_s=max(budget.left(), needed))
    except TimeoutError:
        run.stop()
        notes.append(f"restart overhead ({kind} workers): not measured, ran past the budget")
        tick(f"restart ({kind}): skipped")
        return None
    if outcome.first_iteration_at is None:
        notes.append(f"restart overhead ({kind}): not measured, train() did not iterate after restoring")
        tick(f"restart ({kind}): not measured")
        return None
    if epoch is None:
        notes.append("train() saved no checkpoint, so the restart overhead leaves out saving and loading one")
    saved = source.checkpoint_saved_s or 0.0
    start = max(0.0, outcome.first_iteration_at - outcome.started_at)
    overhead = saved + start
    size = checkpoint_path(source.checkpoint_dir, epoch).stat().st_size if epoch is not None else None
    tick(f"restart ({kind} workers): {overhead:.2f} s")
    return Restart(overhead, source.shape, target, size, start_s=start, save_s=source.checkpoint_saved_s)
