"""``rubberband profile``: measure the training's iteration latency at each trial shape, write a profile."""

from __future__ import annotations

import statistics

import math
from pathlib import Path

import typer

from rubberband.catalog import load_catalog
from rubberband.console import stderr, stdout
from rubberband.errors import InputError
from rubberband.profiler.shapes import type_to_profile
from rubberband.spec import CLOUDS, JobSpec, load_spec
from rubberband.units import format_duration, parse_duration

ORDER = 30


def _default_cloud(spec: JobSpec) -> str:
    return "local" if "local" in spec.resources.clouds else spec.resources.clouds[0]


def _instance_type(spec: JobSpec, cloud: str, name: str | None):
    """``--instance-type``, else :func:`~rubberband.profiler.shapes.type_to_profile` of the spec's types of
    ``cloud``, else the cloud's cheapest type."""
    catalog = load_catalog([cloud])
    if name is not None:
        return catalog.find(name, cloud=cloud)
    named = [
        catalog.find(candidate, cloud=cloud)
        for candidate in spec.resources.instance_types or []
        if any(t.name == candidate for t in catalog.types)
    ]
    if named:
        return type_to_profile(named, spec.resources.max_workers_per_trial)
    return min(catalog.types, key=lambda t: (t.price_hr, t.name))


def _widest_type(spec: JobSpec, cloud: str, profiled):
    """The spec's type of ``cloud`` with the most worker slots (the profiled one where the spec names none): the
    start-up overlap is timed on it, since its workers contend most with the next boot."""
    catalog = load_catalog([cloud])
    named = [t for t in catalog.types if t.name in (spec.resources.instance_types or [])]
    return max([profiled, *named], key=lambda t: (t.workers, t.name == profiled.name))


def _default_workers(spec: JobSpec, per_node: int) -> str:
    cap = min(per_node * 2, spec.resources.max_workers_per_trial)
    return ",".join(str(w) for w in (1, 2, 4, 8) if w <= cap) or "1"


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        spec_path: Path = typer.Argument(..., metavar="SPEC", help="The job spec (YAML)."),
        cloud: str = typer.Option(
            None, "--cloud", help="Where to profile: local, aws or gcp (default: local when the spec allows it)."
        ),
        instance_type: str = typer.Option(
            None,
            "--instance-type",
            help="Instance type to measure (default: the spec's first, or the narrowest of its device that holds the "
            "widest trial max_workers_per_trial allows on one node).",
        ),
        workers: str = typer.Option(
            None, "--workers", help="Worker counts per trial, e.g. 1,2,4 (default: 1,2,4 up to two instances' worth)."
        ),
        budget: str = typer.Option("5m", "--budget", help="Total time for the whole profile, e.g. 90s, 5m."),
        startup_samples: int = typer.Option(
            None,
            "--startup-samples",
            help="Measure this many node start-ups "
            "(default: 3 where the instance type can be started here, else "
            "documented defaults).",
        ),
        configs: int = typer.Option(
            3,
            "--configs",
            help="Time whole epochs of at least this many configurations "
            "sampled from the search space (more as --budget allows; 0: none).",
        ),
        iterations: int = typer.Option(20, "--iterations", help="Iterations timed per shape (at most)."),
        batch_size: int = typer.Option(
            None, "--batch-size", help="Per-worker batch size, if the spec's config and the batches do not tell."
        ),
        dataset_size: int = typer.Option(
            None, "--dataset-size", help="Training samples per epoch, if the spec's config and the batches do not tell."
        ),
        single_node: bool = typer.Option(False, "--single-node", help="Skip the shapes spanning two nodes."),
        tune_start: bool = typer.Option(
            True,
            "--tune-start/--no-tune-start",
            help="Time Ray Tune's own trial starts, for the plan's ASHA baseline (about 50 s on 2 cores; needs the "
            "raytune extra and a --budget of 2m or more).",
        ),
        out: Path = typer.Option(
            None, "--out", "-o", help="Where to write the profile JSON (default: the spec's profile: path)."
        ),
        from_run: list[Path] = typer.Option(
            None,
            "--from-run",
            help="Measure nothing: fold what these finished runs measured (head start, boots and worker starts "
            "as the run overlapped them, per-trial overheads, each first-stage trial as a configuration sample) "
            "into the spec's profile (repeatable).",
        ),
    ) -> None:
        """Run the training briefly at each workers-per-trial count with real DDP and write a profile."""
        spec = load_spec(spec_path)
        if from_run:
            _calibrate(spec, from_run, out)
            return
        cloud = cloud or _default_cloud(spec)
        if cloud not in CLOUDS:
            raise InputError(f"--cloud {cloud!r} is not known; use one of {', '.join(CLOUDS)}")
        try:
            budget_s = parse_duration(budget)
        except ValueError as exc:
            raise InputError(f"--budget: {exc}") from None
        if startup_samples is not None and startup_samples < 0:
            raise InputError("--startup-samples must be 0 or more")
        if configs < 0:
            raise InputError("--configs must be 0 or more")
        for flag, value in (("--batch-size", batch_size), ("--dataset-size", dataset_size)):
            if value is not None and value < 1:
                raise InputError(f"{flag} must be a positive number")
        out = out or spec.profile_path()
        if out is None:
            raise InputError("no output path: pass --out profile.json or set profile: in the spec")
        if not out.parent.is_dir():
            raise InputError(f"--out {out}: directory {out.parent} does not exist; create it first")
        itype = _instance_type(spec, cloud, instance_type)

        from rubberband.profile import write_profile
        from rubberband.profiler.measured import ProfileOptions
        from rubberband.profiler.runner import CLOUDS_WITH_PROFILING, DEFAULT_STARTUP_SAMPLES, validate
        from rubberband.profiler.shapes import parse_workers

        counts = parse_workers(workers or _default_workers(spec, itype.workers))
        if startup_samples is None:
            startup_samples = DEFAULT_STARTUP_SAMPLES if cloud in CLOUDS_WITH_PROFILING else 0
        options = ProfileOptions(
            cloud=cloud,
            instance_type=itype,
            workers=tuple(counts),
            budget_s=budget_s,
            iterations=iterations,
            startup_samples=startup_samples,
            batch_size=batch_size,
            dataset_size=dataset_size,
            cross_node=not single_node,
            configs=configs,
            overlap_type=_widest_type(spec, cloud, itype),
            tune_start=tune_start,
        )
        validate(spec, options)  # bad input fails here, before any progress output
        result = _run_with_progress(spec, options)
        write_profile(result.profile, out)
        _print_summary(result, out)


def _calibrate(spec: JobSpec, runs: list[Path], out: Path | None) -> None:
    """``--from-run``: the spec's profile with what the runs measured, written to ``out`` (default: over it)."""
    from rubberband.profile import load_profile, write_profile
    from rubberband.profiler.from_runs import calibrated, read_run
    from rubberband.profiler.assemble import fit_description

    source = spec.profile_path()
    if source is None:
        raise InputError("--from-run needs the profile to update: set profile: in the spec")
    profile = load_profile(source)
    types = load_catalog(list(spec.resources.clouds)).types
    measured = [read_run(run, {t.name: t.workers for t in types}) for run in runs]
    updated = calibrated(profile, measured, devices={t.name: t.device for t in types})
    notes: list[str] = []
    updated = updated.model_copy(update={"fitted": fit_description(updated, notes)})
    target = out or source
    write_profile(updated, target)
    w = updated.workload
    heads = [x for s in updated.head_startup for x in s.samples_s]
    print(
        f"profile {target}: from {len(measured)} run(s): task start {w.task_start_s:.3f} s, restart "
        f"{w.restart_overhead_s:.3f} s, new instance's workers {w.worker_start_s:.2f} s"
        + (f", head start {statistics.median(heads):.2f} s" if heads else "")
        + "".join(_overlap_line(o) for o in updated.startup_overlap)
        + _configurations_line(updated)
    )
    for note in notes:  # the fit failed: the profile is written without it, and the planner fits when it loads
        stderr().print(note, soft_wrap=True)


def _configurations_line(profile) -> str:
    """How many configurations the speed spread is fitted from, and how well that pins the population's speed
    (from the profile's ``fitted``, as the profiler's summary reads it)."""
    runs = sum(m.run_id is not None for m in profile.epoch_measurements)
    v = (profile.fitted or {}).get("variation")
    if not runs or not v:
        return ""
    return (
        f"; configurations: {v['configs']} ({runs} from runs), config σ {v['config_sigma_fit']:.2f}, their mean "
        f"speed known to ±{math.expm1(v['config_mean_se']):.0%}"
    )


def _overlap_line(o) -> str:
    """How much slower one start is while another runs beside it (the profile's ``startup_overlap``)."""
    return (
        f"; {o.instance_type} starts side by side: boot {o.boot_alone_s:.2f} → {o.boot_overlapped_s:.2f} s, "
        f"{o.workers} workers {o.workers_alone_s:.2f} → {o.workers_overlapped_s:.2f} s"
    )


def _tune_line(t) -> str:
    """Ray Tune's own trial start (the profile's ``tune_trial_start``: the ASHA baseline's), where measured."""
    if t is None:
        return ""
    alone, together = sum(t.serial_s) / len(t.serial_s), sum(t.concurrent_s) / len(t.concurrent_s)
    line = f"; Ray Tune trial start {alone:.2f} s alone, {together:.2f} s with {t.concurrent} at once"
    if t.busy_concurrent_s:
        busy = sum(t.busy_concurrent_s) / len(t.busy_concurrent_s)
        line += f", {busy:.2f} s with {t.busy_concurrent} at once among training trials"
    return line


def _run_with_progress(spec, options):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from rubberband.profiler.runner import run_profile

    columns = (
        TextColumn("[bold]profile[/]"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn(f"/ {format_duration(options.budget_s)}"),
        TextColumn("{task.description}"),
    )
    console = stderr()
    # Live bar on a terminal only: captured stderr stays clean (errors are one line).
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("starting", total=1)

        def update(message: str, completed: int, total: int) -> None:
            bar.update(task, description=message, completed=completed, total=total)

        return run_profile(spec, options, progress=update)


def _print_summary(result, out: Path) -> None:
    from rich.table import Table

    import numpy as np

    console = stdout()
    profile = result.profile
    table = Table(title=f"Profile of {profile.workload.name} → {out}", title_justify="left")
    for column in ("device", "workers", "nodes", "iterations", "median ms", "p90 ms"):
        table.add_column(column, justify="right")
    for m in profile.measurements:
        lat = np.asarray(m.iteration_latencies_s) * 1e3
        table.add_row(
            m.device,
            str(m.workers),
            str(m.nodes),
            str(len(lat)),
            f"{np.median(lat):.1f}",
            f"{np.quantile(lat, 0.9):.1f}",
        )
    console.print(table)
    w = profile.workload
    line = (
        f"dataset {w.dataset_size} samples, batch {w.batch_size_per_worker} per worker; "
        f"restart overhead {w.restart_overhead_s:.2f} s"
        + (f" (fresh processes: {w.restart_overhead_cold_s:.2f} s)" if w.restart_overhead_cold_s else "")
        + f"; per epoch outside iterations {w.epoch_overhead_s:.3f} s; task start {w.task_start_s:.3f} s; "
        f"new instance's workers {w.worker_start_s:.2f} s"
        + "".join(f"; termination {np.median(t.samples_s):.2f} s" for t in profile.termination)
        + "".join(_overlap_line(o) for o in profile.startup_overlap)
        + _tune_line(profile.tune_trial_start)
        + f"; took {format_duration(result.wall_s)}"
    )
    console.print(line, soft_wrap=True)
    v = (profile.fitted or {}).get("variation")
    if v and v.get("configs"):
        console.print(
            f"{v['configs']} configurations, {v['epochs']} whole epochs: per-epoch σ "
            f"{v['epoch_sigma_fit']:.3f} (planned {v['epoch_sigma']:.3f}), configuration speed σ "
            f"{v['config_sigma_fit']:.3f} (planned {v['config_sigma']:.3f}), typical configuration "
            f"{math.exp(v['config_log_mean']):.2f}× the profiled one's epoch time (known to "
            f"±{math.expm1(v.get('config_mean_se', 0.0)):.0%}; `--from-run` adds a run's first stage)",
            soft_wrap=True,
        )
    notes = stderr()
    for note in result.notes:
        notes.print(f"note: {note}", soft_wrap=True)
