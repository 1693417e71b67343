"""The rendered startup scripts booted in real fresh Debian machines with systemd as PID 1 (tests/boot_os.py).

A head and a worker of one AWS run boot from the very scripts ``render_startup_script`` makes, as cloud-init
runs user-data: real apt, pip (from the index, through the host's CA certificates), ``useradd`` and
``systemctl enable --now``. The CLI's side is played by this process with the project's own code: the run's
token goes onto the head with :func:`deliver_to_head` (SSH as root, ``sudo``) and from the head's own push key
into the worker's drop account with :class:`SshTokenPush`, both over real sshd. Then: the worker's Ray joins
the authenticated head with its ``rb-node-<id>`` resource, and the head's :data:`POWEROFF_MARKER` powers it off.
Slow the first time (debootstrap, pip downloading Ray); the root filesystem and pip's cache are kept.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import boot_os
from test_cloud_boot import JOB, MetadataServer, free_port

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.bootstrap import (
    BOOT_FAILED,
    POWEROFF_MARKER,
    RAY_STOP_UNIT,
    TORCH_CPU_INDEX,
    WATCHDOG_UNIT,
    BootstrapConfig,
    client_versions,
    render_startup_script,
)
from rubberband.cloud.provider import Instance
from rubberband.cloud.host_keys import await_host_keys, pin_host_keys
from rubberband.cloud.ray_token import SshLogin, SshTokenPush, deliver_to_head, make_push_key, new_token

# one fresh Debian at a time: two nspawn containers side by side (one powering itself off) left systemd in the other
# without an answer on its bus in CI runs on 2 cores
pytestmark = [pytest.mark.e2e, pytest.mark.boot, pytest.mark.timeout(1800), pytest.mark.xdist_group("fresh_debian")]

RUN = "boot-os"
STATE = "/var/lib/rubberband"
VENV_RAY = ["/opt/rubberband/bin/python", "-m", "ray.scripts.scripts"]


def _config(role: str, metadata_url: str, ray_port: int, dashboard_port: int, **kw) -> BootstrapConfig:
    """A node's boot as production renders it, but for the ports: both nodes share this machine's network."""
    versions = client_versions()
    options = ["--node-ip-address=127.0.0.1", "--object-store-memory", str(96 * 1024**2)]
    options += ["--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]
    if role == "head":
        options += ["--ray-client-server-port", str(free_port())]
    return BootstrapConfig(
        run_id=RUN,
        dialect=AWS_BOOT,
        role=role,
        region="us-east-1",
        ray_version=str(versions["ray_version"]),
        python_version=None if role == "head" else str(versions["python_version"]),
        runtime_requirements=tuple(versions["requirements"]),
        metadata_url=metadata_url,
        ray_port=ray_port,
        dashboard_port=dashboard_port,
        ray_start_options=tuple(options),
        **kw,
    )


def _torch_cpu_index() -> str:
    """PyTorch's CPU index where it answers; else PyPI's, for a machine whose pip finds the CPU build in a local wheel
    directory (the nodes' /etc/pip.conf has the host's /opt/wheels as find-links): pip would retry the unreachable
    index for torch and each of its dependencies."""
    import urllib.request

    try:
        urllib.request.urlopen(TORCH_CPU_INDEX + "/", timeout=10).close()
        return TORCH_CPU_INDEX
    except OSError:
        return "https://pypi.org/simple"


def _ssh_on_port(work: Path, port: int) -> str:
    """`ssh` to the head's sshd port (deliver_to_head takes the ssh program, a cloud head listens on 22)."""
    wrapper = work / "ssh-head"
    wrapper.write_text(f'#!/bin/sh\nexec ssh -p {port} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_fresh_debian_boots_the_rendered_head_and_worker_and_powers_off_on_the_marker():
    reason = boot_os.unavailable()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    boot_os.rootfs()
    work = Path(tempfile.mkdtemp(prefix="rbos-", dir="/var/tmp"))
    servers: dict[str, MetadataServer] = {}
    nodes: list[boot_os.Node] = []
    try:
        servers.update(head=MetadataServer("i-head0"), worker=MetadataServer("i-worker1"))
        token_file = work / "ray-token"
        token_file.write_text(new_token())
        token_file.chmod(0o600)
        cli_key = make_push_key(work / "cli-key")  # the CLI's login to the head (an AMI's key pair)
        ray_port, dashboard_port = free_port(), free_port()
        head_ssh, worker_ssh = free_port(), free_port()

        head_config = _config("head", servers["head"].url, ray_port, dashboard_port)
        head = boot_os.Node(
            "head",
            work / "head",
            render_startup_script(head_config),
            ssh_port=head_ssh,
            files={"/root/.ssh/authorized_keys": Path(f"{cli_key}.pub").read_text()},
        )
        nodes.append(head)
        # the CLI's way: the head's host keys from its console, pinned before the first connection (no trust on
        # first use); the token then goes over a connection that accepts no other key
        keys = await_host_keys(head.console, what="the head", timeout_s=600, poll_s=1)
        known = pin_host_keys(work / "known_hosts", f"[127.0.0.1]:{head_ssh}", keys)
        login = SshLogin("127.0.0.1", "root", cli_key, known, pinned=True)
        deliver_to_head(login, token_file.read_text(), timeout_s=120, ssh=_ssh_on_port(work, head_ssh), poll_s=1)
        # the head makes its token push key after its pip install, right before it waits for the token
        head.wait_for(f"{STATE}/push_key.pub", 900, fail=f"{STATE}/failed")
        push_key = work / "head-push-key"
        shutil.copy(head.path(f"{STATE}/push_key"), push_key)
        push_key.chmod(0o600)
        shutil.copy(head.path(f"{STATE}/push_key.pub"), f"{push_key}.pub")

        worker_config = _config(
            "worker",
            servers["worker"].url,
            ray_port,
            dashboard_port,
            head_address="127.0.0.1",
            workers=2,
            use_gpu=False,
            torch_version=client_versions()["torch_version"],
            torch_cpu_index=_torch_cpu_index(),
            token_push_key=Path(f"{push_key}.pub").read_text().strip(),
        )
        worker = boot_os.Node("worker", work / "worker", render_startup_script(worker_config), ssh_port=worker_ssh)
        nodes.append(worker)

        # (a) the head boots to ready: real apt/pip/useradd/systemd, the token delivered over SSH
        boot_os.TIMINGS["head: boot to ready"] = head.wait_for(f"{STATE}/ready", 600, fail=f"{STATE}/failed")
        assert head.is_active(WATCHDOG_UNIT) == "active"
        assert head.is_active(boot_os.USER_DATA_UNIT) == "active"  # the oneshot finished with success
        assert head.is_active(RAY_STOP_UNIT) == "active"  # its stop runs `ray stop` at power-off

        # (c) the head's own key pushes the token over real SSH into the worker's drop account (forced command)
        instance = Instance(
            id="i-worker1",
            cloud="aws",
            instance_type="m5.large",
            zone="us-east-1a",
            state="running",
            run_id=RUN,
            address="127.0.0.1",
        )
        SshTokenPush(key_file=push_key, token_file=token_file, poll_s=1, port=worker_ssh).push(instance, 300)
        boot_os.TIMINGS["worker: boot to ready"] = worker.wait_for(f"{STATE}/ready", 900, fail=f"{STATE}/failed")
        # (b) the worker's watchdog is a real systemd service, and the drop account a real system account
        assert worker.is_active(WATCHDOG_UNIT) == "active"
        assert worker.run("id", "-u", "rubberband-token").returncode == 0
        assert worker.path(f"{STATE}/ray-token").read_text().strip() == token_file.read_text().strip()
        assert not worker.path("/var/lib/rubberband-token/ray-token").exists()  # moved into the state dir
        for node in nodes:
            console = node.console()
            assert "ready: Ray is up" in console and BOOT_FAILED not in console, console[-3000:]

        # (c) the worker joined the authenticated head: the head's GCS lists its rb-node-<id> resource
        for _ in range(30):  # `ray status` is the autoscaler's report, refreshed every few seconds
            status = _ray_status(head, ray_port, token=True)
            if "rb-node-i-worker1" in status:
                break
            time.sleep(2)
        assert "rb-node-i-worker1" in status and "rb-head" in status, status
        assert _ray_status(head, ray_port, token=False) == ""  # without the run's token the GCS answers nothing

        # (d) a job submitted as the CLI submits a run trains a 2-worker DDP trial with shipped code on the worker
        result = _run_shipped_trial(work, dashboard_port, token_file.read_text().strip())
        assert result["epochs"] == [0, 1] and all(loss == loss for loss in result["loss"]), result
        assert "py_modules_files" in result["driver"] and "py_modules_files" in result["worker"]["rubberband"]
        assert "working_dir_files" in result["worker"]["train"] and result["worker"]["node"] != result["head_node"]

        # (e) the run's watchdog marker powers the head off in seconds: `ray stop` (RAY_STOP_UNIT) ends its Ray first,
        # which otherwise outwaits systemd's final SIGTERM (92.6 s measured before that unit)
        marker = head.path(f"/var/lib/rubberband/runs/{RUN}/{POWEROFF_MARKER}")
        marked = time.monotonic()
        marker.touch()
        assert head.wait_stopped(300), f"the head did not power off: {head.console()[-3000:]}"
        boot_os.TIMINGS["head: marker to powered off"] = off_s = time.monotonic() - marked
        assert "the run's watchdog ended the run: powering off" in head.console()
        assert "Waiting for process" not in head.console() and off_s < 45, head.console()[-3000:]
    finally:
        for node in reversed(nodes):
            node.close()
        for server in servers.values():
            server.close()
        shutil.rmtree(work, ignore_errors=True)
        boot_os.TIMINGS["whole test"] = time.monotonic() - started
        print("\nboot tier timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in boot_os.TIMINGS.items()))


def test_a_failed_boot_powers_the_fresh_debian_off():
    """A boot that fails (a requirement no index has) says so on the console, marks itself failed and powers the node
    off after its grace: the script's own ``shutdown -h +1`` (systemd-logind's scheduled power-off) or the watchdog."""
    reason = boot_os.unavailable()
    if reason:
        pytest.skip(reason)
    work = Path(tempfile.mkdtemp(prefix="rbos-", dir="/var/tmp"))
    server = MetadataServer("i-head9")
    node = None
    try:
        config = _config(
            "head", server.url, free_port(), free_port(), requirements=("rubberband-no-such-package==0.0.1",)
        )
        config = dataclasses.replace(config, failed_grace_s=60.0)
        node = boot_os.Node("failed", work / "node", render_startup_script(config), ssh_port=free_port())
        node.wait_for(f"{STATE}/failed", 600)
        failed = time.monotonic()
        assert node.wait_stopped(240), f"the failed node did not power off: {node.console()[-3000:]}"
        boot_os.TIMINGS["failed boot: failed to powered off (grace 60 s)"] = time.monotonic() - failed
        console = node.console()
        assert BOOT_FAILED in console and "rubberband-no-such-package" in console, console[-3000:]
    finally:
        if node is not None:
            node.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)
        print("\nboot tier timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in boot_os.TIMINGS.items()))


def _run_shipped_trial(work: Path, dashboard_port: int, token: str) -> dict:
    """test_cloud_boot's job (rubberband and the training code shipped in its runtime_env), through the head's job
    server with the run's token; its RESULT line."""
    import json

    from ray.job_submission import JobStatus

    from conftest import REPO
    from ray_clients import job_server_client
    from rubberband.cloud.head_session import submit_when_ready
    from rubberband.cloud.shipping import build_package, job_runtime_env

    code = work / "code"
    code.mkdir()
    shutil.copy(REPO / "tests" / "trial_code" / "tiny_train.py", code)
    (code / "boot_job.py").write_text(JOB)
    # as the CLI connects: the head's job server can start listening after Ray is up (a CI run's first connection
    # was refused once)
    client = job_server_client(dashboard_port, token)
    # as the CLI submits: its job agent can still be starting after Ray is up ("try again later")
    job = submit_when_ready(
        client,
        120.0,
        "the booted head",
        entrypoint="python boot_job.py i-worker1 /tmp/rb-trial",
        runtime_env=job_runtime_env(build_package(work / "package"), code),
    )
    started = time.monotonic()
    while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() - started < 600, client.get_job_logs(job)[-3000:]
        time.sleep(2)
    boot_os.TIMINGS["job: submit to trained"] = time.monotonic() - started
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-4000:]
    return json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT "))[7:])


def _ray_status(node: boot_os.Node, port: int, *, token: bool) -> str:
    """`ray status` inside ``node`` against the head's GCS, with the run's token or none; its output if it worked."""
    env = ["RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={STATE}/ray-token"] if token else ["RAY_AUTH_MODE=disabled"]
    try:
        done = node.run("env", *env, *VENV_RAY, "status", f"--address=127.0.0.1:{port}", timeout=90)
    except subprocess.TimeoutExpired:
        return ""
    return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout) if done.returncode == 0 else ""
