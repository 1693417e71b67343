"""The CLI side of head mode: start a run's head instance, submit the run to it, stream, fetch, end.

``rubberband run SPEC --cloud aws|gcp`` (docs/clouds.md, "Where the Ray head runs"):

1. :func:`start_head` provisions the run's head (:func:`rubberband.cloud.head.provision_head`,
   tagged with the run id and role ``head``) and records it in ``RUN_DIR/head.json``
   (:class:`HeadRecord`) so ``--attach`` and ``down`` find it;
2. :class:`HeadSession` reaches the head's Ray job server through a
   :class:`~rubberband.cloud.head_link.HeadLink` and submits two Ray jobs, both with
   ``runtime_env={"py_modules": [<this machine's rubberband package>], ...}``
   (:mod:`rubberband.cloud.shipping`; the head's boot installed no rubberband): the head's
   watchdog (``python -m rubberband.cloud.watchdog_cli watchdog ...``), then the run
   (``python -m rubberband.head_job run ...``, the run's cloud id as ``submission_id``) whose
   ``working_dir`` is the training code directory plus the spec, plan and profile. Ray uploads
   both and installs them on every node where the job's workers start, so the head's executor and
   every trial run exactly this machine's rubberband and training code;
3. :meth:`HeadSession.stream` tails the job's logs (the executor's progress) until the job ends;
   the user may detach at any time, the run goes on;
4. :meth:`HeadSession.fetch` brings the run directory back (a ``pack`` job), and :func:`end_run`
   terminates the head, any worker and the run's security group / firewall rules (and, on GCP, the
   Cloud NAT its private workers go out through) at once instead of waiting for the watchdog's grace.

Nothing here holds a credential: the job's entrypoint and runtime_env name only the run, the
cloud, the region and the head; the head acts with its instance role / service account.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubberband.catalog import Catalog
from rubberband.cloud.boots import BootPlayer
from rubberband.cloud.bootstrap import WatchdogSettings, cloud_run_id
from rubberband.cloud.head_run import STAGE_DIR, LogFilter, unpack
from rubberband.cloud.shell import shell_words
from rubberband.cloud.head_link import DirectLink, HeadLink, SshTunnel
from rubberband.cloud.provider import Instance
from rubberband.cloud.shipping import NOISE_EXCLUDES, SECRET_EXCLUDES
from rubberband.errors import CloudError, InputError, RunDirError
from rubberband.plan import Plan
from rubberband.spec import JobSpec

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

HEAD_RECORD = "head.json"
#: Never shipped to the head with the training code (see :class:`rubberband.cloud.shipping.CodeFilter`, which adds the
#: code directory's ``.gitignore`` and ``.rubberbandignore``): secrets, VCS, environments, caches, run directories.
CODE_EXCLUDES = (*NOISE_EXCLUDES, *SECRET_EXCLUDES)
MAX_CODE_BYTES = 100 * 1024**2
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
#: How long the link to a head may stay broken (no log, no status) before the CLI gives up following the run.
LINK_GRACE_S = 120.0
#: While the head's job server does not answer, how often the CLI reads the head's console for a failed boot.
CONSOLE_CHECK_S = 30.0


@dataclass(frozen=True)
class HeadOptions:
    """How the CLI reaches the head and when the head gives up (``rubberband run`` flags)."""

    ssh_cidr: str | None = None
    ssh_key: Path | None = None
    key_name: str | None = None  # AWS key pair the head is started with (its public half)
    ssh_user: str = "ubuntu"
    watchdog: WatchdogSettings = WatchdogSettings()
    boot_timeout_s: float = 1200.0  # instance start + runtime install + Ray head
    instance_profile: str | None = None  # AWS: the head's instance profile (None: one is created for the run)
    service_account: str | None = None  # GCP: the head's service account (required)
    #: GCP: how workers reach the internet (cloud/gcp/provider.py WORKER_EGRESS: nat, existing, public); None: ``nat``
    worker_egress: str | None = None


@dataclass(frozen=True)
class HeadRecord:
    """``RUN_DIR/head.json``: the run's head, enough to reattach, fetch and end it from any CLI process."""

    run_id: str
    cloud: str
    region: str
    instance_id: str
    zone: str
    address: str | None
    public_address: str | None
    regions: list[str]
    metric: str
    ssh_user: str = "ubuntu"
    ssh_key: str | None = None
    identity: str | None = None  # the head's instance profile name / service account email
    identity_created: bool = False  # rubberband created it for this run (deleted when the run ends)
    worker_egress: str = (
        "nat"  # GCP: how the head's executor gives workers egress (cloud/gcp/provider.py WORKER_EGRESS)
    )
    #: the machine image the user chose on the CLI (``RUBBERBAND_AWS_AMI`` / ``RUBBERBAND_GCP_IMAGE``; None: the
    #: provider's default): the head booted on it, and its executor boots the workers on it (``head_job run --image``)
    image: str | None = None

    @property
    def cloud_run_id(self) -> str:
        return cloud_run_id(self.run_id)

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{HEAD_RECORD}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(run_dir / HEAD_RECORD)

    @classmethod
    def read(cls, run_dir: Path) -> "HeadRecord":
        path = run_dir / HEAD_RECORD
        try:
            data = json.loads(path.read_text())
            if "private_workers" in data:  # written before --worker-egress: private workers then meant your own NAT
                data.setdefault("worker_egress", "existing" if data.pop("private_workers") else "public")
            return cls(**data)
        except FileNotFoundError:
            raise RunDirError(
                f"{run_dir} has no {HEAD_RECORD}: it is not a run started in head mode "
                f"(pass the --run-dir of `rubberband run --cloud aws|gcp`)"
            ) from None
        except (ValueError, TypeError) as exc:
            raise RunDirError(f"{path} is damaged ({exc}); end the run with `rubberband down RUN_ID --cloud`") from None


def _provider(cloud: str, region: str, options: HeadOptions | None = None, identity: str | None = None):
    """A provider for the run's cloud; the one that starts the head (``identity``) gives it that identity alone:
    workers get none."""
    from rubberband.cloud.registry import head_mode, make_provider

    kwargs = head_mode(cloud).provider_options(
        identity=identity,
        ssh_cidr=options.ssh_cidr if options else None,
        key_name=options.key_name if options else None,
        worker_egress=options.worker_egress if options else None,
    )
    return make_provider(cloud, region, **kwargs)


def check_options(cloud: str, options: HeadOptions, boots: BootPlayer | None) -> None:
    """The head's identity flags fit the cloud; outside tests the CLI reaches the head over SSH: it needs the CIDR
    to open, the key (and its EC2 key pair)."""
    from rubberband.cloud.bootstrap import check_ssh_cidr
    from rubberband.cloud.registry import head_mode

    head_mode(cloud).check_flags(options, over_ssh=boots is None)
    if options.ssh_cidr:
        check_ssh_cidr(options.ssh_cidr)  # before anything is created
    if boots is not None or options.ssh_key is None:
        return
    if not Path(options.ssh_key).expanduser().is_file():
        raise InputError(f"--ssh-key {options.ssh_key}: no such private key file")


@dataclass(frozen=True)
class NewRun:
    """The run a head is started for: its id, its directory on this machine (``head.json`` goes there) and the metric
    its summary reports (the record keeps it for ``--attach``)."""

    run_id: str
    run_dir: Path
    metric: str


def start_head(
    *, run: NewRun, plan: Plan, catalog: Catalog, options: HeadOptions, boots: BootPlayer | None
) -> HeadRecord:
    """Provision ``run``'s head where its first stage's workers go, with its cloud identity (the one named, or one
    created for the run), record it, play its boot in tests. On failure nothing is left: no head, no identity."""
    from rubberband.cloud.head import HeadBoot, provision_head
    from rubberband.cloud.head_identity import launch_with_new_identity
    from rubberband.cloud.registry import head_mode
    from rubberband.clouds import chosen_image
    from rubberband.cloud.teardown import terminate_run

    run_id, run_dir = run.run_id, run.run_dir
    first = plan.stages[0]
    cloud, region = first.cloud, first.region
    check_options(cloud, options, boots)
    zones = catalog.find(first.instance_type, cloud=cloud, region=region).zones
    crid = cloud_run_id(run_id)
    provider = _provider(cloud, region, options)
    identity = None
    try:
        identity = head_mode(cloud).identity(crid, region, options)  # named, or made / bound for this run alone
        provider = _provider(cloud, region, options, identity=identity.name)
        head_mode(cloud).prepare_run(provider, crid)
        head = launch_with_new_identity(
            lambda: provision_head(
                provider, crid, region, zones, HeadBoot(options.watchdog, timeout_s=options.boot_timeout_s)
            ),
            new=identity.created,
        )
        record = HeadRecord(
            run_id=run_id,
            cloud=cloud,
            region=region,
            instance_id=head.id,
            zone=head.zone,
            address=head.address,
            public_address=head.public_address,
            regions=list(dict.fromkeys([region, *(s.region for s in plan.stages)])),
            metric=run.metric,
            ssh_user=options.ssh_user,
            ssh_key=str(options.ssh_key) if options.ssh_key else None,
            identity=identity.name,
            identity_created=identity.created,
            worker_egress=options.worker_egress or "nat",
            image=chosen_image(cloud),
        )
        record.write(run_dir)
        if boots is not None:
            boots.play_head(cloud, region, crid, head.id, options.watchdog)
    except BaseException:
        terminate_run(provider, crid)
        if identity is not None and identity.created:
            head_mode(cloud).delete_identity(crid)
        raise
    return record


def deliver_token(record: HeadRecord, run_dir: Path, options: HeadOptions, boots: BootPlayer | None) -> str:
    """Make the run's Ray token, keep it in ``RUN_DIR/ray-token`` (0600) and write it onto the head: over SSH
    (the head's boot waits for it before starting Ray), or onto a played head's disk in tests."""
    from rubberband.cloud.ray_token import SshLogin, deliver_to_head, new_token, write_run_token

    token = new_token()
    write_run_token(run_dir, token)
    if boots is not None:
        boots.deliver_token(record.instance_id, token)
        return token
    from rubberband.cloud.head_link import run_known_hosts
    from rubberband.cloud.host_keys import await_host_keys, pin_host_keys

    host = record.public_address or record.address
    if not host or options.ssh_key is None:
        raise InputError(
            f"cannot reach head {record.instance_id} to give it the run's Ray token: it has no address "
            f"or no --ssh-key was given"
        )
    provider = _provider(record.cloud, record.region)
    keys = await_host_keys(  # its boot prints them first thing; the first connection then takes no other key
        lambda: provider.console_output(record.instance_id, lines=400),
        what=f"head {record.instance_id}",
        timeout_s=options.boot_timeout_s,
    )
    known_hosts = run_known_hosts(record.cloud_run_id, record.instance_id, run_dir)
    login = SshLogin(
        host, record.ssh_user, Path(options.ssh_key).expanduser(), pin_host_keys(known_hosts, host, keys), pinned=True
    )
    deliver_to_head(login, token, timeout_s=options.boot_timeout_s)
    return token


def link_for(
    record: HeadRecord, boots: BootPlayer | None, ssh_key: Path | None = None, run_dir: Path | None = None
) -> HeadLink:
    """The way to the head's job server: the played head's local URL in tests, else an SSH tunnel that trusts the
    run's own known_hosts (``RUN_DIR/known_hosts``; see head_link.run_known_hosts)."""
    if boots is not None:
        return DirectLink(boots.head_url(record.instance_id))
    key = ssh_key or (Path(record.ssh_key) if record.ssh_key else None)
    host = record.public_address or record.address
    if key is None or not host:
        raise InputError(
            f"cannot reach head {record.instance_id}: pass --ssh-key (the private key of the run's "
            f"key pair){'' if host else '; the head has no address (is it still running?)'}"
        )
    from rubberband.cloud.head_link import run_known_hosts

    return SshTunnel(
        host=host,
        key_file=key,
        user=record.ssh_user,
        known_hosts=run_known_hosts(record.cloud_run_id, record.instance_id, run_dir),
    )


def stage_code(spec: JobSpec, plan: Plan, into: Path) -> Path:
    """The job's working directory: the spec's code directory, plus ``_rubberband/`` with spec, plan, profile."""
    from rubberband.plan import write_plan

    from rubberband.cloud.shipping import CodeFilter

    source = Path(spec.base_dir)
    code = CodeFilter(source)
    size = sum((source / rel).stat().st_size for rel in code.files())
    if size > MAX_CODE_BYTES:
        raise InputError(
            f"the training code directory {source} holds {size / 1024**2:.0f} MiB; the head takes "
            f"at most {MAX_CODE_BYTES // 1024**2} MiB: move data sets out of it (download them in "
            f"train) or list them in {source}/.rubberbandignore"
        )
    work = into / "code"
    code.copy_to(work)
    stage = work / STAGE_DIR
    stage.mkdir()
    data = spec.model_dump(mode="json", exclude={"base_dir"})
    profile = spec.profile_path()
    if profile is not None and profile.exists():
        shutil.copyfile(profile, stage / "profile.json")  # wherever it lives on this machine
    (stage / "spec.json").write_text(json.dumps(data, indent=1))
    write_plan(plan, stage / "plan.json")
    return work


@dataclass(frozen=True)
class RunJob:
    """How the run job runs the executor on the head (its command line's options; never a credential).

    ``head_grace_s``: the watchdog's results grace the head was started with, which the run's
    ``result.json`` bills the head for after the run ends. ``boots`` (tests: a played head): the run job is the
    player's own command (``BootPlayer.head_job_command``), whose executor plays its workers' boots too. ``metadata_url``
    (tests: a local endpoint serving spot notices): where the on-head executor's notice watchers read
    (``--metadata-url``; executor/notices.py)."""

    deadline_s: float | None
    trial_runtime: str
    head_grace_s: float | None = None
    overrun_s: float = 0.0
    on_late: str = "finish"
    boots: BootPlayer | None = None
    metadata_url: str | None = None
    #: when the user's command began (POSIX seconds; ``--commanded-at``): the result reports what the head's boot
    #: and the upload took before the executor started
    commanded_at: float | None = None


def entrypoint(record: HeadRecord, job: RunJob) -> str:
    """The run job's command line on the head (names the run, never a credential)."""
    command = job.boots.head_job_command() if job.boots is not None else ["python", "-m", "rubberband.head_job"]
    words = [
        *command,
        "run",
        "--cloud",
        record.cloud,
        "--region",
        record.region,
        "--head-id",
        record.instance_id,
        "--run-id",
        record.run_id,
        "--trial-runtime",
        job.trial_runtime,
    ]
    if job.head_grace_s is not None:
        words += ["--head-grace", f"{job.head_grace_s:g}"]
    if job.deadline_s:
        words += ["--deadline", f"{job.deadline_s:g}"]
    if job.overrun_s:
        words += ["--overrun-s", f"{job.overrun_s:g}"]
    if job.commanded_at is not None:
        words += ["--commanded-at", f"{job.commanded_at:.3f}"]
    if job.on_late != "finish":
        words += ["--on-late", job.on_late]
    if record.worker_egress != "nat":  # only a cloud that has egress choices records another
        words += ["--worker-egress", record.worker_egress]
    if record.image:  # the jobs on the head do not see the CLI's environment: the workers follow the head's image
        words += ["--image", record.image]
    if job.metadata_url:
        words += ["--metadata-url", job.metadata_url]
    return shell_words(words)


class HeadSession:
    """An open link to a run's head and a job client on it; use as a context manager."""

    def __init__(
        self,
        record: HeadRecord,
        link: HeadLink,
        *,
        connect_timeout_s: float = 1200.0,
        package: Path | None = None,
        token: str | None = None,
    ) -> None:
        self.record = record
        self.link = link
        self.token = token  # the run's Ray token (RUN_DIR/ray-token): sent as a bearer header, never logged
        self.connect_timeout_s = connect_timeout_s
        self.client: JobSubmissionClient | None = None
        self._package = package

    @property
    def jobs(self) -> JobSubmissionClient:
        """The head's job server (only inside ``with``: connected by ``__enter__``)."""
        if self.client is None:
            raise RuntimeError("the head session is not open: use it as `with HeadSession(...) as session:`")
        return self.client

    @property
    def package(self) -> Path:
        """This machine's rubberband as every job ships it (built once per content; cloud/shipping.py)."""
        if self._package is None:
            from rubberband.cloud.shipping import build_package

            self._package = build_package()
        return self._package

    def __enter__(self) -> "HeadSession":
        # the run's token goes as an explicit header (Ray then adds none of its own); this process's own Ray
        # auth setting stays out of it and is restored on exit
        self._auth_mode = os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        from ray.job_submission import JobSubmissionClient

        logging.getLogger("ray.dashboard").setLevel(logging.WARNING)  # no "uploading package" chatter

        deadline = time.monotonic() + self.connect_timeout_s
        url = self.link.open(self.connect_timeout_s)
        next_console = time.monotonic() + CONSOLE_CHECK_S
        try:
            while True:
                try:
                    from rubberband.cloud.ray_token import auth_headers

                    self.client = JobSubmissionClient(url, headers=auth_headers(self.token) or None)
                    return self
                except Exception as exc:  # noqa: BLE001 - ConnectionError until Ray's job server is up
                    if time.monotonic() >= next_console:  # still booting, or did its boot fail?
                        next_console = time.monotonic() + CONSOLE_CHECK_S
                        self._raise_if_boot_failed()
                    if time.monotonic() >= deadline:
                        raise CloudError(
                            f"the job server of head {self.record.instance_id} did not answer within "
                            f"{self.connect_timeout_s:.0f}s ({type(exc).__name__}); see "
                            f"/var/log/rubberband-boot.log on it",
                            kind="transient",
                        ) from None
                    time.sleep(1.0)
        except BaseException:
            self.link.close()
            raise

    def __exit__(self, *exc) -> None:
        self.link.close()
        saved = getattr(self, "_auth_mode", None)
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved

    def _raise_if_boot_failed(self) -> None:
        """Stop waiting for a head whose startup script failed: its console says why (e.g. a version skew)."""
        from rubberband.cloud.backend import boot_report
        from rubberband.cloud.bootstrap import BOOT_FAILED

        try:
            report = boot_report(_provider(self.record.cloud, self.record.region), self.record.instance_id)
        except Exception:  # noqa: BLE001 - the console is a hint; the timeout still applies
            return
        if BOOT_FAILED in report:
            raise CloudError(
                f"the head {self.record.instance_id} failed to boot: {report}", kind="fatal", code="BootFailed"
            )

    @property
    def job_id(self) -> str:
        return self.record.cloud_run_id

    def submit(self, spec: JobSpec, plan: Plan, job: RunJob, *, watchdog: WatchdogSettings | None = None) -> str:
        """Submit the head's watchdog (``watchdog``: its settings; None: none) and then the run itself, its executor
        run as ``job`` says (:class:`RunJob`)."""
        from rubberband.cloud.shipping import job_runtime_env

        if watchdog is not None:
            self.submit_watchdog(watchdog)
        with tempfile.TemporaryDirectory(prefix="rb-stage-") as tmp:
            work = stage_code(spec, plan, Path(tmp))
            return self._submit(
                entrypoint=entrypoint(self.record, job),
                runtime_env=job_runtime_env(self.package, work),
                submission_id=self.job_id,
                metadata={"rubberband_run": self.record.run_id},
            )

    def submit_watchdog(self, settings: WatchdogSettings) -> str:
        """Start the head's watchdog as a Ray job (it runs the shipped rubberband); see :mod:`rubberband.cloud.head`.

        Until it runs, the head's boot script ends an unsubmitted head itself; the watchdog asks that
        script to power off (``--poweroff-marker``) when it cannot terminate the head through the API, or when it
        ended the head's own rights (:class:`~rubberband.cloud.provider.ReapsFromItsHead`)."""
        from rubberband.cloud.shipping import job_runtime_env

        words = [
            "python",
            "-m",
            "rubberband.cloud.watchdog_cli",
            "watchdog",
            "--cloud",
            self.record.cloud,
            "--region",
            self.record.region,
            "--run-id",
            self.record.cloud_run_id,
            "--head-id",
            self.record.instance_id,
            *settings.flags(),
            "--poweroff-marker",
        ]
        return self._submit(
            entrypoint=shell_words(words),
            runtime_env=job_runtime_env(self.package),
            submission_id=f"{self.job_id}-watchdog",
            metadata={"rubberband_run": self.record.run_id, "rubberband_role": "watchdog"},
        )

    def _submit(self, **job) -> str:
        return submit_when_ready(self.jobs, self.connect_timeout_s, f"head {self.record.instance_id}", **job)

    def status(self, job_id: str | None = None) -> str:
        return str(self.jobs.get_job_status(job_id or self.job_id).value)

    def stream(self, write: Callable[[str], None], *, poll_s: float = 1.0, link_grace_s: float = LINK_GRACE_S) -> str:
        """Write the run job's log as it grows until the job ends; return its final status.

        A dropped stream is reconnected (Ray replays the log from its start; what was shown is
        skipped) until the link has been broken for ``link_grace_s``. The run directory the job
        prints at its end is kept (:attr:`packed`), not written."""
        self.filter = LogFilter()
        seen = 0  # characters of the log already fed to the filter
        broken_since: float | None = None

        async def tail() -> None:
            nonlocal seen, broken_since
            skip = seen
            async for chunk in self.jobs.tail_job_logs(self.job_id):
                broken_since = None
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
                seen += len(chunk)
                if shown := self.filter.feed(chunk):
                    write(shown)

        while True:
            try:
                asyncio.run(tail())
                if (status := self.status()) in TERMINAL:
                    return status
            except Exception as exc:  # noqa: BLE001 - the link dropped (aiohttp, requests errors); the run did not
                now = time.monotonic()
                if broken_since is None:
                    broken_since = now
                    write(f"(log stream interrupted: {type(exc).__name__}; reconnecting)\n")
                elif now - broken_since > link_grace_s:
                    raise CloudError(
                        f"lost the link to head {self.record.instance_id} ({type(exc).__name__}); the "
                        f"run goes on there: follow it again with `rubberband run --attach RUN_DIR`",
                        kind="transient",
                    ) from None
            time.sleep(poll_s)

    def fetch(self, run_dir: Path, *, timeout_s: float = 300.0) -> list[str]:
        """Bring the head's run directory (journal, result.json, ...) into ``run_dir``: from the end of the
        streamed log, else by a ``pack`` job (the run job was stopped before it could print it)."""
        packed = getattr(self, "filter", None) and self.filter.packed
        if packed:
            return unpack(packed, run_dir)
        from rubberband.cloud.shipping import job_runtime_env

        job = self._submit(
            entrypoint=f"python -m rubberband.head_job pack --run-id {self.record.cloud_run_id}",
            runtime_env=job_runtime_env(self.package),
            submission_id=f"{self.job_id}-fetch-{secrets.token_hex(3)}",
        )
        deadline = time.monotonic() + timeout_s
        while (status := self.status(job)) not in TERMINAL:
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"fetching the run directory from head {self.record.instance_id} took over {timeout_s:.0f}s",
                    kind="transient",
                )
            time.sleep(0.3)
        logs = self.jobs.get_job_logs(job)
        if status != "SUCCEEDED":
            raise CloudError(f"fetching the run directory failed on the head: {logs.strip()[-300:]}", kind="transient")
        return unpack(logs, run_dir)


def submit_when_ready(jobs: JobSubmissionClient, timeout_s: float, head: str, **job: Any) -> str:
    """``jobs.submit_job(**job)``: the submission id. Retried each second for ``timeout_s`` at most while the head's
    job agent is still starting: a head whose Ray is up can answer 500 "No available agent to submit job, please
    try again later" for a while. Raises CloudError naming ``head`` when it refuses the job otherwise or for longer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return jobs.submit_job(**job)
        except RuntimeError as exc:
            if "try again later" not in str(exc) or time.monotonic() >= deadline:
                raise CloudError(f"{head} refused the job: {exc}", kind="fatal") from None
            time.sleep(1.0)


def end_run(record: HeadRecord, *, boots: BootPlayer | None, echo: Callable[[str], None] | None = None) -> int:
    """Terminate the run's head, workers and security group / firewall rules now; returns instances ended."""
    from rubberband.cloud.registry import descriptor
    from rubberband.cloud.teardown import terminate_run_detailed

    cloud = descriptor(record.cloud)
    regions = record.regions[:1] if cloud.facts.one_listing else record.regions
    ended = 0
    try:
        for region in regions:
            ended += len(
                terminate_run_detailed(_provider(record.cloud, region), record.cloud_run_id, echo=echo).instances
            )
    finally:  # the identity made for the run goes with it (found by its run tag: a named one is never touched)
        made = cloud.head.delete_identity(record.cloud_run_id) if record.identity_created and cloud.head else []
        for resource in made:
            if echo:
                echo(f"deleted {record.cloud} {resource} (run {record.cloud_run_id})")
    if boots is not None:
        boots.wait_head_gone(record.instance_id)
    return ended


def check_head_alive(record: HeadRecord) -> None:
    """Fail at once (instead of waiting on a link) when the run's head is no longer running."""
    alive = any(
        i.id == record.instance_id and i.alive for i in _provider(record.cloud, record.region).list(record.cloud_run_id)
    )
    if not alive:
        raise CloudError(
            f"the head {record.instance_id} of run {record.run_id} is gone: the run ended (its results "
            f"are in its run directory only if they were fetched); clean up any leftover with "
            f"`rubberband down {record.run_id} --cloud {record.cloud}`",
            kind="fatal",
        )


def find_head(cloud: str, run_id: str, regions: list[str]) -> Instance | None:
    """The running head of a run, searched by its tags (when no ``head.json`` is at hand)."""
    for region in regions:
        for inst in _provider(cloud, region).list(cloud_run_id(run_id)):
            if inst.role == "head" and inst.alive:
                return inst
    return None
