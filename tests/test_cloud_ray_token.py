"""Ray token authentication on a run's cluster, for real: a local Ray head started as a cloud head starts (token mode,
the run's own token file), and clients with no token, a wrong token and the run's token."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

from ray_clients import CLIENT, DRIVER, ray_client

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.local.provider import LocalProvider
from rubberband.net import free_port

pytestmark = pytest.mark.e2e


def test_the_runs_ray_refuses_clients_without_its_token(tmp_path):
    token_file = tmp_path / "state" / "ray-token"
    token_file.parent.mkdir()
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    local = LocalProvider(tmp_path / "head", auth_mode="token")
    port = free_port()
    try:
        head = local.start_head_process("run-t", dashboard_port=port, env={"RAY_AUTH_TOKEN_PATH": str(token_file)})
        url = f"http://127.0.0.1:{port}"
        (tmp_path / "tmp").mkdir()
        home = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}  # no ~/.ray/auth_token to fall on
        assert not ray_client(CLIENT, url, {**home, "RAY_AUTH_MODE": "disabled"})["ok"]
        wrong = ray_client(CLIENT, url, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
        assert not wrong["ok"]
        assert ray_client(CLIENT, url, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token_file.read_text()})[
            "ok"
        ]
        # the GCS (what a worker node or a driver joins) refuses a wrong token too
        assert not ray_client(
            DRIVER, head.address, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        )["ok"]
        assert ray_client(
            DRIVER, head.address, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
        )["ok"]
    finally:
        local.stop_head()


def _ssh_stub(tmp_path, *, fail_first: int = 0):
    """An `ssh` that records its argv and stdin (and fails the first ``fail_first`` calls, as while sshd boots)."""
    log = tmp_path / "ssh.log"
    stub = tmp_path / "bin" / "ssh"
    stub.parent.mkdir()
    stub.write_text(f"""#!/bin/bash
n=$(ls {tmp_path}/call.* 2>/dev/null | wc -l)
printf '%s\\n' "$@" > {tmp_path}/call.$n
cat > {tmp_path}/stdin.$n
[ "$n" -ge {fail_first} ] || {{ echo "ssh: connect to host: Connection refused" >&2; exit 255; }}
""")
    stub.chmod(0o755)
    return str(stub), log


def test_the_token_goes_to_the_head_on_stdin_over_the_runs_known_hosts(tmp_path):
    """deliver_to_head retries while the head's sshd is not up, sends the token on stdin only (never in argv), and
    trusts the run's own known_hosts; write/read/forget keep it in RUN_DIR/ray-token, 0600."""
    from rubberband.cloud.ray_token import (
        SshLogin,
        deliver_to_head,
        forget_run_token,
        new_token,
        read_run_token,
        write_run_token,
    )

    token = new_token()
    run_dir = tmp_path / "run"
    path = write_run_token(run_dir, token)
    assert read_run_token(run_dir) == token and path.stat().st_mode & 0o777 == 0o600
    ssh, _ = _ssh_stub(tmp_path, fail_first=2)
    login = SshLogin("203.0.113.9", "ubuntu", tmp_path / "key", run_dir / "known_hosts")
    deliver_to_head(login, token, timeout_s=30, ssh=ssh, poll_s=0.01)
    calls = sorted(tmp_path.glob("call.*"))
    assert len(calls) == 3  # two refused while "booting", then delivered
    argv = calls[-1].read_text().splitlines()
    assert token not in "\n".join(argv) and (tmp_path / "stdin.2").read_text() == token
    assert f"UserKnownHostsFile={run_dir / 'known_hosts'}" in argv and "ubuntu@203.0.113.9" in argv
    assert "/var/lib/rubberband/ray-token" in argv[-1] and argv[-1].startswith("sudo sh -c ")
    forget_run_token(run_dir)
    assert read_run_token(run_dir) is None


def test_the_head_pushes_the_token_to_a_workers_drop_account(tmp_path, monkeypatch):
    """SshTokenPush (on the head) sends the head's copy of the token on stdin to rubberband-token@<private address>
    with the head's push key, one known_hosts per worker; from_env finds it only in token mode on a head."""
    from rubberband.cloud.provider import Instance
    from rubberband.cloud.ray_token import SshTokenPush

    key = tmp_path / "state" / "push_key"
    key.parent.mkdir()
    key.write_text("private\n")
    (tmp_path / "state" / "push_key.pub").write_text("ssh-ed25519 AAAA rubberband-token-push\n")
    token = tmp_path / "state" / "ray-token"
    token.write_text("t0ken")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert SshTokenPush.from_env() is None
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.setenv("RUBBERBAND_TOKEN_PUSH_KEY", str(key))
    ssh, _ = _ssh_stub(tmp_path)
    push = SshTokenPush.from_env()
    assert push is not None and push.public_key == "ssh-ed25519 AAAA rubberband-token-push"
    push = SshTokenPush(key_file=push.key_file, token_file=push.token_file, ssh=ssh, poll_s=0.01)
    worker = Instance(
        id="i-0w",
        cloud="aws",
        instance_type="p3.2xlarge",
        zone="us-east-1a",
        state="running",
        run_id="run-t",
        address="10.0.0.7",
    )
    push.push(worker, 10)
    argv = (tmp_path / "call.0").read_text().splitlines()
    assert argv[-1] == "rubberband-token@10.0.0.7" and str(key) in argv
    assert f"UserKnownHostsFile={tmp_path / 'state' / 'known_hosts.d' / 'i-0w'}" in argv
    assert (tmp_path / "stdin.0").read_text() == "t0ken" and "t0ken" not in "\n".join(argv)


SSHD = "/usr/sbin/sshd"


def _drop_account_lines(public_key: str, drop: str) -> list[str]:
    """The worker boot's drop-account lines as rendered for a worker whose drop directory is ``drop`` (a
    parameter of the boot, like its other paths), less the two that make the system account and hand it the
    files: they need a user of that name; this test's sshd serves its own user instead."""
    from rubberband.cloud.bootstrap import BootstrapConfig, _token_drop_lines

    config = BootstrapConfig(
        dialect=AWS_BOOT,
        role="worker",
        run_id="run-s",
        ray_version="2.60.0",
        python_version=None,
        head_address="127.0.0.1",
        token_push_key=public_key,
        ray_auth="token",
        token_drop_dir=drop,
    )
    return [line for line in _token_drop_lines(config) if not line.startswith(("#", "id -u", "chown"))]


@pytest.mark.skipif(not os.path.exists(SSHD), reason="needs OpenSSH's sshd (apt-get install openssh-server)")
def test_the_pushed_token_lands_through_a_real_sshd_and_the_key_can_do_nothing_else(tmp_path):
    """A real sshd (on a free port of 127.0.0.1) serving the authorized_keys line a worker's boot renders: the
    head's SshTokenPush, with a real push key made as the head's boot makes it, writes the token into the drop
    directory (0600, exactly the token); the same key asking for any other command still only runs the forced
    drop (its output is never a shell's), and cannot open a port forward."""
    import getpass
    import time

    from rubberband.cloud.head_link import ssh_options
    from rubberband.cloud.provider import Instance
    from rubberband.cloud.ray_token import SshTokenPush, new_token

    state, drop = tmp_path / "state", tmp_path / "drop"
    state.mkdir()
    key = state / "push_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rubberband-token-push", "-f", str(key)], check=True
    )
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")], check=True)
    for line in _drop_account_lines((state / "push_key.pub").read_text().strip(), str(drop)):
        subprocess.run(["sh", "-c", line], check=True)
    port = free_port()
    config = tmp_path / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host_key'}\n"
        f"AuthorizedKeysFile {drop}/.ssh/authorized_keys\nPidFile {tmp_path / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)  # OpenSSH's privilege-separation directory (the package makes it at boot)
    sshd = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        token = new_token()
        (state / "ray-token").write_text(token)
        worker = Instance(
            id="i-0w",
            cloud="aws",
            instance_type="p3.2xlarge",
            zone="us-east-1a",
            state="running",
            run_id="run-s",
            address="127.0.0.1",
        )
        push = SshTokenPush(key_file=key, token_file=state / "ray-token", poll_s=0.2, user=getpass.getuser(), port=port)
        push.push(worker, timeout_s=30)  # retried until the sshd listens
        landed = drop / "ray-token"
        assert landed.read_text() == token and landed.stat().st_mode & 0o777 == 0o600
        assert not (drop / "ray-token.part").exists()
        # the key runs nothing but the forced command: a request for a shell command writes its stdin as the token
        base = [
            "ssh",
            "-i",
            str(key),
            *ssh_options(state / "known_hosts.d" / "i-0w"),
            "-p",
            str(port),
            f"{getpass.getuser()}@127.0.0.1",
        ]
        other = subprocess.run(
            [*base, "id; echo opened"], input="not-a-command", capture_output=True, text=True, timeout=30
        )
        assert "uid=" not in other.stdout and "opened" not in other.stdout
        assert landed.read_text() == "not-a-command"
        # `restrict`: no port forwarding with that key
        forward = subprocess.run(
            [*base, "-W", f"127.0.0.1:{port}"], input="", capture_output=True, text=True, timeout=30
        )
        assert forward.returncode != 0 and "prohibited" in forward.stderr, forward.stderr
    finally:
        sshd.terminate()
        try:
            sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait(timeout=10)
        time.sleep(0.2)


def test_a_local_head_pushes_its_runs_token_with_a_key_of_its_own(tmp_path):
    """--head local: the CLI machine makes the run's push key (a real ed25519 pair, private half 0600) and pushes
    the run's token over SSH like a head instance; its workers' user-data gets the public half only."""
    from rubberband.cloud.local_head import LocalHeadCloudBackend
    from rubberband.cloud.ray_token import PUSH_KEY_FILE, SshTokenPush, forget_push_key, make_push_key

    backend = LocalHeadCloudBackend(cloud="aws", run_dir=tmp_path / "run", regions=["us-east-1"])
    assert backend.ray_auth_mode == "token"
    assert backend.ray_auth_token_path == str(tmp_path / "run" / "ray-token")
    push = backend.token_push
    assert isinstance(push, SshTokenPush) and push.key_file == tmp_path / "run" / PUSH_KEY_FILE
    make_push_key(push.key_file)
    assert push.key_file.stat().st_mode & 0o777 == 0o600
    assert push.public_key.startswith("ssh-ed25519 ") and "PRIVATE" not in push.public_key
    before = push.public_key
    make_push_key(push.key_file)  # a resumed run keeps the key its workers trust
    assert push.public_key == before
    forget_push_key(push.key_file)
    assert not push.key_file.exists() and not (tmp_path / "run" / f"{PUSH_KEY_FILE}.pub").exists()
