"""The run's head: startup scripts, the watchdog's decisions, and self-termination against moto."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import boto3
import pytest
from cloud_helpers import (
    FAKE_ACCESS_KEY,
    REGION,
    cloud_catalog,
    ec2_faults,  # noqa: F401
    moto_ami,
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
)

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.gcp.boot import GCP_BOOT
from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.bootstrap import (
    BootstrapConfig,
    WatchdogSettings,
    cloud_run_id,
    render_startup_script,
    validate_run_id,
)
from rubberband.cloud.watchdog_cli import build_parser
from rubberband.cloud.head import (
    DONE_MARKER,
    HeadBoot,
    Observation,
    WatchedRun,
    decide,
    head_startup_script,
    observe,
    provision_head,
    self_terminate,
    watch,
    worker_startup_script,
)
from rubberband.cloud.provider import TAG_ROLE, InstanceRequest
from rubberband.errors import CloudError, InputError

SETTINGS = WatchdogSettings(
    submit_timeout_s=600, stall_timeout_s=900, done_grace_s=300, max_lifetime_s=86400, poll_s=30
)
G4 = cloud_catalog().find("g4dn.xlarge", region=REGION)


def obs(now, *, submitted=True, progress=None, done=None, booted=0.0) -> Observation:
    return Observation(now=now, booted_at=booted, submitted=submitted, last_progress_at=progress, done_at=done)


@pytest.mark.parametrize(
    "observation, terminate, reason",
    [
        (obs(100, submitted=False), False, "waiting for the run"),
        (obs(600, submitted=False), True, "no run was submitted within 600s"),
        (obs(1000, progress=500), False, "running"),
        (obs(1400, progress=500), True, "no progress for 900s"),
        (obs(1000, progress=None), True, "no progress for 1000s"),  # submitted but never progressed
        (obs(1000, progress=900, done=900), False, "waiting for the CLI"),
        (obs(1200, progress=900, done=900), True, "finished 300s ago"),
        (obs(86400, progress=86399), True, "maximum lifetime"),
    ],
)
def test_decide(observation, terminate, reason):
    decision = decide(observation, SETTINGS)
    assert decision.terminate is terminate and reason in decision.reason


def test_observe_reads_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    assert observe(run_dir, 0, 10) == Observation(10, 0, False, None, None)
    (run_dir / "trials").mkdir(parents=True)
    journal = run_dir / "trials" / "journal.jsonl"
    journal.write_text("{}\n")
    os.utime(journal, (1000, 1000))
    seen = observe(run_dir, 0, 2000)
    assert seen.submitted and seen.last_progress_at == 1000 and seen.done_at is None
    (run_dir / DONE_MARKER).write_text("")
    os.utime(run_dir / DONE_MARKER, (1500, 1500))
    assert observe(run_dir, 0, 2000).done_at == 1500


VERSIONS = dict(ray_version="2.60.0", python_version="3.11", torch_version="2.13.0")
#: The head's public push key (cloud/ray_token.py), as a worker's user-data carries it.
PUSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJtVq0Yq5d0Vb1s2YkF6mQy0Z6bYk8m2m3Yl1i1o9a0b rubberband-token-push"


def test_scripts_join_the_head_and_hold_no_secrets():
    head = render_startup_script(
        BootstrapConfig(
            run_id="run-s",
            dialect=AWS_BOOT,
            role="head",
            region=REGION,
            rubberband_version="0.1.0",
            max_lifetime_s=7200,
            watchdog=SETTINGS,
            **VERSIONS,
        )
    )
    assert "ray.scripts.scripts start --head --port=6379 --num-cpus=0 --dashboard-host=127.0.0.1" in head
    assert "shutdown -h +120" in head and "-ge 600 ]" in head  # lifetime cap; unsubmitted head powers off
    assert "X-aws-ec2-metadata-token" in head  # IMDSv2: token first
    assert "rubberband==" not in head and "pip install" in head and "'ray[default]==2.60.0'" in head
    assert "torch" not in head.split("pip install", 1)[1]  # the head trains nothing: no torch
    assert "/dev/console" in head and "rubberband-boot.log" in head  # boot progress on the serial console
    worker = render_startup_script(
        BootstrapConfig(
            run_id="run-s",
            dialect=GCP_BOOT,
            role="worker",
            head_address="10.128.0.2",
            workers=4,
            token_push_key=PUSH_KEY,
            requirements=("transformers==4.46.0",),
            **VERSIONS,
        )
    )
    assert "RB_HEAD=10.128.0.2:6379" in worker and "--num-gpus=4" in worker
    assert 'rb-node-${INSTANCE_ID}\\": 4' in worker and "Metadata-Flavor: Google" in worker
    assert "'ray[default]==2.60.0' transformers==4.46.0" in worker and "rubberband==" not in worker
    assert "pip install --quiet torch==2.13.0" in worker and "import torch" in worker  # only where the image has none
    cpu = render_startup_script(
        BootstrapConfig(
            run_id="run-s",
            dialect=AWS_BOOT,
            role="worker",
            head_address="10.0.0.2",
            use_gpu=False,
            ray_auth="disabled",
            **{**VERSIONS, "torch_version": "2.13.0+cu121"},
        )
    )
    assert "torch==2.13.0+cpu" in cpu and "download.pytorch.org/whl/cpu" in cpu
    assert "RAY_AUTH_MODE=disabled" in cpu and "rubberband-token" not in cpu  # --head local: no token to push
    # token mode: the head's key may only drop the token (restrict + forced command); Ray waits for the token
    assert 'restrict,command="umask 077; cat > /var/lib/rubberband-token/ray-token.part' in worker
    assert PUSH_KEY in worker and "export RAY_AUTH_TOKEN_PATH=/var/lib/rubberband/ray-token" in worker
    assert worker.index("waiting for the run's Ray token") < worker.index("ray.scripts.scripts start")
    assert head.index("waiting for the run's Ray token from the CLI") < head.index("ray.scripts.scripts start")
    with pytest.raises(InputError, match="token_push_key"):
        render_startup_script(
            BootstrapConfig(
                run_id="run-s",
                dialect=AWS_BOOT,
                role="worker",
                head_address="10.0.0.2",
                token_push_key="ssh-rsa AAAA; rm -rf /",
                **VERSIONS,
            )
        )
    with pytest.raises(InputError, match="head_address"):
        render_startup_script(BootstrapConfig(run_id="run-s", dialect=AWS_BOOT, role="worker", **VERSIONS))
    with pytest.raises(InputError, match="credential"):
        render_startup_script(
            BootstrapConfig(
                run_id="run-s", dialect=AWS_BOOT, role="head", requirements=("AWS_SECRET_ACCESS_KEY=x",), **VERSIONS
            )
        )
    with pytest.raises(InputError, match="python_version"):
        render_startup_script(
            BootstrapConfig(
                run_id="run-s", dialect=AWS_BOOT, role="head", **{**VERSIONS, "python_version": "3.11; rm -rf /"}
            )
        )
    for bad in ("Run_1", "", "a;rm -rf /", "x" * 42):
        with pytest.raises(InputError):
            validate_run_id(bad)
    assert validate_run_id(cloud_run_id("MNIST_tune 2026-11-21T05:30")) and cloud_run_id("run-1") == "run-1"
    assert cloud_run_id("A_b") != cloud_run_id("a-b")  # distinct ids stay distinct


def ec2_states() -> dict[str, str]:
    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}


def test_head_provisioned_then_watchdog_ends_a_stalled_run(moto_env, tmp_path):
    provider = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01)
    head = provision_head(provider, "run-w", REGION, G4.zones, HeadBoot(SETTINGS, timeout_s=10))
    assert head.role == "head" and head.state == "running" and head.instance_type == "m6i.large"
    user_data = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=head.id, Attribute="userData"
    )["UserData"]["Value"]
    assert "ray.scripts.scripts start --head" in base64.b64decode(user_data).decode()
    script = worker_startup_script(AWS_BOOT, "run-w", head, G4)
    assert f"RB_HEAD={head.address}:6379" in script
    workers = provider.provision(
        InstanceRequest("run-w", 0, G4, count=2, startup_script=script, extra_tags={TAG_ROLE: "worker"})
    )

    run_dir = tmp_path / "run-w"
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text('{"type": "start"}\n')
    start = time.time()
    ticks = iter(range(1000))
    shutdowns: list[int] = []
    decision = watch(
        WatchedRun(provider, "run-w", head.id, run_dir),
        SETTINGS,
        clock=lambda: start + 30 * next(ticks),
        sleep=lambda s: None,
        shutdown=lambda: shutdowns.append(1),
    )
    assert decision.terminate and "no progress" in decision.reason
    states = ec2_states()
    assert {states[w.id] for w in workers} == {"terminated"} and states[head.id] == "terminated"
    assert shutdowns == [] and provider.list("run-w") == []
    # the head left the run's group and deleted it before its end (issue 29): nothing is left for the CLI
    assert provider.find_security_group("run-w") is None and provider.cleanup_run("run-w", timeout_s=10) == []


def test_head_falls_back_to_shutdown_when_it_cannot_terminate_itself(moto_env):
    provider = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01)
    (head,) = provider.provision(InstanceRequest("run-x", 0, G4, extra_tags={TAG_ROLE: "head"}))
    (worker,) = provider.provision(InstanceRequest("run-x", 0, G4))

    class NoSelfTerminate:
        cloud = "aws"

        def list(self, run_id=None):
            return provider.list(run_id)

        def terminate(self, ids):
            if head.id in ids:
                raise CloudError("aws UnauthorizedOperation", kind="fatal", code="UnauthorizedOperation")
            provider.terminate(ids)

    shutdowns: list[int] = []
    terminated = self_terminate(NoSelfTerminate(), "run-x", head.id, shutdown=lambda: shutdowns.append(1))
    assert [w.id for w in terminated] == [worker.id] and shutdowns == [1]
    assert ec2_states()[worker.id] == "terminated"
    provider.terminate([head.id])
    provider.cleanup_run("run-x", timeout_s=10)


def test_watchdog_process_ends_an_unsubmitted_run(moto_env, tmp_path):
    """The real entry point, in a subprocess that finds moto through AWS_ENDPOINT_URL alone."""
    provider = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01)
    (head,) = provider.provision(InstanceRequest("run-p", 0, G4, extra_tags={TAG_ROLE: "head"}))
    (worker,) = provider.provision(InstanceRequest("run-p", 0, G4))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband.cloud.watchdog_cli",
            "watchdog",
            "--cloud",
            "aws",
            "--region",
            REGION,
            "--run-id",
            "run-p",
            "--head-id",
            head.id,
            "--run-dir",
            str(tmp_path / "never-submitted"),
            "--submit-timeout",
            "0",
            "--poll",
            "0.1",
            "--no-shutdown",
        ],
        env={**os.environ, **moto_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "no run was submitted" in done.stdout
    states = ec2_states()
    assert states[head.id] == states[worker.id] == "terminated"
    assert FAKE_ACCESS_KEY not in done.stdout + done.stderr
    provider.cleanup_run("run-p", timeout_s=10)


STUB = """#!/bin/bash
printf '%s\\0' "$(basename "$0")" "$@" >> "$RB_STUB_LOG"; printf '\\n' >> "$RB_STUB_LOG"
"""
#: The runtime's python: answers the script's questions (no torch here, Ray 2.60.0, where site-packages is).
VENV_PYTHON = (
    STUB
    + """case "$*" in
  *"import torch"*) exit 1;;
  *ray.__version__*) echo 2.60.0;;
  *purelib*) echo "$(dirname "$0")";;
esac
"""
)


def run_script(script: str, tmp_path, *, wait_for: str | None = None) -> list[list[str]]:
    """Execute a rendered startup script with curl, python3, shutdown, sleep and the venv's tools stubbed.

    Every stub logs its argv; python3 -m venv creates the venv's stub python (its pip and Ray are
    ``python -m ...``). Returns the logged command lines (after ``wait_for``, a tool a background job
    calls, has logged). tests/test_cloud_boot.py executes the same scripts for real.
    """
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True)
    log = tmp_path / "calls.log"
    (stubs / "shutdown").write_text(STUB)
    (stubs / "systemctl").write_text(STUB)  # records the watchdog's installation as a service
    for tool in ("useradd", "chown"):  # the worker's token drop account: recorded, not made
        (stubs / tool).write_text(STUB)
    (stubs / "id").write_text(STUB + "exit 1\n")
    (stubs / "python").write_text(VENV_PYTHON)
    (stubs / "sleep").write_text("#!/bin/bash\nexit 1\n")  # ends the background loops at once
    (stubs / "curl").write_text(
        STUB + 'case "$*" in *api/token*) echo tok;; *instance-id*|*instance/name*) echo i-0abc;; esac\n'
    )
    (stubs / "python3.11").write_text(
        STUB + f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; cp {stubs}/python "$3/bin/python"; fi\n'
    )
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RB_STUB_LOG": str(log), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr, (tmp_path / "console").read_text())
    deadline = time.monotonic() + 20
    while True:  # background jobs log asynchronously
        calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
        if wait_for is None or any(c[0] == wait_for for c in calls) or time.monotonic() > deadline:
            return calls
        time.sleep(0.05)


@pytest.mark.e2e
def test_rendered_scripts_run_and_start_ray_as_intended(tmp_path):
    common = dict(
        run_id="run-s",
        venv=str(tmp_path / "venv"),
        run_root=str(tmp_path / "runs"),
        log_dir=str(tmp_path / "log"),
        image_pythons=(),
        **VERSIONS,
    )
    for node in ("head", "worker"):  # the run's token, as the CLI (head) and the head (worker) deliver it
        (tmp_path / node / "drop").mkdir(parents=True)
        (tmp_path / node / ("state" if node == "head" else "drop") / "ray-token").parent.mkdir(exist_ok=True)
        (tmp_path / node / ("state" if node == "head" else "drop") / "ray-token").write_text("t0ken")
    head_calls = run_script(
        render_startup_script(
            BootstrapConfig(
                dialect=AWS_BOOT,
                role="head",
                region=REGION,
                max_lifetime_s=3600,
                watchdog=SETTINGS,
                console=str(tmp_path / "head" / "console"),
                state_dir=str(tmp_path / "head" / "state"),
                systemd_dir=str(tmp_path / "head" / "systemd"),
                **common,
            )
        ),
        tmp_path / "head",
    )
    shutdowns = [c[1:] for c in head_calls if c[0] == "shutdown"]
    assert shutdowns == [["-h", "+60"]]
    # the cap and the watchdog service come first, before the metadata server, pip or Ray are touched
    assert [c[0] for c in head_calls[:3]] == ["shutdown", "systemctl", "systemctl"]
    assert head_calls[1][1:] == ["daemon-reload"]
    assert head_calls[2][1:] == ["enable", "--now", "rubberband-watchdog.service"]
    unit = (tmp_path / "head" / "systemd" / "rubberband-watchdog.service").read_text()
    assert f"ExecStart=/bin/bash {tmp_path / 'head' / 'state'}/watchdog.sh" in unit and "Restart=always" in unit
    expires = int((tmp_path / "head" / "state" / "expires_at").read_text())
    assert abs(expires - (time.time() + 3600)) < 60
    assert (tmp_path / "head" / "state" / "ready").is_file()
    python = [c[1:] for c in head_calls if c[0] == "python"]
    pip = next(c for c in python if c[:3] == ["-m", "pip", "install"])
    assert "ray[default]==2.60.0" in pip and not any("rubberband" in a or "torch" in a for a in pip)
    start = next(c for c in python if c[:3] == ["-m", "ray.scripts.scripts", "start"])
    assert start[3] == "--head" and '--resources={"rb-head": 1}' in start
    assert (tmp_path / "runs" / "run-s").is_dir()
    console = (tmp_path / "head" / "console").read_text()
    assert "rubberband-boot:" in console and "ready: Ray is up" in console

    worker_calls = run_script(
        render_startup_script(
            BootstrapConfig(
                dialect=GCP_BOOT,
                role="worker",
                head_address="10.128.0.2",
                workers=2,
                console=str(tmp_path / "worker" / "console"),
                state_dir=str(tmp_path / "worker" / "state"),
                systemd_dir=str(tmp_path / "worker" / "systemd"),
                token_push_key=PUSH_KEY,
                token_drop_dir=str(tmp_path / "worker" / "drop"),
                **common,
            )
        ),
        tmp_path / "worker",
    )
    assert [c[0] for c in worker_calls[:2]] == ["systemctl", "systemctl"]  # the watchdog before anything else
    python = [c[1:] for c in worker_calls if c[0] == "python"]
    assert ["-m", "pip", "install", "--quiet", "torch==2.13.0"] in python  # this image has no torch
    start = next(c for c in python if c[:3] == ["-m", "ray.scripts.scripts", "start"])
    assert start[3] == "--address=10.128.0.2:6379" and "--num-gpus=2" in start
    resources = next(a for a in start if a.startswith("--resources="))
    assert json.loads(resources.split("=", 1)[1]) == {"rb-node-i-0abc": 2}  # the contract's resource name
    assert not any(c[0] == "shutdown" for c in worker_calls)  # no lifetime cap asked, head not lost
    assert not (tmp_path / "worker" / "state" / "expires_at").exists()
    assert [
        "useradd",
        "--system",
        "--home-dir",
        str(tmp_path / "worker" / "drop"),
        "--shell",
        "/bin/sh",
        "rubberband-token",
    ] in worker_calls
    # the token moved from the drop account into the root-only state directory before Ray started
    assert (tmp_path / "worker" / "state" / "ray-token").read_text() == "t0ken"
    assert not (tmp_path / "worker" / "drop" / "ray-token").exists()
    assert (tmp_path / "worker" / "state" / "ray-token").stat().st_mode & 0o077 == 0
    keys = (tmp_path / "worker" / "drop" / ".ssh" / "authorized_keys").read_text()
    assert keys.startswith('restrict,command="umask 077; cat > ') and keys.strip().endswith(PUSH_KEY)
    assert (tmp_path / "head" / "state" / "push_key.pub").read_text().startswith("ssh-ed25519 ")


@pytest.mark.e2e  # executes the rendered script with bash
def test_a_failed_boot_says_why_on_the_console(tmp_path):
    """A node whose image lacks the client's Python minor fails at boot with one line on its serial console."""
    script = render_startup_script(
        BootstrapConfig(
            run_id="run-f",
            dialect=AWS_BOOT,
            role="worker",
            head_address="10.0.0.2",
            image_pythons=(),
            venv=str(tmp_path / "venv"),
            run_root=str(tmp_path / "runs"),
            log_dir=str(tmp_path / "log"),
            console=str(tmp_path / "console"),
            state_dir=str(tmp_path / "state"),
            systemd_dir=str(tmp_path / "systemd"),
            ray_auth="disabled",
            **{**VERSIONS, "python_version": "3.99"},
        )
    )
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "systemctl").write_text("#!/bin/bash\nexit 0\n")
    (stubs / "curl").write_text("#!/bin/bash\necho i-0abc\n")
    (stubs / "shutdown").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/shutdown.log\n')
    (stubs / "apt-get").write_text("#!/bin/bash\nexit 100\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    console = (tmp_path / "console").read_text()
    from rubberband.cloud.bootstrap import BOOT_FAILED

    (failed,) = [line for line in console.splitlines() if BOOT_FAILED in line]
    assert "no Python 3.99" in failed and "choose an image with Python 3.99" in failed
    assert (tmp_path / "shutdown.log").read_text().split() == ["-h", "+10"]  # powers off later, not now
    assert (tmp_path / "log" / "rubberband-boot.log").read_text() == console
    assert (tmp_path / "state" / "failed").is_file()  # the node watchdog powers it off even after a reboot


def test_watchdog_as_a_job_asks_the_boot_script_to_power_off(tmp_path):
    """As a Ray job the watchdog has no power-off of its own: it leaves the marker the head's boot script acts on,
    and finds the run directory under the head's run root; it polls at least ten times per shortest timeout."""
    from rubberband.cloud.bootstrap import POWEROFF_MARKER
    from rubberband.cloud.head import poll_interval, request_poweroff

    request_poweroff(tmp_path / "run-q")()
    assert (tmp_path / "run-q" / POWEROFF_MARKER).is_file()
    args = build_parser().parse_args(
        ["watchdog", "--cloud", "aws", "--region", REGION, "--run-id", "run-q", "--head-id", "i-1", "--poweroff-marker"]
    )
    assert args.poweroff_marker and args.run_dir is None
    assert poll_interval(SETTINGS) == 30 and poll_interval(WatchdogSettings(done_grace_s=1.0)) == 0.1
    script = render_startup_script(BootstrapConfig(run_id="run-q", dialect=AWS_BOOT, role="head", **VERSIONS))
    assert f"/var/lib/rubberband/runs/run-q/{POWEROFF_MARKER} ]; then" in script


def test_worker_scripts_rendered_on_a_head_pin_the_clis_versions(monkeypatch):
    """The head's runtime has Ray but no torch, and the shipped rubberband no metadata: the worker scripts it
    renders must still pin the torch and the runtime packages of the CLI that started the run (passed down in
    every job's environment), and the head's own Python minor (the workers join its Ray)."""
    import json
    import sys

    from rubberband.cloud.bootstrap import RUN_VERSIONS_ENV
    from rubberband.cloud.provider import Instance

    head = Instance(
        id="i-head",
        cloud="aws",
        instance_type="m6i.large",
        zone="us-east-1a",
        state="running",
        run_id="run-v",
        address="10.0.0.5",
        tags={"rubberband-role": "head"},
    )
    monkeypatch.setenv(
        RUN_VERSIONS_ENV,
        json.dumps(
            {
                "ray_version": "2.60.0",
                "torch_version": "2.13.0+cpu",
                "requirements": ["numpy==2.4.6", "pydantic==2.13.4"],
            }
        ),
    )
    script = worker_startup_script(AWS_BOOT, "run-v", head, G4)
    assert "torch==2.13.0" in script and "'ray[default]==2.60.0' numpy==2.4.6 pydantic==2.13.4" in script
    minor = f"{sys.version_info.major}, {sys.version_info.minor}"
    assert f"sys.exit(sys.version_info[:2] != ({minor}))" in script  # this machine's (the head's) minor
    monkeypatch.setenv(RUN_VERSIONS_ENV, json.dumps({"ray_version": "2.60.0", "torch_version": None}))
    assert "torch==" not in worker_startup_script(AWS_BOOT, "run-v", head, G4)  # nothing to pin: the image's own


def test_a_cloud_heads_script_takes_the_images_python_and_pins_the_runtime(monkeypatch):
    """The CLI reaches a cloud head only through Ray's job HTTP API: the head boots on the image's own Python
    (the Deep Learning images' first, where their CUDA torch lives) if Ray supports it, whatever the CLI's."""
    script = head_startup_script(AWS_BOOT, "us-east-1", "run-h")
    assert "sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))" in script
    assert "for cand in /opt/pytorch/bin/python3 /opt/conda/bin/python3 python3; do" in script
    assert "apt-get install -y -qq python3." not in script  # no OS Python of the CLI's minor is forced on it
    assert " numpy==" in script and " pydantic==" in script  # rubberband's runtime, pinned to the CLI's versions
    assert "torch==" not in script  # the head trains nothing


@dataclass(frozen=True)
class NodeState:
    """What a node's watchdog finds: its boot finished (``ready``), its lifetime cap ``expires_in`` seconds away
    (None: none), ``ray health-check``'s exit code, booted ``booted_ago`` seconds ago, the run's watchdog asking
    it to power off (``poweroff``)."""

    ready: bool = True
    expires_in: int | None = None
    health: int = 0
    booted_ago: int = 0
    poweroff: bool = False


def run_node_watchdog(tmp_path, role: str, node: NodeState, **config) -> list[list[str]]:
    """Execute the rendered node watchdog (bash) of a ``role`` node in state ``node`` (``config``: more
    BootstrapConfig fields) with shutdown, sleep and the runtime's python stubbed; return the stubs' calls. The
    watchdog ends itself after powering off (or when a stub ``sleep`` fails)."""
    state, runs = tmp_path / "state", tmp_path / "runs"
    state.mkdir()
    (runs / "run-n").mkdir(parents=True)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    log = tmp_path / "calls.log"
    (stubs / "shutdown").write_text(STUB)
    (stubs / "sleep").write_text(STUB + f'[ "$(grep -c sleep {log})" -lt 5 ]\n')  # 5 polls at most, no waiting
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text(STUB + f"exit {node.health}\n")  # `ray health-check`'s answer
    for stub in [*stubs.iterdir(), tmp_path / "venv" / "bin" / "python"]:
        stub.chmod(0o755)
    now = int(time.time())
    (state / "booted_at").write_text(f"{now - node.booted_ago}\n")
    if node.expires_in is not None:
        (state / "expires_at").write_text(f"{now + node.expires_in}\n")
    if node.ready:
        (state / "ready").write_text("")
    if node.poweroff:
        (runs / "run-n" / "POWEROFF").write_text("")
    from rubberband.cloud.bootstrap import render_node_watchdog

    script = render_node_watchdog(
        BootstrapConfig(
            run_id="run-n",
            dialect=AWS_BOOT,
            role=role,
            head_address="10.0.0.2" if role == "worker" else None,
            venv=str(tmp_path / "venv"),
            run_root=str(runs),
            state_dir=str(state),
            console=str(tmp_path / "console"),
            **VERSIONS,
            **config,
        )
    )
    done = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{stubs}:/usr/bin:/bin", "RB_STUB_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return [line.split("\0")[:-1] for line in log.read_text().splitlines() if line] if log.exists() else []


@pytest.mark.e2e  # executes the rendered watchdog with bash
@pytest.mark.parametrize(
    "role, node, config, expect",
    [
        ("worker", NodeState(expires_in=-1), {}, "lifetime cap"),
        ("head", NodeState(expires_in=-1), {}, "lifetime cap"),
        ("worker", NodeState(ready=False, booted_ago=4000), {}, "boot did not finish"),
        ("worker", NodeState(health=1), dict(head_lost_timeout_s=120), "head was unreachable for 120s"),
        ("head", NodeState(poweroff=True), {}, "run's watchdog ended the run"),
        ("head", NodeState(booted_ago=700), dict(watchdog=SETTINGS), "no run was submitted within 600s"),
        ("worker", NodeState(expires_in=3600), {}, None),  # healthy, within its cap: polls on
        ("head", NodeState(ready=False, booted_ago=10), {}, None),  # still booting
    ],
)
def test_node_watchdog_powers_the_node_off(tmp_path, role, node, config, expect):
    calls = run_node_watchdog(tmp_path, role, node, **config)
    offs = [c[1:] for c in calls if c[0] == "shutdown"]
    if expect is None:
        assert offs == [] and sum(c[0] == "sleep" for c in calls) == 5
    else:
        assert offs == [["-h", "now"]] and expect in (tmp_path / "console").read_text()


def test_watchdog_shuts_down_when_every_api_call_fails(tmp_path):
    """provider.list, terminate and cleanup all raise (any exception, not only CloudError): the watchdog still
    ends the run, by shutting the head down."""
    from rubberband.cloud.head import NoApi

    class Broken:
        cloud = "gcp"
        calls: list[str] = []

        def list(self, run_id=None):
            self.calls.append("list")
            raise ConnectionError("metadata server unreachable")

        def terminate(self, ids):
            self.calls.append("terminate")
            raise CloudError("gcp backendError", kind="transient")

        def cleanup_run(self, run_id, timeout_s):
            self.calls.append("cleanup")
            raise RuntimeError("boom")

    shutdowns: list[int] = []
    decision = watch(
        WatchedRun(Broken(), "run-b", "rb-head", tmp_path / "never"),
        SETTINGS,
        clock=iter([0, 0, 601]).__next__,
        sleep=lambda s: None,
        shutdown=lambda: shutdowns.append(1),
    )
    assert decision.terminate and shutdowns == [1] and Broken.calls == ["list", "cleanup", "terminate"]
    assert self_terminate(NoApi("aws", "no credentials"), "run-b", "i-1", shutdown=lambda: shutdowns.append(2)) == []
    assert shutdowns == [1, 2]
