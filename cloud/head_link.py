"""How the CLI reaches the job server of a run's head: the one seam between the laptop and the head.

The head's Ray dashboard / job server listens on the head's 127.0.0.1 only (port
:data:`~rubberband.cloud.bootstrap.DASHBOARD_PORT`), so nothing but SSH is open to the user
(port 22, from ``--ssh-cidr`` only). A :class:`HeadLink` turns that into a URL for
``ray.job_submission.JobSubmissionClient``:

* :class:`SshTunnel` — ``ssh -N -L <local port>:127.0.0.1:8265 user@<head public address>`` with
  the user's key (``--ssh-key``); retried until the head's sshd answers (it is still booting). Host
  keys go to the run's own ``known_hosts`` (:func:`run_known_hosts`), never the user's: the first
  connection records the head's key, every later one (reattach, token delivery) must present the
  same, and a public address the cloud hands out again to another run's head is no conflict;
* :class:`DirectLink` — a URL as is: a CLI machine inside the network, or the tests' local head.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rubberband.cloud.bootstrap import DASHBOARD_PORT
from rubberband.errors import CloudError, InputError
from rubberband.net import free_port


class HeadLink(Protocol):
    """Something that yields the URL of the head's job server while it is open."""

    def open(self, timeout_s: float) -> str: ...

    def close(self) -> None: ...


@dataclass
class DirectLink:
    """The job server is reachable as is (same network, or a test's local head)."""

    url: str

    def open(self, timeout_s: float) -> str:
        return self.url

    def close(self) -> None:
        return None


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run_known_hosts(run_id: str, instance_id: str, run_dir: Path | None = None) -> Path:
    """The run's own ``known_hosts``: ``RUN_DIR/known_hosts`` when the run directory is known, else one per head
    under the user's cache (``~/.cache/rubberband/known_hosts/<run>-<instance>``)."""
    if run_dir is not None:
        return Path(run_dir) / "known_hosts"
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rubberband" / "known_hosts" / f"{run_id}-{instance_id}"


def ssh_options(known_hosts: Path, *, pinned: bool = False) -> list[str]:
    """The options of every ssh the CLI runs to a head: the run's known_hosts only, no agent or X11 forwarding,
    no password prompt. ``pinned``: ``known_hosts`` already holds the host's keys (read from its console,
    cloud/host_keys.py), so any other key is refused; otherwise the first key seen is recorded and kept."""
    return [
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"StrictHostKeyChecking={'yes' if pinned else 'accept-new'}",
        "-o",
        "HashKnownHosts=no",
        "-o",
        "ForwardAgent=no",
        "-o",
        "ForwardX11=no",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "IdentitiesOnly=yes",
    ]


@dataclass
class SshTunnel:
    """An ``ssh -N -L`` forward from a free local port to the head's job server."""

    host: str
    key_file: Path
    user: str = "ubuntu"
    remote_port: int = DASHBOARD_PORT
    ssh: str = "ssh"
    known_hosts: Path | None = None  # the run's own (run_known_hosts); None: one under the cache for this host
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def hosts_file(self) -> Path:
        return self.known_hosts or run_known_hosts("host", self.host)

    def command(self, local_port: int) -> list[str]:
        return [
            self.ssh,
            "-N",
            "-L",
            f"{local_port}:127.0.0.1:{self.remote_port}",
            "-i",
            str(self.key_file),
            *ssh_options(self.hosts_file),
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "ServerAliveInterval=30",
            f"{self.user}@{self.host}",
        ]

    def open(self, timeout_s: float) -> str:
        """Start the forward, retrying while the head boots; the URL once the local port listens."""
        if shutil.which(self.ssh) is None:
            raise InputError(
                f"`{self.ssh}` is not installed: the CLI reaches the run's head over SSH; install an "
                f"OpenSSH client or run with --head local from inside the cloud network"
            )
        if not Path(self.key_file).expanduser().is_file():
            raise InputError(f"--ssh-key {self.key_file}: no such private key file")
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        while True:
            port = free_port()
            self._proc = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            while self._proc.poll() is None and not _listening(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if self._proc.poll() is None and _listening(port):
                return f"http://127.0.0.1:{port}"
            error = self.close_with_error()
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"could not open an SSH tunnel to the head {self.user}@{self.host} within "
                    f"{timeout_s:.0f}s ({error or 'no answer'}); check --ssh-key, --ssh-cidr and the "
                    f"head's /var/log/rubberband-boot.log",
                    kind="transient",
                    code="SshTunnel",
                )
            time.sleep(5.0)  # sshd is not up yet (the head is booting)

    def close_with_error(self) -> str:
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.terminate()
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        lines = (err or b"").decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def close(self) -> None:
        self.close_with_error()
