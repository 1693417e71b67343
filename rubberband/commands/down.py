"""``rubberband down``: stop whatever a run left behind — local Ray nodes and head, or a cloud run's
instances, security group and firewall rules — and sweep a cloud for orphaned rubberband instances.

* ``rubberband down RUN_ID_OR_DIR``: the local backend (processes recorded in the run directory).
* ``rubberband down RUN_ID --cloud aws|gcp [--region R ...]``: :func:`teardown.terminate_run` in each
  region of the run (``--region``, else the regions its journal names, else the catalog's regions
  of that cloud).
* ``rubberband down --all-orphans --cloud aws|gcp [--older-than 1h] [--region R ...]``:
  :func:`teardown.find_orphans` + :func:`teardown.terminate_instances` + :func:`teardown.cleanup_leftovers`
  + the head roles (GCP: the head role's run bindings) of runs with nothing left — decided from the cloud's
  tags, launch times and the runs' heartbeats (cloud/heartbeat.py), never from local files.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rubberband.clouds import cloud as cloud_facts
from rubberband.console import stdout
from rubberband.errors import InputError

ORDER = 60


def _echo(line: str) -> None:
    """One plain line per terminated instance / deleted resource (never wrapped: scripts grep it)."""
    typer.echo(line)


def _run_directory(run: str) -> Path | None:
    """The run's local directory when there is one (a path, or an id under the runs root)."""
    from rubberband.commands.run import resolve_run_dir
    from rubberband.errors import RunDirError

    try:
        return resolve_run_dir(run)
    except RunDirError:
        return None


def journal_regions(directory: Path | None, cloud: str) -> list[str]:
    """Regions of ``cloud`` the run names: its head (``head.json``), requested instances, the plan's stages."""
    from rubberband.executor import journal as J

    regions: list[str] = []
    if directory is not None and (directory / "head.json").exists():  # a run on a head instance (head mode)
        try:
            record = json.loads((directory / "head.json").read_text())
            if record.get("cloud") == cloud:
                regions += list(record.get("regions") or [record.get("region")])
        except (OSError, ValueError):
            pass
    if directory is None or not (directory / J.JOURNAL_NAME).exists():
        return [r for r in dict.fromkeys(regions) if r]
    for event in J.iter_events(directory / J.JOURNAL_NAME):
        if event.get("type") == J.INSTANCE_REQUESTED and event.get("cloud") == cloud and event.get("region"):
            regions.append(event["region"])
        elif event.get("type") in (J.RUN_STARTED, J.PLAN_CHANGED):
            for stage in (event.get("plan") or {}).get("stages", []):
                if stage.get("cloud") == cloud and stage.get("region"):
                    regions.append(stage["region"])
    return list(dict.fromkeys(regions))


def catalog_regions(cloud: str) -> list[str]:
    """Every region of ``cloud``'s catalog (the refreshed one when there is one)."""
    from rubberband.catalog import load_catalog

    return sorted({t.region for t in load_catalog([cloud]).types if t.cloud == cloud})


def _cloud_run_id(run: str, directory: Path | None) -> str:
    """The id the run's instances are tagged with (the journal's run id mapped onto cloud-safe characters)."""
    from rubberband.cloud.bootstrap import cloud_run_id

    run_id = run
    if directory is not None:
        from rubberband.executor import journal as J

        run_id = directory.name
        if (directory / "head.json").exists():  # head mode: the journal stays on the head until fetched
            try:
                run_id = json.loads((directory / "head.json").read_text()).get("run_id") or run_id
            except (OSError, ValueError):
                pass
        if (directory / J.JOURNAL_NAME).exists():
            for event in J.iter_events(directory / J.JOURNAL_NAME):
                if event.get("type") == J.RUN_STARTED and event.get("run_id"):
                    run_id = event["run_id"]
                    break
    return cloud_run_id(run_id)


def _regions_for_cloud(cloud: str, given: list[str] | None, directory: Path | None) -> list[str]:
    regions = list(dict.fromkeys(given or [])) or journal_regions(directory, cloud) or catalog_regions(cloud)
    if not regions:
        raise InputError(f"no {cloud} region to look in: pass --region")
    if cloud_facts(cloud).one_listing:  # one provider lists the whole project (aggregated list; global rules)
        return regions[:1]
    return regions


def down_cloud_run(run: str, cloud: str, regions: list[str] | None) -> int:
    """Terminate every instance of the run in each region; returns how many were terminated."""
    from rubberband.cloud.registry import head_mode, make_provider
    from rubberband.cloud.teardown import terminate_run_detailed

    directory = _run_directory(run)
    run_id = _cloud_run_id(run, directory)
    journal = None
    if directory is not None:
        from rubberband.executor import journal as J

        journal = J.Journal(directory) if (directory / J.JOURNAL_NAME).exists() else None
    terminated = deleted = 0
    for region in _regions_for_cloud(cloud, regions, directory):
        result = terminate_run_detailed(make_provider(cloud, region), run_id, echo=_echo)
        terminated += len(result.instances)
        deleted += len(result.resources)
        if journal is not None:
            for instance in result.instances:
                journal.record(J.InstanceTerminated(id=instance.id, reason="down"))
    from rubberband.errors import CloudError

    head = head_mode(cloud)
    try:
        identity = head.delete_identity(run_id)  # the head's identity made for the run (found by its tag / title)
    except CloudError as exc:
        identity = []
        made = head.identity_left(run_id)
        _echo(f"could not look for run {run_id}'s head role ({exc.message}); delete {made} by hand if it exists")
    for resource in identity:
        deleted += 1
        _echo(f"deleted {cloud} {resource} (run {run_id})")
    if journal is not None and terminated:
        journal.record(J.Down(terminated=terminated))
    if directory is not None:  # the run's cluster is gone: its Ray token and token push key open nothing any more
        from rubberband.cloud.ray_token import PUSH_KEY_FILE, forget_push_key, forget_run_token

        forget_run_token(directory)
        forget_push_key(directory / PUSH_KEY_FILE)
    if not terminated and not deleted:
        _echo(f"nothing left on {cloud} for run {run_id}")
    return terminated


def down_orphans(cloud: str, regions: list[str] | None, older_than_s: float, *, now: float | None = None) -> int:
    """End the runs the cloud itself shows dead (no launch, no heartbeat for ``older_than_s``): their instances,
    then every group / rule / detached disk and head role left by a run with no instance; returns the count.

    Nothing local decides (no run directory, no journal): a CLI killed right after starting a head leaves nothing
    here that could be trusted, and a run started on another machine is judged alike."""
    import time

    from rubberband.cloud.registry import head_mode, make_provider
    from rubberband.cloud.teardown import cleanup_leftovers, find_orphans, terminate_instances

    now = time.time() if now is None else now
    terminated = deleted = 0
    swept = _regions_for_cloud(cloud, regions, None)
    live: set[str] = set()
    for region in swept:
        provider = make_provider(cloud, region)
        orphans = find_orphans(provider, older_than_s, now=now)
        result = terminate_instances(provider, orphans, echo=_echo)
        terminated += len(result.instances)
        deleted += len(result.resources) + len(
            cleanup_leftovers(provider, older_than_s=older_than_s, now=now, echo=_echo)
        )
        live |= {i.run_id for i in provider.list()}
    # the head identities of runs with no instance left
    deleted += head_mode(cloud).sweep_identities(live, swept, older_than_s=older_than_s, now=now, echo=_echo)
    if not terminated and not deleted:
        _echo(f"no orphaned rubberband resources on {cloud} older than {older_than_s:g} s")
    return terminated


def down_local(run: str) -> None:
    """Stop the local Ray nodes and head a run left (process groups recorded in its directory)."""
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.commands.run import resolve_run_dir
    from rubberband.executor import journal as J

    directory = resolve_run_dir(run)
    provider = LocalProvider(directory)
    records = {r.id: r for r in provider.records()}
    if not records and not (directory / J.JOURNAL_NAME).exists():
        from rubberband.errors import RunDirError

        raise RunDirError(
            f"{directory} is not a run directory (no journal, no instances/); "
            f"pass the directory `rubberband run` created"
        )
    journaled = (directory / J.JOURNAL_NAME).exists()
    opened: list[J.Journal] = []  # opened on the first event to record: opening ends a torn last line, a write

    def record(event: J.Event) -> None:
        if journaled:
            if not opened:
                opened.append(J.Journal(directory))
            opened[0].record(event)

    out = stdout()
    stopped = 0
    for instance in provider.list():
        record_of = records[instance.id]
        provider.terminate([instance.id])
        stopped += 1
        record(J.InstanceTerminated(id=instance.id, reason="down"))
        out.print(
            f"terminated {instance.id} ({instance.instance_type}, run {instance.run_id}, pid {record_of.pid})",
            markup=False,
            highlight=False,
        )
    head = provider.head()
    if head is not None and provider.stop_head():
        stopped += 1
        out.print(f"terminated the Ray head of run {head.run_id} (pid {head.pid})", markup=False, highlight=False)
    if stopped:
        record(J.Down(terminated=stopped))
    if not stopped:
        out.print(f"nothing left running for {directory}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("down")
    def down(
        run: str = typer.Argument(None, metavar="RUN_ID_OR_DIR", help="Run directory or run id."),
        cloud: str = typer.Option(
            None, "--cloud", help="aws or gcp: terminate the run's cloud instances (default: the local backend)."
        ),
        region: list[str] = typer.Option(
            None,
            "--region",
            help="Region to look in (repeatable); default: the "
            "run journal's regions, else every catalog region of the cloud.",
        ),
        all_orphans: bool = typer.Option(
            False,
            "--all-orphans",
            help="With --cloud: end every rubberband run "
            "the cloud shows dead (no launch, no heartbeat for --older-than): its "
            "instances, groups, firewall rules, disks and head role.",
        ),
        older_than: str = typer.Option(
            "1h",
            "--older-than",
            help="With --all-orphans: runs silent for longer "
            "than this (90m, 2h...; at least a few heartbeats, 1 min each).",
        ),
    ) -> None:
        """Terminate every instance a run left running (or every orphan) and say what was terminated."""
        from rubberband.cloud.registry import CLOUD_PROVIDERS
        from rubberband.units import parse_duration

        if cloud not in (None, "local", *CLOUD_PROVIDERS):
            raise InputError(f"--cloud {cloud!r} is unknown; use local, {', '.join(CLOUD_PROVIDERS)}")
        if all_orphans:
            if cloud in (None, "local"):
                raise InputError("--all-orphans needs --cloud aws or --cloud gcp")
            if run is not None:
                raise InputError("pass either RUN_ID or --all-orphans, not both")
            try:
                older_than_s = parse_duration(older_than)
            except ValueError as exc:
                raise InputError(f"--older-than: {exc}") from None
            down_orphans(cloud, region, older_than_s)
            return
        if run is None:
            raise InputError("missing RUN_ID_OR_DIR: pass a run id or directory (or --all-orphans --cloud aws|gcp)")
        if cloud in (None, "local"):
            if region:
                raise InputError("--region applies to --cloud aws|gcp only")
            down_local(run)
            return
        down_cloud_run(run, cloud, region)
