"""``rubberband run``: execute a plan (or plan first), or resume a run after the executor died."""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

import typer

from rubberband.catalog import load_catalog
from rubberband.commands._injected import injected
from rubberband.commands._options import deadline_flag, on_late_flag, overrun_flag
from rubberband.commands.plan import print_plan
from rubberband.console import stderr, stdout
from rubberband.errors import InputError, PlanFileError, RunDirError
from rubberband.executor.backends import SIM_CLOUD, SIM_RUNTIME
from rubberband.inputs import load_job_inputs
from rubberband.plan import Plan, load_plan, write_plan
from rubberband.planning import PlanningOptions, plan_from_inputs
from rubberband.spec import JobSpec, load_spec

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


def _load_or_make_plan(
    spec: JobSpec,
    spec_path: Path,
    plan_path: Path | None,
    cloud: str | None,
    deadline_s: float | None,
    *,
    head: str = "instance",
    head_grace_s: float | None = None,
) -> tuple[Plan, bool]:
    """The plan from ``--plan``, or a fresh one (shown to the user); ``True`` when it was just made.

    A fresh plan bills the run's head instance as ``--head`` / ``--results-grace`` will run it."""
    from rubberband.executor.plan_checks import check_plan_matches

    if plan_path is not None:
        plan = load_plan(plan_path)
        check_plan_matches(spec, plan, source=str(plan_path))
        return plan, False
    plan = plan_from_inputs(
        load_job_inputs(spec_path, cloud=cloud),
        deadline_s=deadline_s,
        cloud=cloud,
        options=PlanningOptions(head=head, head_grace_s=head_grace_s),
    )
    check_plan_matches(spec, plan, source="the new plan")
    print_plan(plan)
    return plan, True


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
            from rubberband.cloud.identity import check_identity, from_options

            from_options(cloud, instance_profile, service_account)
            identity_checks = check_identity(cloud, instance_profile=instance_profile, service_account=service_account)
        report = dry_run(plan, ProviderPool(), catalog=catalog, include_head=include_head, extra_checks=identity_checks)
    except CloudError as exc:
        if exc.kind == "fatal":
            raise InputError(f"dry run on {cloud}: {exc.message}") from None
        raise
    stdout().print(render_dry_run(report))
    stdout().print(f"dry run only: nothing was created on {cloud}", markup=False, highlight=False)


def _hints(record, run_dir: Path) -> str:
    return (
        f"run {record.run_id} goes on on its head {record.instance_id} ({record.cloud} {record.zone}), which ends "
        f"itself and every worker when the run is over or stalls.\n"
        f"  follow it and fetch results: rubberband run --attach {run_dir} --cloud {record.cloud}\n"
        f"  stop it now:                 rubberband down {run_dir} --cloud {record.cloud}"
    )


def run_on_head(
    *,
    spec: JobSpec,
    plan: Plan,
    catalog,
    run_id: str,
    run_dir: Path,
    options,
    deadline_s: float | None,
    overrun_s: float,
    trial_runtime: str,
    detach: bool,
    on_late: str = "finish",
    test_boot: str | None = None,
    metadata_url: str | None = None,
) -> int:
    """Head mode: start the run's head instance, submit the run to it, then follow it (unless ``detach``).

    ``test_boot`` (tests only, injected: commands/_injected.py): the head's and workers' boots are played;
    ``metadata_url`` (tests only, injected): where the on-head executor's notice watchers read."""
    from rubberband.cloud.head_session import HeadSession, check_options, deliver_token, end_run, link_for, start_head

    err = stderr()
    if (run_dir / "head.json").exists():
        raise RunDirError(
            f"{run_dir} already holds a run; follow it with --attach {run_dir} or choose another --run-dir"
        )
    check_options(plan.stages[0].cloud, options, test_boot)
    err.print(
        f"starting the head instance of run {run_id} on {plan.stages[0].cloud} {plan.stages[0].region}",
        markup=False,
        highlight=False,
    )
    record = start_head(
        plan=plan,
        catalog=catalog,
        run_id=run_id,
        run_dir=run_dir,
        metric=spec.metric.name,
        options=options,
        test_boot=test_boot,
    )
    write_plan(plan, run_dir / "plan.json")
    try:
        token = deliver_token(record, run_dir, options, test_boot)  # the head's boot waits for it to start Ray
        with HeadSession(
            record,
            link_for(record, test_boot, options.ssh_key, run_dir),
            connect_timeout_s=options.boot_timeout_s,
            token=token,
        ) as session:
            session.submit(
                spec,
                plan,
                deadline_s=deadline_s,
                trial_runtime=trial_runtime,
                head_grace_s=options.watchdog.done_grace_s,
                overrun_s=overrun_s,
                on_late=on_late,
                watchdog=options.watchdog,
                test_boot=test_boot,
                metadata_url=metadata_url,
            )
    except BaseException:
        end_run(record, test_boot=test_boot)  # never leave a head without a run billing
        from rubberband.cloud.ray_token import forget_run_token

        forget_run_token(run_dir)
        raise
    err.print(f"submitted run {run_id} to head {record.instance_id} ({record.zone})", markup=False, highlight=False)
    note_head_billing(plan, head_mode=True)
    if detach:
        typer.echo(_hints(record, run_dir), err=True)
        return 0
    return follow(record, run_dir, ssh_key=options.ssh_key, test_boot=test_boot)


def follow(record, run_dir: Path, *, ssh_key: Path | None, test_boot: str | None = None) -> int:
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
    with HeadSession(record, link_for(record, test_boot, ssh_key, run_dir), token=token) as session:
        try:
            status = session.stream(write)
        except KeyboardInterrupt:
            typer.echo(f"\ndetached. {_hints(record, run_dir)}", err=True)
            return 0
        session.fetch(run_dir)
    end_run(record, test_boot=test_boot, echo=lambda line: err.print(line, markup=False, highlight=False))
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


def attach_run(run: str, *, run_dir: Path | None, ssh_key: Path | None, test_boot: str | None = None) -> int:
    """``rubberband run --attach RUN_ID_OR_DIR``: follow a run submitted to its head instance."""
    from rubberband.cloud.head_session import HeadRecord, check_head_alive

    directory = run_dir if run_dir is not None else resolve_run_dir(run)
    record = HeadRecord.read(directory)
    check_head_alive(record)
    return follow(record, directory, ssh_key=ssh_key, test_boot=test_boot)


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
            "for their boot-time installs: 'nat' (default: the run's own Cloud NAT, "
            "deleted with it), 'existing' (your network's Cloud NAT or proxy) or "
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
        from rubberband.execution import Execution, execute, print_summary
        from rubberband.executor import journal as J
        from rubberband.executor.backends import make_backend
        from rubberband.executor.plan_checks import check_plan_matches
        from rubberband.search import check_search

        from rubberband.executor.runtime import DEFAULT_TRIAL_RUNTIME

        # tests only, passed in by their entry point (commands/_injected.py): played instance boots
        # (cloud/testboot.py), a stand-in trial runtime, a local metadata server serving spot notices
        seams = injected(ctx)
        test_boot, metadata_url = seams.test_boot, seams.metadata_url
        trial_runtime = seams.trial_runtime or DEFAULT_TRIAL_RUNTIME
        deadline_s = deadline_flag(deadline)
        overrun_flag(overrun, 1.0)  # the form is checked before anything starts; the seconds need the plan
        on_late = on_late_flag(on_late)
        if head not in ("instance", "local"):
            raise InputError(f"--head {head!r}: use 'instance' (a head instance per run) or 'local' (this machine)")
        grace_s = deadline_flag(results_grace, "--results-grace")
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
            return attach_run(attach, run_dir=run_dir, ssh_key=ssh_key, test_boot=test_boot)
        if dry_run:
            if resume is not None:
                raise InputError("--dry-run cannot be combined with --resume")
            if spec_path is None:
                raise InputError("missing SPEC: --dry-run needs a job spec YAML")
            if cloud is None:
                raise InputError("--dry-run needs --cloud aws or --cloud gcp")
            spec = load_spec(spec_path)
            check_cloud_choice(spec, None, cloud)
            plan, _ = _load_or_make_plan(spec, spec_path, plan_path, cloud, deadline_s, head=head, head_grace_s=grace_s)
            check_cloud_choice(spec, plan, cloud)
            dry_run_plan(
                plan,
                cloud,
                include_head=head == "instance",
                instance_profile=instance_profile,
                service_account=service_account,
            )
            return 0
        if resume is not None:
            directory = resolve_run_dir(resume)
            state = J.read_state(directory)
            events = J.iter_events(directory / J.JOURNAL_NAME)
            last_pid = None
            for event in events:
                if event["type"] in (J.RUN_STARTED, J.RUN_RESUMED):
                    last_pid = event.get("pid")
                if event["type"] == J.RUN_STARTED and event.get("trial_runtime") == SIM_RUNTIME:
                    raise RunDirError(
                        f"{directory} is a simulated run (--cloud sim); it is not resumed: run the spec again"
                    )
            if state.status == "running" and _executor_alive(last_pid):
                raise RunDirError(
                    f"run {state.run_id} is still being executed by process {last_pid}; "
                    f"stop it first (or `rubberband down {directory}`)"
                )
            journaled_spec, journaled_plan = _journaled(directory, state)
            if spec_path is not None:
                spec = load_spec(spec_path)
                if spec.sha256() != state.spec_sha256:
                    raise RunDirError(
                        f"{directory} is a run of another job (spec sha256 "
                        f"{str(state.spec_sha256)[:12]} ≠ {spec.sha256()[:12]} of {spec_path}); pass "
                        f"that job's spec or no spec"
                    )
            else:
                spec = journaled_spec
            if state.finished:
                raise RunDirError(
                    f"run {state.run_id} in {directory} already finished; nothing to resume "
                    f"(results in {directory / 'result.json'})"
                )
            plan = journaled_plan
            if plan_path is not None:
                raise PlanFileError(
                    "--plan cannot be combined with --resume: the run continues with the plan in its journal"
                )
            check_plan_matches(spec, plan, source=str(directory / J.JOURNAL_NAME))
            check_search(spec)
            run_id, run_directory = state.run_id, directory
            deadline_s = deadline_s or state.deadline_s
        else:
            if spec_path is None:
                raise InputError("missing SPEC: pass a job spec YAML (or --resume RUN_DIR)")
            spec = load_spec(spec_path)
            check_search(spec)  # an Optuna sampler without Optuna fails before planning
            plan, fresh = _load_or_make_plan(
                spec, spec_path, plan_path, cloud, deadline_s, head=head, head_grace_s=grace_s
            )
            if fresh and not yes:
                if not sys.stdin.isatty():
                    raise InputError("not starting without confirmation; pass --yes to run the plan shown")
                if not typer.confirm("Start this run?", default=True):
                    return 1
            run_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
            # absolute: Ray's temp dirs under it must be absolute, and the journal names it for --resume
            run_directory = (run_dir or runs_root() / run_id).absolute()
            if (run_directory / J.JOURNAL_NAME).exists():
                raise RunDirError(
                    f"{run_directory} already holds a run; pass --resume {run_directory} to continue "
                    f"it or choose another --run-dir"
                )
        clouds = {s.cloud for s in plan.stages}
        backend_cloud = cloud or next(iter(clouds))
        if clouds != {backend_cloud}:
            raise PlanFileError(
                f"the plan uses instances of {', '.join(sorted(clouds))} but --cloud is "
                f"{backend_cloud}; plan for that cloud (resources.clouds) or drop --cloud"
            )
        catalog = load_catalog([backend_cloud])
        check_plan_types(plan, catalog)  # fail before anything starts if a type is unknown
        head_mode = backend_cloud in ("aws", "gcp") and head == "instance" and not simulate
        overrun_s = overrun_flag(overrun, deadline_s or plan.deadline_s)
        if detach and not head_mode:
            raise InputError("--detach needs a run on a head instance (--cloud aws|gcp without --head local)")
        if worker_egress is not None and not head_mode:
            raise InputError("--worker-egress is for a run on a head instance (--cloud gcp without --head local)")
        if head_mode:
            if resume is not None:
                raise InputError(
                    f"--resume restarts an executor on this machine; a run on a head instance is "
                    f"followed with `rubberband run --attach {resume}` (or pass --head local)"
                )
            from rubberband.cloud.bootstrap import WatchdogSettings, lifetime_cap_s
            from rubberband.cloud.head_session import HeadOptions

            # the head's hard cap comes from the plan: deadline + overrun + results grace (+ boot margin)
            watchdog = WatchdogSettings(
                stall_timeout_s=deadline_flag(stall_timeout, "--stall-timeout"),
                done_grace_s=grace_s,
                max_lifetime_s=lifetime_cap_s(deadline_s or plan.deadline_s, overrun_s, grace_s),
            )
            options = HeadOptions(
                ssh_cidr=ssh_cidr,
                ssh_key=ssh_key,
                key_name=key_name,
                ssh_user=ssh_user,
                watchdog=watchdog,
                instance_profile=instance_profile,
                service_account=service_account,
                worker_egress=worker_egress,
            )
            return run_on_head(
                spec=spec,
                plan=plan,
                catalog=catalog,
                run_id=run_id,
                run_dir=run_directory,
                options=options,
                deadline_s=deadline_s,
                overrun_s=overrun_s,
                trial_runtime=trial_runtime,
                detach=detach,
                on_late=on_late,
                test_boot=test_boot,
                metadata_url=metadata_url,
            )
        if backend_cloud in ("aws", "gcp") and resume is None and not simulate:
            note_head_billing(plan, head_mode=False)
        from rubberband.cloud.backend import BackendSeams
        from rubberband.cloud.bootstrap import lifetime_cap_s

        backend = (
            None
            if simulate
            else make_backend(
                backend_cloud,
                run_directory,
                regions=[s.region for s in plan.stages],
                lifetime_cap_s=lifetime_cap_s(deadline_s or plan.deadline_s, overrun_s, 0.0)
                if backend_cloud in ("aws", "gcp")
                else None,
                seams=BackendSeams(test_boot=test_boot, metadata_url=metadata_url),
            )
        )
        result = execute(
            Execution(
                spec=spec,
                plan=plan,
                catalog=catalog,
                run_id=run_id,
                run_dir=run_directory,
                backend=backend,
                trial_runtime=trial_runtime,
                deadline_s=deadline_s,
                overrun_s=overrun_s,
                resume=resume is not None,
                on_late=on_late,
                simulate=simulate,
            )
        )
        print_summary(run_id, spec.metric.name, result.result, run_directory / "result.json")
        from rubberband.executor.outcome import exit_code

        return exit_code(result.result)  # met 0, late 4, stopped 5 (failures raise: 1, interrupted 130)
