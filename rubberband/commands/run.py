"""``rubberband run``: execute a plan (or plan first), or resume a run after the executor died."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from pathlib import Path

import typer

from rubberband.catalog import load_catalog
from rubberband.commands._options import deadline_flag
from rubberband.commands.plan import print_plan
from rubberband.console import stderr, stdout
from rubberband.errors import InputError, PlanFileError, RunDirError
from rubberband.inputs import load_job_inputs
from rubberband.plan import Plan, load_plan, write_plan
from rubberband.planning import plan_from_inputs
from rubberband.spec import JobSpec, load_spec
from rubberband.units import format_duration, format_usd

ORDER = 10


def runs_root() -> Path:
    """Where run directories go by default: ``$RUBBERBAND_RUNS_DIR`` or ``./runs``."""
    return Path(os.environ.get("RUBBERBAND_RUNS_DIR", "runs"))


def resolve_run_dir(value: str) -> Path:
    """A run directory given as a path or as a run id under :func:`runs_root`."""
    path = Path(value)
    if path.is_dir():
        return path
    candidate = runs_root() / value
    if candidate.is_dir():
        return candidate
    raise RunDirError(f"run {value!r} not found: no directory {path} or {candidate}; pass a run directory or id")


def _executor_alive(pid: int | None) -> bool:
    if not pid or pid == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "rubberband" in cmdline or "controller" in cmdline


def _load_or_make_plan(spec: JobSpec, spec_path: Path, plan_path: Path | None, cloud: str | None,
                       deadline_s: float | None) -> tuple[Plan, bool]:
    """The plan from ``--plan``, or a fresh one (shown to the user); ``True`` when it was just made."""
    from rubberband.executor.controller import check_plan_matches

    if plan_path is not None:
        plan = load_plan(plan_path)
        check_plan_matches(spec, plan, source=str(plan_path))
        return plan, False
    plan = plan_from_inputs(load_job_inputs(spec_path, cloud=cloud), deadline_s=deadline_s, cloud=cloud)
    check_plan_matches(spec, plan, source="the new plan")
    print_plan(plan)
    return plan, True


def check_cloud_choice(spec: JobSpec, plan: Plan | None, cloud: str) -> None:
    """``--cloud aws|gcp`` must be a cloud the spec allows, and the plan (when given) must run on it."""
    from rubberband.cloud.registry import CLOUD_PROVIDERS

    if cloud not in CLOUD_PROVIDERS:
        raise InputError(f"--cloud {cloud!r} cannot be dry-run; use one of {', '.join(CLOUD_PROVIDERS)}")
    if cloud not in spec.resources.clouds:
        raise InputError(f"--cloud {cloud} is not in the spec's resources.clouds "
                         f"({', '.join(spec.resources.clouds)}); add it there or pick one of those")
    if plan is not None:
        clouds = sorted({s.cloud for s in plan.stages})
        if clouds != [cloud]:
            raise PlanFileError(f"the plan uses instances of {', '.join(clouds)} but --cloud is {cloud}; "
                                f"plan for {cloud} (`rubberband plan SPEC --cloud {cloud}`)")


def dry_run_plan(plan: Plan, cloud: str) -> None:
    """Print the plan's provisioning schedule, expected bill and permission checks; create nothing.

    Unknown instance types or regions fail before any cloud call (CatalogError, exit 2); a
    denied permission or missing credentials is a one-line error with exit 2 (fix the input:
    the credentials), not a run failure.
    """
    from rubberband.cloud.dryrun import dry_run, render_dry_run
    from rubberband.cloud.registry import ProviderPool
    from rubberband.errors import CloudError

    catalog = load_catalog([cloud])
    for stage in plan.stages:
        catalog.find(stage.instance_type, cloud=stage.cloud, region=stage.region)
    try:
        report = dry_run(plan, ProviderPool(), catalog=catalog)
    except CloudError as exc:
        if exc.kind == "fatal":
            raise InputError(f"dry run on {cloud}: {exc.message}") from None
        raise
    stdout().print(render_dry_run(report))
    stdout().print(f"dry run only: nothing was created on {cloud}", markup=False, highlight=False)


def _raise_interrupted(signum, frame) -> None:
    from rubberband.executor.controller import Interrupted

    raise Interrupted(f"run stopped by signal {signal.Signals(signum).name}; every instance was terminated")


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        spec_path: Path = typer.Argument(None, metavar="SPEC", help="Job spec YAML (optional with --resume)."),
        plan_path: Path = typer.Option(None, "--plan", help="Plan JSON from `rubberband plan`; "
                                       "without it the job is planned first."),
        cloud: str = typer.Option(None, "--cloud", help="Backend to run on: local, aws or gcp; default: the plan's cloud."),
        run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (default runs/<run id>)."),
        resume: str = typer.Option(None, "--resume", metavar="RUN_DIR",
                                   help="Continue a run whose executor died, from its journal."),
        deadline: str = typer.Option(None, "--deadline", help="Override the spec's deadline (90m, 2h...)."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before starting a freshly made plan."),
        dry_run: bool = typer.Option(False, "--dry-run", help="With --cloud aws|gcp: print the provisioning "
                                     "schedule, expected bill and permission checks; create nothing."),
        trial_runtime: str = typer.Option("rubberband.executor.trials", "--trial-runtime", hidden=True,
                                          envvar="RUBBERBAND_TRIAL_RUNTIME"),
    ) -> int:
        """Run a tuning job on elastic instances (or resume one) and write RUN_DIR/result.json."""
        from rubberband.executor import journal as J
        from rubberband.executor.backends import make_backend
        from rubberband.executor.controller import Controller, check_plan_matches
        from rubberband.executor.progress import ProgressView
        from rubberband.executor.runtime import TrialRuntime, planner_replanner

        deadline_s = deadline_flag(deadline)
        if dry_run:
            if resume is not None:
                raise InputError("--dry-run cannot be combined with --resume")
            if spec_path is None:
                raise InputError("missing SPEC: --dry-run needs a job spec YAML")
            if cloud is None:
                raise InputError("--dry-run needs --cloud aws or --cloud gcp")
            spec = load_spec(spec_path)
            check_cloud_choice(spec, None, cloud)
            plan, _ = _load_or_make_plan(spec, spec_path, plan_path, cloud, deadline_s)
            check_cloud_choice(spec, plan, cloud)
            dry_run_plan(plan, cloud)
            return 0
        if resume is not None:
            directory = resolve_run_dir(resume)
            state = J.read_state(directory)
            events = J.iter_events(directory / J.JOURNAL_NAME)
            last_pid = None
            for event in events:
                if event["type"] in (J.RUN_STARTED, J.RUN_RESUMED):
                    last_pid = event.get("pid")
            if state.status == "running" and _executor_alive(last_pid):
                raise RunDirError(f"run {state.run_id} is still being executed by process {last_pid}; "
                                  f"stop it first (or `rubberband down {directory}`)")
            if spec_path is not None:
                spec = load_spec(spec_path)
                if spec.sha256() != state.spec_sha256:
                    raise RunDirError(f"{directory} is a run of another job (spec sha256 {state.spec_sha256[:12]} "
                                      f"≠ {spec.sha256()[:12]} of {spec_path}); pass that job's spec or no spec")
            else:
                spec = JobSpec.model_validate(state.spec)
            if state.finished:
                raise RunDirError(f"run {state.run_id} in {directory} already finished; nothing to resume "
                                  f"(results in {directory / 'result.json'})")
            plan = Plan.model_validate(state.plan)
            if plan_path is not None:
                raise PlanFileError("--plan cannot be combined with --resume: the run continues with the plan in "
                                    "its journal")
            check_plan_matches(spec, plan, source=str(directory / J.JOURNAL_NAME))
            run_id, run_directory = state.run_id, directory
            deadline_s = deadline_s or state.deadline_s
        else:
            if spec_path is None:
                raise InputError("missing SPEC: pass a job spec YAML (or --resume RUN_DIR)")
            spec = load_spec(spec_path)
            plan, fresh = _load_or_make_plan(spec, spec_path, plan_path, cloud, deadline_s)
            if fresh and not yes:
                if not sys.stdin.isatty():
                    raise InputError("not starting without confirmation; pass --yes to run the plan shown")
                if not typer.confirm("Start this run?", default=True):
                    return 1
            run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
            run_directory = run_dir or runs_root() / run_id
            if (run_directory / J.JOURNAL_NAME).exists():
                raise RunDirError(f"{run_directory} already holds a run; pass --resume {run_directory} to continue "
                                  f"it or choose another --run-dir")
        clouds = {s.cloud for s in plan.stages}
        backend_cloud = cloud or next(iter(clouds))
        if clouds != {backend_cloud}:
            raise PlanFileError(f"the plan uses instances of {', '.join(sorted(clouds))} but --cloud is "
                                f"{backend_cloud}; plan for that cloud (resources.clouds) or drop --cloud")
        backend = make_backend(backend_cloud, run_directory, regions=[s.region for s in plan.stages])
        catalog = load_catalog([backend_cloud])
        for stage in plan.stages:  # fail before anything starts if a type is unknown
            catalog.find(stage.instance_type, cloud=stage.cloud, region=stage.region)
        runtime = TrialRuntime.load(trial_runtime)
        profile = None
        if spec.profile_path() is not None and spec.profile_path().exists():
            from rubberband.profile import load_profile

            profile = load_profile(spec.profile_path())
        replanner = planner_replanner(catalog, profile) if profile is not None else None
        run_directory.mkdir(parents=True, exist_ok=True)
        write_plan(plan, run_directory / "plan.json")
        err = stderr()
        err.print(f"{'resuming' if resume else 'starting'} run {run_id} in {run_directory}", markup=False,
                  highlight=False)
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            with ProgressView(err) as view:
                controller = Controller(spec=spec, plan=plan, catalog=catalog, run_dir=run_directory,
                                        backend=backend, runtime=runtime, run_id=run_id, replanner=replanner,
                                        profile=profile, progress=view, deadline_s=deadline_s)
                result = controller.run(resume=resume is not None)
        finally:
            signal.signal(signal.SIGTERM, previous)
        summary = result.result
        best = summary.get("best") or {}
        typer.echo(f"run {run_id} finished: best trial {best.get('trial_id')} {spec.metric.name}={best.get('metric')} "
                   f"config={best.get('config')}")
        typer.echo(f"JCT {format_duration(summary['actual']['jct_s'])} (predicted "
                   f"{format_duration(summary['predicted']['jct_s'])}), cost {format_usd(summary['actual']['cost_usd'])} "
                   f"(predicted {format_usd(summary['predicted']['cost_usd'])}); results in "
                   f"{run_directory / 'result.json'}")
        return 0
