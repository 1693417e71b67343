"""The boot path for real: the exact rendered startup scripts, executed with bash on this machine.

Per cloud flavor (AWS user-data, GCE startup-script), a head script and a worker script run as they
would on an instance, with only what this machine cannot be replaced, each passed to the renderer:

* the image's Python is a fresh virtualenv (``--system-site-packages``, so the pinned
  ``ray[default]==<this Ray>`` and the image's torch are found "already satisfied": the script's
  venv creation and its ``pip install`` really run, offline);
* the metadata server is a local HTTP endpoint speaking IMDSv2 (a PUT for a token, then the token
  header) or GCE's (``Metadata-Flavor: Google`` required);
* paths (``/opt/rubberband``, ``/var/lib/rubberband``, ``/var/log``, ``/dev/console``, the systemd unit
  directory, the token drop account's home) point into a temporary directory, and the power-off command is a
  recorder; ``systemctl`` answers "no systemd" (the node watchdog then runs in the background, as the script
  falls back to), ``useradd`` / ``chown`` are no-ops (no account is made on this machine);
* the run's Ray token is written where the CLI (head) and the head's SSH push (worker) would put it: both nodes'
  Ray run with token authentication, and the job is submitted with the token.

The head script starts a real Ray head (job server on 127.0.0.1), the worker script joins it with its
``rb-node-<instance id>`` resource, and a Ray job submitted the way the CLI submits runs
(``runtime_env`` = the rubberband package of this checkout + the training code directory) trains a 2-worker DDP
trial on the worker node: the head's driver and the worker's trial processes import rubberband from
the shipped package (the image has none) and the training code from the shipped working directory.

Slow (about 1.5-2 minutes per cloud on the shared 2-core machine: two venvs, two Ray nodes, a job).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.gcp.boot import GCP_BOOT
from rubberband.cloud.bootstrap import BOOT_FAILED, BootstrapConfig, client_versions, render_startup_script
from rubberband.cloud.local_head import private_address
from rubberband.cloud.head_session import submit_when_ready
from rubberband.cloud.shipping import build_package, job_runtime_env
from rubberband.net import free_port as os_free_port

from conftest import REPO
from ray_clients import job_server_client


class DistinctPorts:
    """Free ports, none handed out twice in this test process. The ports one ``ray start`` is given must differ (Ray
    refuses a clash before it starts anything), and the OS may hand the same free port to two calls in a row: a
    fresh Debian's head once failed all three of its tries on a metrics port equal to its GCS port."""

    def __init__(self) -> None:
        self._given: set[int] = set()

    def __call__(self) -> int:
        port = os_free_port()
        while port in self._given:
            port = os_free_port()
        self._given.add(port)
        return port


free_port = DistinctPorts()

DIALECTS = {"aws": AWS_BOOT, "gcp": GCP_BOOT}

pytestmark = pytest.mark.e2e

TOKEN = "imds-token-7f3a"


class MetadataServer:
    """A cloud metadata server for one instance: AWS IMDSv2 (token flow) and GCE (``Metadata-Flavor``)."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                return None

            def _answer(self, status: int, body: str = "") -> None:
                server.requests.append((self.command, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(200, TOKEN)
                else:
                    self._answer(400)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/latest/meta-data/instance-id":
                    ok = self.headers.get("X-aws-ec2-metadata-token") == TOKEN
                    self._answer(200 if ok else 401, server.instance_id if ok else "")
                elif self.path == "/computeMetadata/v1/instance/name":
                    ok = self.headers.get("Metadata-Flavor") == "Google"
                    self._answer(200 if ok else 403, server.instance_id if ok else "")
                else:
                    self._answer(404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


#: The job the test submits as the CLI submits a run: it runs on the head (driver) and trains one trial on the
#: worker node through rubberband's trial runtime, then says where everything was imported from.
JOB = """
import json, os, sys
import ray
import rubberband
from rubberband.executor.trials import TrialRun, TrialSpec


node, out = sys.argv[1], sys.argv[2]
ray.init()
resource = f"rb-node-{node}"
spec = TrialSpec(trial_id="t0", config={"lr": 0.05}, entry_point="tiny_train:train", code_dir=os.getcwd(),
                 start_epoch=0, end_epoch=2, placement=(resource, resource), checkpoint_dir=os.path.join(out, "ckpt"))
outcome = TrialRun.start(spec).result(timeout_s=300)


@ray.remote(num_cpus=0, resources={resource: 0.001})
def where():
    import rubberband, tiny_train
    return {"rubberband": rubberband.__file__, "train": tiny_train.__file__, "python": sys.version.split()[0],
            "ray": ray.__version__, "node": ray.get_runtime_context().get_node_id()}


print("RESULT " + json.dumps({"driver": rubberband.__file__, "worker": ray.get(where.remote()),
                              "epochs": [r.epoch for r in outcome.reports],
                              "loss": [r.metrics["loss"] for r in outcome.reports],
                              "head_node": ray.get_runtime_context().get_node_id()}), flush=True)
"""


class Node:
    """One "instance": its rendered script run by bash in its own session (its Ray processes stay in it)."""

    def __init__(self, name: str, script: str, root: Path, env: dict[str, str]) -> None:
        self.name, self.root = name, root
        (root / "user-data.sh").write_text(script)
        self.out = open(root / "bash.out", "wb")
        self.proc = subprocess.Popen(
            ["bash", str(root / "user-data.sh")],
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait_booted(self, timeout_s: float) -> None:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not finish booting in {timeout_s:.0f}s: {self.console()[-3000:]}")
        assert code == 0, f"{self.name} boot failed ({code}): {self.console()[-3000:]}"

    def console(self) -> str:
        path = self.root / "console"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """What terminating the instance does: every process of its boot (Ray's included) ends."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.out.close()


def leftover_pids(marker: str) -> list[int]:
    """Processes whose command line or environment names ``marker`` (this test's own temp directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
                if marker.encode() in text:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _image(root: Path) -> Path:
    """The image's Python (``root/image``): ray, torch and the rest "preinstalled", no rubberband."""
    image = root / "image"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(image)], check=True)
    # "preinstalled" means this test's own packages (in CI a fresh venv's, not the base interpreter's): the boot's
    # pinned installs (the CLI's versions) are then found already satisfied, offline. A .pth line adds the
    # directory without running its own .pth files, so the editable rubberband stays out of the image.
    import sysconfig

    image_site = subprocess.run(
        [str(image / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(image_site, "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert (
        subprocess.run(
            [str(image / "bin" / "python3"), "-c", "import rubberband"], cwd=root, capture_output=True
        ).returncode
        != 0
    )
    return image


def _keep_logs(root: Path, keep: Path) -> None:
    """Copy the cluster's small text files (consoles, boot logs, Ray's logs) from ``root`` into ``keep``."""
    for path in root.rglob("*"):
        if (
            path.is_file()
            and not path.is_symlink()
            and "opt-rubberband" not in path.parts
            and "image" not in path.parts
            and path.suffix in (".log", ".out", ".err", ".sh", "")
            and path.stat().st_size < 2 * 1024**2
        ):
            target = keep / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(path, target)
            except OSError:
                pass


@pytest.mark.boot  # slow (two venvs, two Ray nodes, a job): in a pytest process of its own (.ci/run)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_rendered_scripts_boot_a_cluster_that_trains_the_shipped_code(cloud, monkeypatch, tmp_path):
    from ray.job_submission import JobStatus

    root = Path(tempfile.mkdtemp(prefix="rbboot-"))  # short: Ray's socket paths must stay under 108 bytes
    image = _image(root)
    poweroffs = root / "poweroff.log"
    recorder = root / "poweroff"
    recorder.write_text(f'#!/bin/bash\necho "$@" >> {poweroffs}\n')
    recorder.chmod(0o755)
    versions = client_versions()
    ray_port, dashboard_port = free_port(), free_port()
    address = private_address()
    stubs = root / "stubs"
    stubs.mkdir()
    for tool, code in (("systemctl", 1), ("useradd", 0), ("chown", 0)):
        (stubs / tool).write_text(f"#!/bin/bash\nexit {code}\n")
        (stubs / tool).chmod(0o755)
    env = {
        "PATH": f"{stubs}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root),
        "RAY_TMPDIR": str(root / "ray"),
        "LANG": "C.UTF-8",
    }
    token = secrets.token_hex(32)
    for where in ("head/state", "worker/drop"):  # delivered by the CLI (head) and the head's push (worker)
        (root / where).mkdir(parents=True)
        (root / where / "ray-token").write_text(token)
    (root / "ray").mkdir()
    servers = {"head": MetadataServer(f"{cloud}-head-0"), "worker": MetadataServer(f"{cloud}-worker-1")}
    nodes: list[Node] = []

    def config(role: str, **kw) -> BootstrapConfig:
        disk = root / role
        disk.mkdir(exist_ok=True)
        # several Ray nodes share this machine (and other tests' clusters): free ports, a small object store
        # and each "instance" its own disk for Ray's files (a worker otherwise shares the head's session directory)
        # Ray's temp dir is kept short: its sockets (``<temp>/session_<date>_<pid>/sockets/dash_MetricsHead``) must fit
        # AF_UNIX's 107 bytes, and a 5-digit pid made the longer ``<disk>/ray`` miss by one (the dashboard then died)
        temp = root / role[0]
        assert len(str(temp)) + len("/session_2026-11-24_03-14-49_511076_1234567/sockets/dash_MetricsHeadXXXX") <= 107
        ports = [
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--metrics-export-port",
            str(free_port()),
            "--object-store-memory",
            str(96 * 1024**2),
            "--temp-dir",
            str(temp),
        ]
        if role == "head":
            ports += ["--ray-client-server-port", str(free_port())]
        return BootstrapConfig(
            ray_start_options=tuple(ports),
            run_id=f"boot-{cloud}",
            dialect=DIALECTS[cloud],
            role=role,
            region="r1",
            ray_port=ray_port,
            dashboard_port=dashboard_port,
            venv=str(disk / "opt-rubberband"),
            run_root=str(disk / "var-lib-rubberband" / "runs"),
            log_dir=str(disk / "var-log"),
            console=str(disk / "console"),
            image_pythons=(str(image / "bin" / "python3"),),
            metadata_url=servers[role].url,
            shutdown_command=str(recorder),
            state_dir=str(disk / "state"),
            systemd_dir=str(disk / "systemd"),
            token_drop_dir=str(disk / "drop"),
            # a cloud head boots on the image's own Python; a worker needs its head's minor
            python_version=None if role == "head" else str(versions["python_version"]),
            ray_version=str(versions["ray_version"]),
            torch_version=versions["torch_version"],
            runtime_requirements=tuple(versions["requirements"]),
            **kw,
        )

    try:
        head = Node("head", render_startup_script(config("head")), root / "head", env)
        nodes.append(head)
        head.wait_booted(300)
        worker = Node(
            "worker",
            render_startup_script(
                config(
                    "worker",
                    head_address=address,
                    workers=2,
                    use_gpu=False,
                    requirements=("numpy>=1.24",),
                    token_push_key=(root / "head" / "state" / "push_key.pub").read_text().strip(),
                )
            ),
            root / "worker",
            env,
        )
        nodes.append(worker)
        worker.wait_booted(300)
        for node in nodes:
            deadline = time.monotonic() + 10
            while "ready: Ray is up" not in node.console() and time.monotonic() < deadline:
                time.sleep(0.1)  # the console's tee may write the last line just after bash ends
            console = node.console()
            assert "ready: Ray is up" in console and BOOT_FAILED not in console
            assert (node.root / "var-log" / "rubberband-boot.log").read_text() == console
        assert "reusing the image's torch" in worker.console()
        # the metadata flows the cloud's way: IMDSv2 asks for a token first; GCE needs its header
        if cloud == "aws":
            assert [r[:2] for r in servers["worker"].requests] == [
                ("PUT", "/latest/api/token"),
                ("GET", "/latest/meta-data/instance-id"),
            ]
        else:
            assert servers["worker"].requests == [("GET", "/computeMetadata/v1/instance/name", 200)]

        code = root / "code"  # the user's training code directory, shipped as the job's working_dir
        code.mkdir()
        shutil.copy(REPO / "tests" / "trial_code" / "tiny_train.py", code)
        (code / "boot_job.py").write_text(JOB)
        package = build_package(root / "cache")
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # this process's own Ray: the token goes as a header
        client = job_server_client(dashboard_port, token)
        # as the CLI submits: its job agent can still be starting after Ray is up ("try again later")
        job = submit_when_ready(
            client,
            120.0,
            "the booted head",
            entrypoint=f"python boot_job.py {cloud}-worker-1 {root / 'trial'}",
            runtime_env=job_runtime_env(package, code),
        )
        deadline = time.monotonic() + 420
        while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.monotonic() < deadline, client.get_job_logs(job)[-3000:]
            time.sleep(1.0)
        logs = client.get_job_logs(job)
        assert status == JobStatus.SUCCEEDED, logs[-4000:]
        result = json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT "))[7:])
        assert result["epochs"] == [0, 1] and all(loss == loss for loss in result["loss"])  # trained, finite
        shipped = "py_modules_files"  # where Ray unpacks a job's py_modules on each node
        assert shipped in result["driver"] and shipped in result["worker"]["rubberband"]  # shipped, not installed
        assert str(REPO) not in result["driver"] + result["worker"]["rubberband"]
        assert "working_dir_files" in result["worker"]["train"]  # the training code came with the job
        assert result["worker"]["node"] != result["head_node"]  # the trial ran on the booted worker
        assert result["worker"]["ray"] == versions["ray_version"]
        assert result["worker"]["python"].rsplit(".", 1)[0] == versions["python_version"]
        assert not poweroffs.exists()  # nothing asked to power off
    finally:
        for node in reversed(nodes):
            node.kill()
        _keep_logs(root, tmp_path / "cluster")  # consoles, boot logs and Ray's logs, for a failure's post-mortem
        for server in servers.values():
            server.close()
        for pid in leftover_pids(str(root)):  # anything of this cluster that left the nodes' sessions
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    assert leftover_pids(str(root)) == []
