"""``rubberband run``: execute a plan (or plan first), or resume a run after the executor died."""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import typer

from rubberband.catalog import load_catalog
from rubberband.cloud.boots import BootPlayer
from rubberband.commands._injected import injected
from rubberband.commands._options import deadline_flag, on_late_flag, overrun_flag
from rubberband.commands.plan import print_plan
from rubberband.clouds import rented_clouds
from rubberband.console import stderr, stdout
from rubberband.errors import InputError, PlanFileError, RunDirError
from rubberband.executor.backends import SIM_CLOUD, SIM_RUNTIME
from rubberband.inputs import CLOUD_CHOICES, load_job_inputs
from rubberband.plan import Plan, load_plan, write_plan
from rubberband.planning import PlanningOptions, plan_from_inputs
from rubberband.spec import JobSpec, load_spec

if TYPE_CHECKING:
    from rubberband.cloud.head_session import HeadOptions, RunJob
    from rubberband.commands._early_head import EarlyHead

ORDER = 10


def runs_root() -> Path:
    """Where run directories go by default: ``$RUBBERBAND_RUNS_DIR`` or ``./runs``."""
    return Path(os.environ.get("RUBBERBAND_RUNS_DIR", "runs"))


def resolve_run_dir(value: str) -> Path:
    """A run directory given as a path or as a run id under :func:`runs_root`."""
    path = Path(value)
    if path.is_dir():
        return path.absolute()
    candidate = runs_root() / value
    if candidate.is_dir():
        return candidate.absolute()
    raise RunDirError(f"run {value!r} not found: no directory {path} or {candidate}; pass a run directory or id")


def _journaled(directory: Path, state) -> tuple[JobSpec, Plan]:
    """The spec and plan a run's journal holds, or RunDirError when the journal's copy is damaged."""
    from pydantic import ValidationError

    from rubberband.executor import journal as J

    try:
        return JobSpec.model_validate(state.spec), Plan.model_validate(state.plan)
    except (ValidationError, TypeError, ValueError) as exc:
        field = ".".join(str(p) for p in exc.errors()[0]["loc"]) if isinstance(exc, ValidationError) else "?"
        raise RunDirError(
            f"{directory / J.JOURNAL_NAME}: the journaled spec or plan is damaged (field '{field}'); "
            f"the run cannot be resumed from it; `rubberband down {directory}` ends its "
            f"instances"
        ) from None


def _executor_alive(pid: int | None) -> bool:
    if not pid or pid == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "rubberband" in cmdline or "controller" in cmdline


@dataclass(frozen=True)
class PlanSource:
    """Where a run's plan comes from: ``--plan``'s file (``plan_path``), else a fresh plan of the spec at
    ``spec_path`` for ``cloud`` and ``deadline_s`` (each None: the spec's), billing the run's head instance as
    ``--head`` (``head``) and ``--results-grace`` (``head_grace_s``) will run it. ``spec_path`` is None when no SPEC
    was given (a resumed or attached run needs none)."""

    spec_path: Path | None
    plan_path: Path | None
    cloud: str | None
    deadline_s: float | None
    head: str = "instance"
    head_grace_s: float | None = None
    fork_workers: bool = False  # planning may fork a worker (the CLI's own process: Injected.fork_workers)


def _load_or_make_plan(
    spec: JobSpec, source: PlanSource, begin: Callable[[], None] = lambda: None
) -> tuple[Plan, bool]:
    """The plan from ``--plan``, or a fresh one (shown to the user); ``True`` when it was just made. ``begin``: called
    once a plan is to be made and its inputs (spec, profile, catalog) have loaded, just before the planning."""
    from rubberband.executor.plan_checks import check_plan_matches

    if source.plan_path is not None:
        plan = load_plan(source.plan_path)
        check_plan_matches(spec, plan, source=str(source.plan_path))
        if plan.job.spec_sha256 != spec.sha256():
            stderr().print(
                f"note: {source.plan_path} was made for another version of this spec (its search space, profile or "
                f"config differ); its predictions may not hold: re-plan with `rubberband plan` to be sure",
                markup=False,
                highlight=False,
            )
        return plan, False
    inputs = load_job_inputs(source.spec_path, cloud=source.cloud)
    begin()
    plan = plan_from_inputs(
        inputs,
        deadline_s=source.deadline_s,
        cloud=source.cloud,
        options=PlanningOptions(head=source.head, head_grace_s=source.head_grace_s, fork_workers=source.fork_workers),
    )
    check_plan_matches(spec, plan, source="the new plan")
    print_plan(plan)
    return plan, True


@dataclass(frozen=True)
class RunStart:
    """A run about to be executed: its spec and plan, its id and run directory, its deadline (None: the plan's),
    whether it continues from its journal (``resumed``), and its head when that began before the plan was made
    (``early_head``: rubberband/commands/_early_head.py; the executor runs on its backend)."""

    spec: JobSpec
    plan: Plan
    run_id: str
    run_dir: Path
    deadline_s: float | None
    resumed: bool = False
    early_head: EarlyHead | None = None


def _resumed(resume: str, source: PlanSource) -> RunStart:
    """``--resume RUN_DIR``: the run its journal holds, checked: not simulated, not still executed, not finished, of
    the spec given (if one is), without ``--plan``; its journaled deadline unless ``--deadline`` overrides it."""
    from rubberband.executor import journal as J
    from rubberband.executor.plan_checks import check_plan_matches
    from rubberband.executor.tracking import check_tracking
    from rubberband.search import check_search

    directory = resolve_run_dir(resume)
    state = J.read_state(directory)
    last_pid = None
    for event in J.iter_events(directory / J.JOURNAL_NAME):
        if event["type"] in (J.RUN_STARTED, J.RUN_RESUMED):
            last_pid = event.get("pid")
        if event["type"] == J.RUN_STARTED and event.get("trial_runtime") == SIM_RUNTIME:
            raise RunDirError(f"{directory} is a simulated run (--cloud sim); it is not resumed: run the spec again")
    if state.status == "running" and _executor_alive(last_pid):
        raise RunDirError(
            f"run {state.run_id} is still being executed by process {last_pid}; "
            f"stop it first (or `rubberband down {directory}`)"
        )
    journaled_spec, plan = _journaled(directory, state)
    spec = journaled_spec if source.spec_path is None else _same_job(source.spec_path, state, directory)
    if state.finished:
        raise RunDirError(
            f"run {state.run_id} in {directory} already finished; nothing to resume "
            f"(results in {directory / 'result.json'})"
        )
    if source.plan_path is not None:
        raise PlanFileError("--plan cannot be combined with --resume: the run continues with the plan in its journal")
    check_plan_matches(spec, plan, source=str(directory / J.JOURNAL_NAME))
    check_search(spec)
    check_tracking(spec)
    return RunStart(spec, plan, state.run_id, directory, source.deadline_s or state.deadline_s, resumed=True)


def _same_job(spec_path: Path, state, directory: Path) -> JobSpec:
    """The SPEC given with ``--resume``, which must be the spec the journal's run (``state``) was started with."""
    spec = load_spec(spec_path)
    if spec.sha256() != state.spec_sha256:
        raise RunDirError(
            f"{directory} is a run of another job (spec sha256 "
            f"{str(state.spec_sha256)[:12]} ≠ {spec.sha256()[:12]} of {spec_path}); pass "
            f"that job's spec or no spec"
        )
    return spec


def _fresh(source: PlanSource, *, yes: bool, run_dir: Path | None, simulate: bool = False) -> RunStart | None:
    """A new run of SPEC with the plan from ``source`` (a fresh one is confirmed first unless ``--yes``; None: the
    user declined), in ``--run-dir`` or ``runs/<run id>``. On a backend whose nodes are this machine's, a plan to be
    made has the run's head begin once the plan's inputs have loaded, so it comes up while the plan is made (not
    for ``simulate``: ``--cloud sim`` has no head; not with ``--plan``: nothing to overlap); the head is stopped
    again, its directory removed, when the run does not start (rubberband/commands/_early_head.py)."""
    from rubberband.commands._early_head import early_head_for
    from rubberband.executor import journal as J
    from rubberband.executor.tracking import check_tracking
    from rubberband.search import check_search

    if source.spec_path is None:
        raise InputError("missing SPEC: pass a job spec YAML (or --resume RUN_DIR)")
    spec = load_spec(source.spec_path)
    check_search(spec)  # an Optuna sampler without Optuna fails before planning
    check_tracking(spec)  # so do trackers without their package, or an MLflow server that does not answer
    run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    # absolute: Ray's temp dirs under it must be absolute, and the journal names it for --resume
    directory = (run_dir or runs_root() / run_id).absolute()
    if (directory / J.JOURNAL_NAME).exists():
        raise RunDirError(
            f"{directory} already holds a run; pass --resume {directory} to continue it or choose another --run-dir"
        )
    confirms = not yes and sys.stdin.isatty()
    early: EarlyHead | None = None

    def begin() -> None:  # a plan is to be made, its inputs are sound, and the run will start unless declined
        nonlocal early
        if not simulate and (yes or confirms):
            clouds = spec.resources.clouds
            early = early_head_for(source.cloud or (clouds[0] if len(clouds) == 1 else None), directory)
            if early is not None:  # held before it starts: whatever interrupts it from now on stops it
                early.begin(run_id)

    try:
        plan, fresh = _load_or_make_plan(spec, source, begin)
        if fresh and not yes:
            if not confirms:
                raise InputError("not starting without confirmation; pass --yes to run the plan shown")
            if not typer.confirm("Start this run?", default=True):
                if early is not None:
                    early.cancel()
                return None
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    return RunStart(spec, plan, run_id, directory, source.deadline_s, early_head=early)


def _backend_cloud(plan: Plan, cloud: str | None) -> str:
    """The cloud the run's backend drives: ``--cloud``, else the plan's (whose stages must all be on it)."""
    clouds = {s.cloud for s in plan.stages}
    backend_cloud = cloud or next(iter(clouds))
    if clouds != {backend_cloud}:
        raise PlanFileError(
            f"the plan uses instances of {', '.join(sorted(clouds))} but --cloud is "
            f"{backend_cloud}; plan for that cloud (resources.clouds) or drop --cloud"
        )
    return backend_cloud


def note_head_billing(plan: Plan, head_mode: bool) -> None:
    """Say on stderr when the plan's predictions and this run disagree on paying for a head instance."""
    from rubberband.units import format_usd

    if plan.head is not None and not head_mode:
        stderr().print(
            f"note: the plan's predictions include a head instance "
            f"({format_usd(plan.predicted.cost_breakdown.head_usd)}) this run does not pay for "
            f"(plan with `--head local` to leave it out)",
            markup=False,
            highlight=False,
        )
    elif plan.head is None and head_mode:
        stderr().print(
            "note: the plan's predictions leave out the run's head instance, which result.json "
            "bills (plan without `--head local` to include it)",
            markup=False,
            highlight=False,
        )


def check_cloud_choice(spec: JobSpec, plan: Plan | None, cloud: str) -> None:
    """``--cloud aws|gcp`` must be a cloud the spec allows, and the plan (when given) must run on it."""
    from rubberband.cloud.registry import CLOUD_PROVIDERS

    if cloud not in CLOUD_PROVIDERS:
        raise InputError(f"--cloud {cloud!r} cannot be dry-run; use one of {', '.join(CLOUD_PROVIDERS)}")
    if cloud not in spec.resources.clouds:
        raise InputError(
            f"--cloud {cloud} is not in the spec's resources.clouds "
            f"({', '.join(spec.resources.clouds)}); add it there or pick one of those"
        )
    if plan is not None:
        clouds = sorted({s.cloud for s in plan.stages})
        if clouds != [cloud]:
            raise PlanFileError(
                f"the plan uses instances of {', '.join(clouds)} but --cloud is {cloud}; "
                f"plan for {cloud} (`rubberband plan SPEC --cloud {cloud}`)"
            )


def check_plan_types(plan: Plan, catalog) -> None:
    """Every type the plan names (its stages' and their spot fall-backs') is in ``catalog`` (else CatalogError)."""
    for stage in plan.stages:
        for name in filter(None, (stage.instance_type, stage.fallback_instance_type)):
            catalog.find(name, cloud=stage.cloud, region=stage.region)


def dry_run_plan(
    plan: Plan,
    cloud: str,
    *,
    include_head: bool = True,
    instance_profile: str | None = None,
    service_account: str | None = None,
) -> None:
    """Print the plan's provisioning schedule, expected bill and permission checks; create nothing.

    Unknown instance types or regions fail before any cloud call (CatalogError, exit 2); a
    denied permission or missing credentials is a one-line error with exit 2 (fix the input:
    the credentials), not a run failure.
    """
    from rubberband.cloud.dryrun import dry_run, render_dry_run
    from rubberband.cloud.registry import ProviderPool
    from rubberband.errors import CloudError

    catalog = load_catalog([cloud])
    check_plan_types(plan, catalog)
    try:
        identity_checks = []
        if include_head:  # the head's own identity: it exists and may do what the run needs
            from rubberband.cloud.head_session import HeadOptions
            from rubberband.cloud.registry import head_mode

            flags = HeadOptions(instance_profile=instance_profile, service_account=service_account)
            identity_checks = head_mode(cloud).check_identity(flags, "dry-run")
        report = dry_run(plan, ProviderPool(), catalog=catalog, include_head=include_head, extra_checks=identity_checks)
    except CloudError as exc:
        if exc.kind == "fatal":
            raise InputError(f"dry run on {cloud}: {exc.message}") from None
        raise
    stdout().print(render_dry_run(report))
    stdout().print(f"dry run only: nothing was created on {cloud}", markup=False, highlight=False)


def _dry_run(source: PlanSource, flags: HeadFlags, *, resume: str | None) -> int:
    """``--dry-run``: the plan (``--plan``'s, else a fresh one) for ``--cloud aws|gcp``, dry-run there."""
    if resume is not None:
        raise InputError("--dry-run cannot be combined with --resume")
    if source.spec_path is None:
        raise InputError("missing SPEC: --dry-run needs a job spec YAML")
    cloud = source.cloud
    if cloud is None:
        raise InputError("--dry-run needs --cloud aws or --cloud gcp")
    spec = load_spec(source.spec_path)
    check_cloud_choice(spec, None, cloud)
    plan, _ = _load_or_make_plan(spec, source)
    check_cloud_choice(spec, plan, cloud)
    dry_run_plan(
        plan,
        cloud,
        include_head=source.head == "instance",
        instance_profile=flags.instance_profile,
        service_account=flags.service_account,
    )
    return 0


@dataclass(frozen=True)
class HeadFlags:
    """``rubberband run``'s head-mode flags as given: how the CLI reaches the head over SSH (``--ssh-cidr``,
    ``--ssh-key``, ``--key-name``, ``--ssh-user``), the head's identity (``--instance-profile`` on AWS,
    ``--service-account`` on GCP), how GCP workers reach the internet (``--worker-egress``) and the watchdog's
    ``--stall-timeout``, kept as text: only a run on a head instance reads it (:meth:`options`)."""

    ssh_cidr: str | None = None
    ssh_key: Path | None = None
    key_name: str | None = None
    ssh_user: str = "ubuntu"
    worker_egress: str | None = None
    instance_profile: str | None = None
    service_account: str | None = None
    stall_timeout: str = "60m"

    def options(self, deadline_s: float, overrun_s: float, grace_s: float | None) -> HeadOptions:
        """The head's options for a run of ``deadline_s`` (+ ``overrun_s`` when late): its watchdog ends a run that
        made no progress for ``--stall-timeout`` and waits ``grace_s`` (``--results-grace``) for the CLI to fetch a
        finished run's results; the head's hard cap comes from the plan: deadline + overrun + results grace (+ boot
        margin)."""
        from rubberband.cloud.bootstrap import WatchdogSettings, lifetime_cap_s
        from rubberband.cloud.head_session import HeadOptions

        watchdog = WatchdogSettings(
            stall_timeout_s=deadline_flag(self.stall_timeout, "--stall-timeout"),
            done_grace_s=grace_s,
            max_lifetime_s=lifetime_cap_s(deadline_s, overrun_s, grace_s),
        )
        return HeadOptions(
            ssh_cidr=self.ssh_cidr,
            ssh_key=self.ssh_key,
            key_name=self.key_name,
            ssh_user=self.ssh_user,
            watchdog=watchdog,
            instance_profile=self.instance_profile,
            service_account=self.service_account,
            worker_egress=self.worker_egress,
        )


def _check_head_mode(head_mode: bool, flags: HeadFlags, *, detach: bool, resume: str | None) -> None:
    """``--detach`` and ``--worker-egress`` need a run on a head instance, which ``--resume`` cannot continue."""
    if detach and not head_mode:
        raise InputError("--detach needs a run on a head instance (--cloud aws|gcp without --head local)")
    if flags.worker_egress is not None and not head_mode:
        raise InputError("--worker-egress is for a run on a head instance (--cloud gcp without --head local)")
    if head_mode and resume is not None:
        raise InputError(
            f"--resume restarts an executor on this machine; a run on a head instance is "
            f"followed with `rubberband run --attach {resume}` (or pass --head local)"
        )


def _hints(record, run_dir: Path) -> str:
    return (
        f"run {record.run_id} goes on on its head {record.instance_id} ({record.cloud} {record.zone}), which ends "
        f"itself and every worker when the run is over or stalls.\n"
        f"  follow it and fetch results: rubberband run --attach {run_dir} --cloud {record.cloud}\n"
        f"  stop it now:                 rubberband down {run_dir} --cloud {record.cloud}"
    )


def run_on_head(start: RunStart, catalog, options: HeadOptions, job: RunJob, *, detach: bool) -> int:
    """Head mode: start the run's head instance, submit the run to it (its executor run as ``job`` says), then
    follow it (unless ``detach``).

    ``job.boots`` (tests only, injected: commands/_injected.py): the head's and workers' boots are played;
    ``job.metadata_url`` (tests only, injected): where the on-head executor's notice watchers read."""
    from rubberband.cloud.head_session import (
        HeadSession,
        NewRun,
        check_options,
        deliver_token,
        end_run,
        link_for,
        start_head,
    )

    plan, run_id, run_dir, boots = start.plan, start.run_id, start.run_dir, job.boots
    err = stderr()
    if (run_dir / "head.json").exists():
        raise RunDirError(
            f"{run_dir} already holds a run; follow it with --attach {run_dir} or choose another --run-dir"
        )
    check_options(plan.stages[0].cloud, options, boots)
    err.print(
        f"starting the head instance of run {run_id} on {plan.stages[0].cloud} {plan.stages[0].region}",
        markup=False,
        highlight=False,
    )
    record = start_head(
        run=NewRun(run_id, run_dir, metric=start.spec.metric.name),
        plan=plan,
        catalog=catalog,
        options=options,
        boots=boots,
    )
    write_plan(plan, run_dir / "plan.json")
    try:
        token = deliver_token(record, run_dir, options, boots)  # the head's boot waits for it to start Ray
        with HeadSession(
            record,
            link_for(record, boots, options.ssh_key, run_dir),
            connect_timeout_s=options.boot_timeout_s,
            token=token,
        ) as session:
            # the run's result.json bills the head for the watchdog's results grace after the run ends
            session.submit(
                start.spec, plan, replace(job, head_grace_s=options.watchdog.done_grace_s), watchdog=options.watchdog
            )
    except BaseException:
        end_run(record, boots=boots)  # never leave a head without a run billing
        from rubberband.cloud.ray_token import forget_run_token

        forget_run_token(run_dir)
        raise
    err.print(f"submitted run {run_id} to head {record.instance_id} ({record.zone})", markup=False, highlight=False)
    note_head_billing(plan, head_mode=True)
    if detach:
        typer.echo(_hints(record, run_dir), err=True)
        return 0
    return follow(record, run_dir, ssh_key=options.ssh_key, boots=boots)


def run_here(start: RunStart, catalog, backend_cloud: str, job: RunJob, *, simulate: bool) -> int:
    """Execute the run on this machine: on the local backend, on ``backend_cloud``'s instances with the Ray head
    here (``--head local``), or on a simulated cluster playing the plan's cloud (``simulate``: ``--cloud sim``);
    the executor runs as ``job`` says (as a head's would). Returns the run's exit code."""
    from rubberband.cloud.backend import BackendSeams
    from rubberband.cloud.bootstrap import lifetime_cap_s
    from rubberband.execution import Execution, execute, print_summary
    from rubberband.executor.backends import make_backend
    from rubberband.executor.outcome import exit_code

    plan, on_cloud = start.plan, backend_cloud in rented_clouds()
    if on_cloud and not start.resumed and not simulate:
        note_head_billing(plan, head_mode=False)
    backend = (
        None
        if simulate
        else start.early_head.backend  # its head began while the plan was made
        if start.early_head is not None
        else make_backend(
            backend_cloud,
            start.run_dir,
            regions=[s.region for s in plan.stages],
            lifetime_cap_s=lifetime_cap_s(start.deadline_s or plan.deadline_s, job.overrun_s, 0.0)
            if on_cloud
            else None,
            seams=BackendSeams(boots=job.boots, metadata_url=job.metadata_url),
        )
    )
    result = execute(
        Execution(
            spec=start.spec,
            plan=plan,
            catalog=catalog,
            run_id=start.run_id,
            run_dir=start.run_dir,
            backend=backend,
            trial_runtime=job.trial_runtime,
            deadline_s=start.deadline_s,
            overrun_s=job.overrun_s,
            resume=start.resumed,
            on_late=job.on_late,
            simulate=simulate,
            commanded_at=job.commanded_at,
        )
    )
    print_summary(start.run_id, start.spec.metric.name, result.result, start.run_dir / "result.json")
    return exit_code(result.result)  # met 0, late 4, stopped 5 (failures raise: 1, interrupted 130)


def follow(record, run_dir: Path, *, ssh_key: Path | None, boots: BootPlayer | None = None) -> int:
    """Stream a run's progress from its head until it ends, fetch its directory, end its head.

    Ctrl-C detaches: the run goes on, and the hints say how to come back or stop it."""
    import json

    from rubberband.cloud.head_session import HeadSession, end_run, link_for
    from rubberband.cloud.ray_token import read_run_token
    from rubberband.execution import print_summary

    err = stderr()

    def write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    token = read_run_token(run_dir)
    with HeadSession(record, link_for(record, boots, ssh_key, run_dir), token=token) as session:
        try:
            status = session.stream(write)
        except KeyboardInterrupt:
            typer.echo(f"\ndetached. {_hints(record, run_dir)}", err=True)
            return 0
        session.fetch(run_dir)
    end_run(record, boots=boots, echo=lambda line: err.print(line, markup=False, highlight=False))
    from rubberband.cloud.ray_token import forget_run_token

    forget_run_token(run_dir)  # the cluster is gone: its token opens nothing any more
    result_path = run_dir / "result.json"
    if not result_path.exists():
        err.print(
            f"run {record.run_id} ended ({status}) without a result; its logs are above", markup=False, highlight=False
        )
        return 1
    summary = json.loads(result_path.read_text())
    print_summary(record.run_id, record.metric, summary, result_path)
    from rubberband.executor.outcome import exit_code

    if "outcome" in summary:  # met 0, late 4, stopped 5, failed 1, interrupted 130
        return exit_code(summary)
    return 0 if status == "SUCCEEDED" and summary.get("status") == "finished" else 1


def attach_run(run: str, *, run_dir: Path | None, ssh_key: Path | None, boots: BootPlayer | None = None) -> int:
    """``rubberband run --attach RUN_ID_OR_DIR``: follow a run submitted to its head instance."""
    from rubberband.cloud.head_session import HeadRecord, check_head_alive

    directory = run_dir if run_dir is not None else resolve_run_dir(run)
    record = HeadRecord.read(directory)
    check_head_alive(record)
    return follow(record, directory, ssh_key=ssh_key, boots=boots)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        ctx: typer.Context,
        spec_path: Path = typer.Argument(None, metavar="SPEC", help="Job spec YAML (optional with --resume)."),
        plan_path: Path = typer.Option(
            None, "--plan", help="Plan JSON from `rubberband plan`; without it the job is planned first."
        ),
        cloud: str = typer.Option(
            None,
            "--cloud",
            help="Backend to run on: local, aws or gcp; default: the plan's cloud. "
            "'sim': this executor on a simulated cluster of the plan's cloud, on virtual time "
            "(no Ray, no cloud; seconds; docs/executor.md).",
        ),
        run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (default runs/<run id>)."),
        resume: str = typer.Option(
            None, "--resume", metavar="RUN_DIR", help="Continue a run whose executor died, from its journal."
        ),
        deadline: str = typer.Option(None, "--deadline", help="Override the spec's deadline (90m, 2h...)."),
        overrun: str = typer.Option(
            "10%",
            "--overrun",
            help="How far past the deadline a late run goes on before "
            "it is stopped and every instance terminated: a share of the deadline (10%), "
            "a duration (15m), 0 (stop at the deadline) or none (run to the end).",
        ),
        on_late: str = typer.Option(
            "finish",
            "--on-late",
            help="At a stage boundary where no plan meets the "
            "deadline any more (after buying speed was tried): 'finish' (go on, exit 4 "
            "when late) or 'stop' (stop now, never start a stage predicted to miss it; "
            "the best configuration so far is in result.json, exit 5).",
        ),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before starting a freshly made plan."),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help="With --cloud aws|gcp: print the provisioning "
            "schedule, expected bill and permission checks; create nothing.",
        ),
        head: str = typer.Option(
            "instance",
            "--head",
            help="With --cloud aws|gcp: where the executor and Ray head "
            "run: 'instance' (a small CPU head instance per run; close the laptop at will) or "
            "'local' (this machine; it must be inside the cloud network).",
        ),
        detach: bool = typer.Option(False, "--detach", help="Head mode: return once the run is submitted."),
        attach: str = typer.Option(
            None,
            "--attach",
            metavar="RUN_ID_OR_DIR",
            help="Head mode: stream a submitted run again, fetch its results into its run directory, end its head.",
        ),
        ssh_cidr: str = typer.Option(
            None,
            "--ssh-cidr",
            envvar="RUBBERBAND_SSH_CIDR",
            help="Head mode: the only network SSH to the head is allowed from (e.g. 203.0.113.7/32).",
        ),
        ssh_key: Path = typer.Option(
            None,
            "--ssh-key",
            envvar="RUBBERBAND_SSH_KEY",
            help="Head mode: private key file for the SSH tunnel to the head's job server.",
        ),
        key_name: str = typer.Option(
            None,
            "--key-name",
            envvar="RUBBERBAND_KEY_NAME",
            help="Head mode on AWS: the EC2 key pair (public half of --ssh-key) the head starts with.",
        ),
        ssh_user: str = typer.Option("ubuntu", "--ssh-user", help="Head mode: SSH user on the head."),
        worker_egress: str = typer.Option(
            None,
            "--worker-egress",
            metavar="nat|existing|public",
            help="Head mode "
            "on GCP: how workers, which have no external address, reach the internet "
            "for their boot-time installs: 'nat' (default: the run's own subnetwork and a Cloud NAT of it "
            "alone, deleted with it), 'existing' (your network's Cloud NAT or proxy) or "
            "'public' (each worker gets an external address; nothing gets in).",
        ),
        instance_profile: str = typer.Option(
            None,
            "--instance-profile",
            envvar="RUBBERBAND_INSTANCE_PROFILE",
            help="Head mode on AWS: the IAM instance profile the head acts with "
            "(default: one created for the run with the least permissions it "
            "needs, deleted at its end; docs/clouds.md).",
        ),
        service_account: str = typer.Option(
            None,
            "--service-account",
            envvar="RUBBERBAND_SERVICE_ACCOUNT",
            help="Head mode on GCP (required): the service account the head acts with (its role: docs/clouds.md).",
        ),
        stall_timeout: str = typer.Option(
            "60m",
            "--stall-timeout",
            help="Head mode: the head ends the run (and every instance) when it made no progress this long.",
        ),
        results_grace: str = typer.Option(
            "10m",
            "--results-grace",
            help="Head mode: how long a finished run's head waits for the CLI to fetch results before it ends itself.",
        ),
    ) -> int:
        """Run a tuning job on elastic instances (or resume one) and write RUN_DIR/result.json."""
        from rubberband.cloud.head_session import RunJob
        from rubberband.executor.runtime import DEFAULT_TRIAL_RUNTIME

        # tests only, passed in by their entry point (commands/_injected.py): played instance boots
        # (cloud/boots.py: the suite's player), a stand-in trial runtime, a local metadata server serving spot notices
        seams = injected(ctx)
        deadline_s = deadline_flag(deadline)
        overrun_flag(overrun, 1.0)  # the form is checked before anything starts; the seconds need the plan
        on_late = on_late_flag(on_late)
        if head not in ("instance", "local"):
            raise InputError(f"--head {head!r}: use 'instance' (a head instance per run) or 'local' (this machine)")
        grace_s = deadline_flag(results_grace, "--results-grace")
        if cloud is not None and cloud not in (*CLOUD_CHOICES, SIM_CLOUD):
            raise InputError(f"--cloud must be one of {', '.join((*CLOUD_CHOICES, SIM_CLOUD))} (got {cloud!r})")
        if resume is not None and run_dir is not None:
            raise InputError("--resume RUN_DIR continues in that directory; drop --run-dir")
        simulate = cloud == SIM_CLOUD
        if simulate:
            if resume is not None or dry_run or detach or attach is not None:
                raise InputError(
                    "--cloud sim takes none of --resume, --dry-run, --detach, --attach: a simulated run "
                    "takes seconds; run the spec again"
                )
            cloud = None  # plan (or take the plan) for the spec's cloud, and play that cloud
        if attach is not None:
            if spec_path is not None or resume is not None or dry_run or detach:
                raise InputError("--attach takes no SPEC, --resume, --dry-run or --detach: it follows a submitted run")
            return attach_run(attach, run_dir=run_dir, ssh_key=ssh_key, boots=seams.boots)
        source = PlanSource(
            spec_path,
            plan_path,
            cloud,
            deadline_s,
            head=head,
            head_grace_s=grace_s,
            fork_workers=seams.fork_workers,
        )
        flags = HeadFlags(
            ssh_cidr=ssh_cidr,
            ssh_key=ssh_key,
            key_name=key_name,
            ssh_user=ssh_user,
            worker_egress=worker_egress,
            instance_profile=instance_profile,
            service_account=service_account,
            stall_timeout=stall_timeout,
        )
        if dry_run:
            return _dry_run(source, flags, resume=resume)
        start = (
            _resumed(resume, source)
            if resume is not None
            else _fresh(source, yes=yes, run_dir=run_dir, simulate=simulate)
        )
        if start is None:  # the user did not confirm the fresh plan
            return 1
        try:
            backend_cloud = _backend_cloud(start.plan, cloud)
            catalog = load_catalog([backend_cloud])
            check_plan_types(start.plan, catalog)  # fail before anything starts if a type is unknown
            head_mode = backend_cloud in rented_clouds() and head == "instance" and not simulate
            overrun_s = overrun_flag(overrun, start.deadline_s or start.plan.deadline_s)
            _check_head_mode(head_mode, flags, detach=detach, resume=resume)
            job = RunJob(
                deadline_s=start.deadline_s,
                trial_runtime=seams.trial_runtime or DEFAULT_TRIAL_RUNTIME,
                overrun_s=overrun_s,
                on_late=on_late,
                boots=seams.boots,
                metadata_url=seams.metadata_url,
                commanded_at=None if resume is not None else seams.commanded_at,
            )
            if head_mode:
                options = flags.options(start.deadline_s or start.plan.deadline_s, overrun_s, grace_s)
                return run_on_head(start, catalog, options, job, detach=detach)
            return run_here(start, catalog, backend_cloud, job, simulate=simulate)
        finally:
            if start.early_head is not None:  # the executor stopped it (else it never started): nothing is left
                start.early_head.cancel()
