"""The run's Ray token: made by the CLI, carried over SSH only, never in user-data, metadata, logs or journals.

A cloud run's Ray runs with token authentication (``RAY_AUTH_MODE=token``): its GCS, its job server
and every node refuse a caller without the run's token. The token is

* made per run by the CLI (:func:`new_token`) and kept in ``RUN_DIR/ray-token`` (mode 0600) so
  ``--attach`` can reach the job server again (:func:`read_run_token`);
* written onto the head over the CLI's SSH link (:func:`deliver_to_head`: the token on ssh's
  stdin, never on a command line), where the head's boot waits for it before ``ray start``;
* pushed by the head's executor to each worker (:class:`SshTokenPush`), over SSH inside the run's
  network (port 22 is open only between the run's nodes and, on the head, from ``--ssh-cidr``),
  to the worker's drop account whose one authorized key is the head's own push key with a forced
  command that can only write the token file (``cloud/bootstrap.py``). The push key is made on
  the head at boot and never leaves it; only its public half goes into a worker's user-data.
* given to Ray's job client as an ``Authorization`` header (:func:`auth_headers`).

Why SSH and not the cloud's secret store: rubberband's workers have no cloud identity at all (a
compromised worker can call no API), and a secret store would need one per run that can read it
(an IAM role and instance profile passed by the head on AWS, a second user-made service account on
GCP, which rubberband does not create). The SSH push needs no identity and the same code serves
both clouds. See docs/clouds.md, "Security".
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rubberband.cloud.bootstrap import TOKEN_DROP_USER, TOKEN_FILE
from rubberband.cloud.provider import Instance
from rubberband.cloud.shell import shell_word
from rubberband.errors import CloudError

#: The token's file in a run directory on the CLI's machine.
RUN_TOKEN_FILE = "ray-token"
#: Where the head's boot waits for the token (its state directory).
HEAD_TOKEN_PATH = f"/var/lib/rubberband/{TOKEN_FILE}"


def new_token() -> str:
    """A fresh per-run token (256 random bits, hex)."""
    return secrets.token_hex(32)


def write_run_token(run_dir: Path, token: str) -> Path:
    """Keep the run's token in ``RUN_DIR/ray-token``, readable by the user alone (created 0600, never widened)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    os.chmod(path, 0o600)
    return path


def read_run_token(run_dir: Path | None) -> str | None:
    """The run's token from its run directory, or None (a run started before tokens, or another machine)."""
    if run_dir is None:
        return None
    try:
        return (Path(run_dir) / RUN_TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def forget_run_token(run_dir: Path | None) -> None:
    """Delete the run's token once its cluster is gone (it opens nothing any more; no copy is kept)."""
    if run_dir is not None:
        (Path(run_dir) / RUN_TOKEN_FILE).unlink(missing_ok=True)


#: With ``--head local``: the CLI machine's key for pushing the token to the run's workers (its ``.pub`` beside it).
PUSH_KEY_FILE = "token-push-key"


def make_push_key(key_file: Path, *, keygen: str = "ssh-keygen") -> Path:
    """Make an ed25519 key pair for pushing the run's token (kept when there: a resumed run's workers hold its
    public half); the private key is 0600 and never leaves this machine."""
    if key_file.exists() and Path(f"{key_file}.pub").exists():
        return key_file
    if shutil.which(keygen) is None:
        raise CloudError(
            f"`{keygen}` is not installed: the run's Ray token reaches its workers over SSH (install OpenSSH's client)",
            kind="fatal",
        )
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.unlink(missing_ok=True)
    done = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", "rubberband-token-push", "-f", str(key_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise CloudError(f"{keygen} could not make the token push key: {done.stderr.strip()[:200]}", kind="fatal")
    os.chmod(key_file, 0o600)
    return key_file


def forget_push_key(key_file: Path) -> None:
    """Delete the push key pair once the run's workers are gone."""
    key_file.unlink(missing_ok=True)
    Path(f"{key_file}.pub").unlink(missing_ok=True)


def auth_headers(token: str | None) -> dict[str, str]:
    """What Ray's job client sends with every request to the run's job server."""
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class SshLogin:
    """How the CLI logs in to a run's head over SSH: its address, the user and private key, the run's known_hosts."""

    host: str
    user: str
    key_file: Path
    known_hosts: Path
    pinned: bool = False  # known_hosts holds the head's keys from its console (cloud/host_keys.py): no other is taken


def deliver_to_head(login: SshLogin, token: str, *, timeout_s: float, ssh: str = "ssh", poll_s: float = 5.0) -> None:
    """Write the token onto the head (``/var/lib/rubberband/ray-token``, root only) over SSH, retried while the head
    boots; the token goes on ssh's stdin, never on a command line."""
    from rubberband.cloud.head_link import ssh_options

    if shutil.which(ssh) is None:
        raise CloudError(f"`{ssh}` is not installed: the run's Ray token reaches its head over SSH", kind="fatal")
    login.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    script = (
        f"umask 077; mkdir -p {Path(HEAD_TOKEN_PATH).parent} && cat > {HEAD_TOKEN_PATH}.part && "
        f"mv {HEAD_TOKEN_PATH}.part {HEAD_TOKEN_PATH}"
    )
    remote = f"sudo sh -c {shell_word(script)}"
    command = [
        ssh,
        "-i",
        str(login.key_file),
        *ssh_options(login.known_hosts, pinned=login.pinned),
        f"{login.user}@{login.host}",
        remote,
    ]
    _retry_ssh(command, token, timeout_s=timeout_s, poll_s=poll_s, what=f"the head {login.user}@{login.host}")


def _retry_ssh(command: list[str], token: str, *, timeout_s: float, poll_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done = subprocess.run(command, input=token, capture_output=True, text=True, timeout=60)
            error = (done.stderr or "").strip().splitlines()[-1:] if done.returncode else None
        except subprocess.TimeoutExpired:
            error = ["ssh timed out"]
        if not error and done.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise CloudError(
                f"could not deliver the run's Ray token to {what} within {timeout_s:.0f}s "
                f"({(error or ['exit ' + str(done.returncode)])[0]})",
                kind="transient",
                code="TokenDelivery",
            )
        time.sleep(poll_s)


@dataclass(frozen=True)
class SshTokenPush:
    """On the head: push the run's token to a worker's drop account (the forced command writes it), with the head's
    own push key (made at boot; its public half is in each worker's user-data)."""

    key_file: Path  # the head's private push key
    token_file: Path  # the head's copy of the run's token
    ssh: str = "ssh"
    poll_s: float = 5.0
    user: str = TOKEN_DROP_USER  # the workers' drop account (cloud/bootstrap.py makes it)
    port: int = 22  # the workers' sshd

    @classmethod
    def from_env(cls) -> "SshTokenPush | None":
        """The head's push, from what its boot exported to Ray (and so to the executor's job); None elsewhere."""
        from rubberband.cloud.bootstrap import TOKEN_PUSH_KEY_ENV

        key, token = os.environ.get(TOKEN_PUSH_KEY_ENV), os.environ.get("RAY_AUTH_TOKEN_PATH")
        if os.environ.get("RAY_AUTH_MODE") != "token" or not key or not token:
            return None
        return cls(key_file=Path(key), token_file=Path(token))

    @property
    def public_key(self) -> str:
        return Path(f"{self.key_file}.pub").read_text().strip()

    def push(self, instance: Instance, timeout_s: float) -> None:
        """Deliver the token to ``instance`` at its private address (retried while its sshd starts)."""
        if not instance.address:
            raise CloudError(f"{instance.cloud}: worker {instance.id} has no private address", kind="transient")
        known_hosts = self.key_file.parent / "known_hosts.d" / instance.id  # per worker: private IPs are reused
        from rubberband.cloud.head_link import ssh_options

        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        command = [
            self.ssh,
            "-i",
            str(self.key_file),
            *ssh_options(known_hosts),
            *self._port_option(),
            f"{self.user}@{instance.address}",
        ]
        _retry_ssh(
            command,
            self.token_file.read_text().strip(),
            timeout_s=timeout_s,
            poll_s=self.poll_s,
            what=f"worker {instance.id} ({instance.address})",
        )

    def _port_option(self) -> list[str]:
        return [] if self.port == 22 else ["-p", str(self.port)]


@dataclass(frozen=True)
class FileTokenPush:
    """Test boots: a played worker (a local Ray node) reads the token where the played head keeps it, so there is
    nothing to push; the public key is a fixed, valid one that opens nothing."""

    public_key: str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA test-boot"

    def push(self, instance: Instance, timeout_s: float) -> None:
        return None
