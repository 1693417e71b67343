"""Run a plan with the executor on a backend, and say how it ended.

One place for what ``rubberband run`` does once the backend is chosen, shared by the CLI machine
(``--cloud local``, ``--head local``) and the run's head instance, where the CLI submits it as a
Ray job (:mod:`rubberband.head_job`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from rubberband.catalog import Catalog
from rubberband.console import stderr
from rubberband.errors import InputError
from rubberband.plan import Plan, write_plan
from rubberband.spec import JobSpec
from rubberband.units import format_duration, format_usd


def _raise_interrupted(signum: int, frame: Any) -> None:
    from rubberband.executor.stopping import Interrupted

    raise Interrupted(f"run stopped by signal {signal.Signals(signum).name}; every instance was terminated")


@dataclass(frozen=True)
class Execution:
    """What ``rubberband run`` hands the executor once the backend is chosen.

    ``profile_path``: the job's profile when it is not where the spec says (a copy shipped to the head).
    ``overrun_s``: how long a late run goes on past its deadline before it is stopped (math.inf: no limit).
    ``on_late``: at a stage boundary where no plan meets the deadline any more, ``finish`` (go on, be late) or
    ``stop`` (stop now with the best so far). ``simulate``: run the executor on a simulated cluster on virtual
    time (``--cloud sim``, :mod:`rubberband.executor.simulated`): ``backend`` and ``trial_runtime`` are ignored,
    the profile is required.
    """

    spec: JobSpec
    plan: Plan
    catalog: Catalog
    run_id: str
    run_dir: Path
    backend: Any = None
    trial_runtime: str = "rubberband.executor.trials"
    deadline_s: float | None = None
    resume: bool = False
    profile_path: Path | None = None
    overrun_s: float = 0.0
    on_late: str = "finish"
    simulate: bool = False
    #: when the user's command began (POSIX seconds): the result reports how much of the user's wait went before the
    #: executor started (the CLI's loading and planning; in head mode the head's boot and the upload); None: unknown
    #: (always so when simulated)
    commanded_at: float | None = None


def execute(run: Execution) -> Any:
    """Run (or resume) the plan to the end; progress goes to stderr. Returns the RunResult (a stopped run is
    returned, ``status: stopped``, not raised)."""
    from rubberband.executor.progress import ProgressView
    from rubberband.executor.run import Executor, Job, Settings, Target
    from rubberband.executor.runtime import TrialRuntime, planner_replanner

    spec, plan = run.spec, run.plan
    profile_path = run.profile_path or spec.profile_path()
    profile = None
    if profile_path is not None and profile_path.exists():
        from rubberband.profile import load_profile

        profile = load_profile(profile_path)
    job = Job(spec, plan, run.catalog, profile)
    if run.simulate:
        if profile is None:
            raise InputError(
                f"--cloud sim plays the job from its profile, and there is none at {profile_path}; "
                f"profile the job first (`rubberband profile`) or set the spec's profile"
            )
        from rubberband.executor.simulated import simulated_for

        from rubberband.executor.journal import Journal

        sim = simulated_for(job)
        journal = Journal(run.run_dir, clock=sim.clock, durable=False)  # never resumed: no fsync
        target = Target(
            run.run_id, run.run_dir, sim.backend, sim.runtime, cluster=sim.cluster, clock=sim.clock, journal=journal
        )
    else:
        target = Target(run.run_id, run.run_dir, run.backend, TrialRuntime.load(run.trial_runtime))
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_plan(plan, run.run_dir / "plan.json")
    _announce(run)
    settings = Settings(
        deadline_s=run.deadline_s,
        overrun_s=run.overrun_s,
        on_late=run.on_late,
        commanded_at=None if run.simulate else run.commanded_at,
    )
    replanner = planner_replanner(run.catalog, profile) if profile is not None else None
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        with ProgressView(stderr()) as view:
            executor = Executor(job, target, settings, replanner=replanner, progress=view)
            return executor.run(resume=run.resume)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _announce(run: Execution) -> None:
    err = stderr()
    verb = "resuming" if run.resume else "starting"
    err.print(f"{verb} run {run.run_id} in {run.run_dir}", markup=False, highlight=False)
    if run.simulate:
        err.print(
            f"simulated: {run.plan.stages[0].cloud} instances and trials played on virtual time from the profile; "
            f"nothing is started or billed, and the metrics are stand-ins",
            markup=False,
            highlight=False,
        )


def print_summary(run_id: str, metric: str, summary: dict[str, Any], result_path: Path) -> None:
    """The lines ``rubberband run`` prints at the end (stdout), from a run's result.json content: the best
    configuration (so far), actual versus predicted, the run's actual cost and JCT beside the best static
    plan's (predicted: the planner's baseline, never run) with the ratio when the plan had one, and the
    outcome in one line with its exit code."""
    from rubberband.executor.outcome import outcome_line

    best = summary.get("best") or {}
    rung = best.get("rung") or {}
    at = f" (stage {rung['stage']}, {rung['epochs']} epochs)" if rung.get("stage") is not None else ""
    typer.echo(
        f"run {run_id} {summary.get('status', 'finished')}: best trial {best.get('trial_id')} "
        f"{metric}={best.get('metric')}{at} config={best.get('config')}"
    )
    typer.echo(
        f"JCT {format_duration(summary['actual']['jct_s'])} (predicted "
        f"{format_duration(summary['predicted']['jct_s'])}), cost {format_usd(summary['actual']['cost_usd'])} "
        f"(predicted {format_usd(summary['predicted']['cost_usd'])}); results in {result_path}"
    )
    typer.echo(outcome_line(summary))
    static = summary.get("static")
    if static and static.get("cost_ratio") is not None:
        actual = summary["actual"]
        saved = static["predicted_cost_usd"] - actual["cost_usd"]
        typer.echo(
            f"vs best static plan ({static['instances']} × {static['instance_type']}, "
            f"{static['workers_per_trial']} worker{'s' if static['workers_per_trial'] > 1 else ''}/trial; "
            f"predicted): JCT {format_duration(static['predicted_jct_s'])}, cost "
            f"{format_usd(static['predicted_cost_usd'])}; this run: JCT {format_duration(actual['jct_s'])}, "
            f"cost {format_usd(actual['cost_usd'])} = {static['cost_ratio']:.2f}× the static cost "
            f"({'saved' if saved >= 0 else 'spent'} {format_usd(abs(saved))}"
            f"{'' if saved >= 0 else ' more'})"
        )
