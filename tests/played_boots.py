"""The test suite's :class:`~rubberband.cloud.boots.BootPlayer`: a cloud instance's boot played by a local Ray node.

Never in the package and never activated by the environment: the played boot is an object the suite's entry points
pass in. ``python tests/cli_harness.py --test-boot local run ...`` calls ``rubberband.cli.run(argv,
boots=PlayedBoots())``; the CLI hands it on — to the executor's cloud backend (``make_backend(...,
seams=BackendSeams(boots=...))``), to head mode's functions (``cloud/head_session.py``) and, on the played head, to
the run job, whose command is this suite's ``tests/head_job_harness.py`` (:meth:`PlayedBoots.head_job_command`).
The ``rubberband`` command itself never plays a boot: no real instance would ever join.

With a player, the executor's cloud backend (``cloud/local_head.py``), once the provider (a moto server or the GCE
fake) reports an instance running, plays the instance's user-data: :meth:`PlayedBoots.join` starts a local Ray node
that offers the instance's ``rb-node-<id>`` resource and joins the run's head, exactly what the bootstrap script would
do on the instance. Terminating the instance stops that node too.

The played head acts with the CLI's (test) credentials, but only if the provider reports that its
instance was started with a cloud identity (an instance profile / a service account): a head
started without one fails its boot, as a real one could not call the cloud API.

In head mode (``rubberband run --cloud aws|gcp``) the CLI also plays the head instance's boot
(:func:`play_head`): a detached process starts a local Ray head with its job server on 127.0.0.1
(the watchdog then comes as a Ray job from the CLI, as on a real head), under the head's instance id, and stops all of it once the provider no longer
reports that instance running — as terminating a real head ends everything on it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rubberband.cloud.bootstrap import WatchdogSettings
from rubberband.cloud.provider import TAG_ROLE, InstanceRequest
from rubberband.errors import CloudError, Location

HERE = Path(__file__).resolve()
#: The played head's run job (``rubberband.head_job`` with this player passed in).
HEAD_JOB_HARNESS = HERE.parent / "head_job_harness.py"


class PlayedBoots:
    """:class:`~rubberband.cloud.boots.BootPlayer`: every boot played on this machine (see the module docstring)."""

    def join(self, instance, itype, local, timeout_s: float) -> None:
        if instance.state != "running":
            raise CloudError(
                f"{instance.cloud}: instance {instance.id} is {instance.state}, not running",
                kind="transient",
                where=Location(zone=instance.zone),
            )
        request = InstanceRequest(
            run_id=instance.run_id, stage=instance.stage, instance_type=itype, extra_tags={TAG_ROLE: "worker"}
        )
        local.start_node(instance.id, request, timeout_s=timeout_s)

    def play_head(self, cloud: str, region: str, run_id: str, instance_id: str, settings: WatchdogSettings) -> None:
        play_head(cloud, region, run_id, instance_id, settings)

    def deliver_token(self, instance_id: str, token: str) -> None:
        deliver_token(instance_id, token)

    def head_url(self, instance_id: str) -> str:
        return head_url(instance_id)

    def wait_head_gone(self, instance_id: str) -> bool:
        return wait_head_gone(instance_id)

    def head_disk(self, instance_id: str) -> Path:
        return head_disk(instance_id)

    def head_job_command(self) -> list[str]:
        return ["python", str(HEAD_JOB_HARNESS)]


# -- the head instance's boot (head mode: `rubberband run --cloud aws|gcp`) ------------------------------

#: What a played head writes for the CLI: the URL of its job server (on 127.0.0.1).
HEAD_URL_FILE = "dashboard.json"
#: What a played head writes when its boot fails (one line): :func:`head_url` raises it.
HEAD_FAILED_FILE = "failed.txt"


def deliver_token(instance_id: str, token: str) -> None:
    """What the CLI's SSH delivery does for a real head: the run's Ray token onto the played head's disk."""
    from rubberband.cloud.bootstrap import TOKEN_FILE

    disk = head_disk(instance_id)
    disk.mkdir(parents=True, exist_ok=True)
    tmp = disk / f".{TOKEN_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    tmp.replace(disk / TOKEN_FILE)


def head_disk(instance_id: str) -> Path:
    """The played head's "disk": its Ray temp files, node records and run root (gone when it ends)."""
    return Path(tempfile.gettempdir()) / f"rb-head-{instance_id}"


def play_head(cloud: str, region: str, run_id: str, instance_id: str, settings: WatchdogSettings) -> None:
    """Play a head instance's startup script: a detached local process (it outlives the CLI) that runs
    :func:`serve_head`. Returns at once; :func:`head_url` waits for its job server."""
    disk = head_disk(instance_id)
    disk.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        str(HERE),
        "--cloud",
        cloud,
        "--region",
        region,
        "--run-id",
        run_id,
        "--instance-id",
        instance_id,
        *dataclasses.replace(settings, poll_s=min(settings.poll_s, 1.0)).flags(),
    ]
    with open(disk / "boot.log", "ab") as log:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True
        )
    (disk / "boot.pid").write_text(f"{proc.pid}\n")  # its own process group: tests stop it with it


def head_url(instance_id: str, timeout_s: float = 180.0) -> str:
    """The job server URL of a played head, once it is up."""
    path = head_disk(instance_id) / HEAD_URL_FILE
    failed = head_disk(instance_id) / HEAD_FAILED_FILE
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if failed.exists():
            raise CloudError(f"head {instance_id} failed to boot: {failed.read_text().strip()}", kind="fatal")
        if time.monotonic() >= deadline or not head_disk(instance_id).exists():
            log = head_disk(instance_id) / "boot.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            raise CloudError(
                f"played head {instance_id} did not start its job server: {' | '.join(tail)}", kind="transient"
            )
        time.sleep(0.2)
    return json.loads(path.read_text())["url"]


def wait_head_gone(instance_id: str, timeout_s: float = 60.0) -> bool:
    """Wait until a played head has stopped every process and removed its disk (its instance ended)."""
    deadline = time.monotonic() + timeout_s
    while head_disk(instance_id).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def serve_head(cloud: str, region: str, run_id: str, instance_id: str, settings: WatchdogSettings) -> None:
    """What the head's startup script does, on this machine: a Ray head with its job server on 127.0.0.1,
    the watchdog; its node watchdog's power-off when the run watchdog leaves its ``POWEROFF`` marker (played as
    what the power-off does to the instance: EC2 terminates it, the GCP node watchdog deletes it); and what the
    instance's end does: once the provider no longer reports it running (terminated by the CLI, ``down``, the
    watchdog or its power-off), stop every Ray node of it and remove its disk."""
    from rubberband.cloud.bootstrap import HEAD_ID_ENV, POWEROFF_MARKER, RUN_ROOT_ENV, TOKEN_FILE, cloud_run_id
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.net import free_port
    from rubberband.cloud.registry import make_provider

    disk = head_disk(instance_id)
    local = LocalProvider(disk, auth_mode="token")  # with the run's token, as the head's startup script starts Ray
    provider = make_provider(cloud, region)
    me = next((i for i in provider.list(run_id) if i.id == instance_id), None)
    has_identity = me is not None and bool(me.identity)
    run_root = disk / "runs"
    token = disk / TOKEN_FILE  # the CLI writes it here (on a real head: over SSH)
    env = {
        RUN_ROOT_ENV: str(run_root),
        HEAD_ID_ENV: instance_id,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    try:
        waited = time.monotonic()
        while has_identity and not token.exists() and time.monotonic() - waited < settings.submit_timeout_s:
            time.sleep(0.2)  # as the head's boot waits for its token before `ray start`
        if has_identity and not token.exists():
            (disk / HEAD_FAILED_FILE).write_text("the CLI did not deliver the run's Ray token\n")
        elif has_identity:
            port = free_port()
            local.start_head_process(run_id, dashboard_port=port, env=env)
            tmp = disk / f".{HEAD_URL_FILE}.tmp"
            tmp.write_text(json.dumps({"url": f"http://127.0.0.1:{port}"}))
            tmp.replace(disk / HEAD_URL_FILE)
            # the watchdog comes as a Ray job from the CLI (HeadSession.submit_watchdog), as on a real head
        else:  # a real head without one gets no credentials from its metadata server: it could do nothing
            (disk / HEAD_FAILED_FILE).write_text(f"the instance has no identity: it cannot call the {cloud} API\n")
        last_answer = time.monotonic()
        marker = run_root / cloud_run_id(run_id) / POWEROFF_MARKER
        while True:
            time.sleep(0.5)
            if marker.exists():  # the node watchdog powers the head off: the instance ends
                with contextlib.suppress(Exception):
                    provider.terminate([instance_id])
            try:
                running = any(i.id == instance_id and i.alive for i in provider.list(run_id))
                last_answer = time.monotonic()
            except Exception:  # noqa: BLE001 - the cloud (a test server) is gone for good: the instance is too
                running = time.monotonic() - last_answer < 10.0
            if not running:
                break
    finally:
        local.terminate([r.id for r in local.records() if r.role == "node"])
        local.stop_head()
        _end_head_jobs(instance_id)
        shutil.rmtree(disk, ignore_errors=True)


def _end_head_jobs(instance_id: str) -> None:
    """Kill what the played head's jobs left running (a job's driver, e.g. the watchdog, outlives the
    local Ray it ran on): the processes whose environment names this head (``HEAD_ID_ENV``), by pid.
    On a real head the instance's termination ends them."""
    from rubberband.cloud.bootstrap import HEAD_ID_ENV

    needle = f"{HEAD_ID_ENV}={instance_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def main(argv: list[str] | None = None) -> int:
    """``python tests/played_boots.py ...``: :func:`serve_head` (started by :func:`play_head`)."""
    parser = argparse.ArgumentParser(prog="python tests/played_boots.py")
    for name in ("--cloud", "--region", "--run-id", "--instance-id"):
        parser.add_argument(name, required=True)
    for name in ("--submit-timeout", "--stall-timeout", "--done-grace", "--max-lifetime", "--poll"):
        parser.add_argument(name, type=float, required=True)
    args = parser.parse_args(argv)
    settings = WatchdogSettings(
        submit_timeout_s=args.submit_timeout,
        stall_timeout_s=args.stall_timeout,
        done_grace_s=args.done_grace,
        max_lifetime_s=args.max_lifetime,
        poll_s=args.poll,
    )
    serve_head(args.cloud, args.region, args.run_id, args.instance_id, settings)
    return 0


if __name__ == "__main__":  # pragma: no cover
    # run as a script, this folder is first on sys.path: drop it so that nothing of tests/ shadows rubberband
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE.parent:
        sys.path.pop(0)
    sys.exit(main())
