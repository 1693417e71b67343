"""How the CLI reaches the job server of a run's head: the one seam between the laptop and the head.

The head's Ray dashboard / job server listens on the head's 127.0.0.1 only (port
:data:`~rubberband.cloud.bootstrap.DASHBOARD_PORT`), so nothing but SSH is open to the user
(port 22, from ``--ssh-cidr`` only). A :class:`HeadLink` turns that into a URL for
``ray.job_submission.JobSubmissionClient``:

* :class:`SshTunnel` — ``ssh -N -L <local port>:127.0.0.1:8265 user@<head public address>`` with
  the user's key (``--ssh-key``); retried until the head's sshd answers (it is still booting);
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class SshTunnel:
    """An ``ssh -N -L`` forward from a free local port to the head's job server."""

    host: str
    key_file: Path
    user: str = "ubuntu"
    remote_port: int = DASHBOARD_PORT
    ssh: str = "ssh"
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    def command(self, local_port: int) -> list[str]:
        return [self.ssh, "-N", "-L", f"{local_port}:127.0.0.1:{self.remote_port}", "-i", str(self.key_file),
                "-o", "ExitOnForwardFailure=yes", "-o", "StrictHostKeyChecking=accept-new",
                "-o", "ServerAliveInterval=30", "-o", "ConnectTimeout=10", "-o", "BatchMode=yes",
                f"{self.user}@{self.host}"]

    def open(self, timeout_s: float) -> str:
        """Start the forward, retrying while the head boots; the URL once the local port listens."""
        if shutil.which(self.ssh) is None:
            raise InputError(f"`{self.ssh}` is not installed: the CLI reaches the run's head over SSH; install an "
                             f"OpenSSH client or run with --head local from inside the cloud network")
        if not Path(self.key_file).expanduser().is_file():
            raise InputError(f"--ssh-key {self.key_file}: no such private key file")
        deadline = time.monotonic() + timeout_s
        while True:
            port = _free_port()
            self._proc = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True)
            while self._proc.poll() is None and not _listening(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if self._proc.poll() is None and _listening(port):
                return f"http://127.0.0.1:{port}"
            error = self.close_with_error()
            if time.monotonic() >= deadline:
                raise CloudError(f"could not open an SSH tunnel to the head {self.user}@{self.host} within "
                                 f"{timeout_s:.0f}s ({error or 'no answer'}); check --ssh-key, --ssh-cidr and the "
                                 f"head's /var/log/rubberband-boot.log", kind="transient", code="SshTunnel")
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
