"""The head's SSH host keys come from its console, not from whoever answers first.

The rendered head script prints its public host keys; the CLI reads them from the console output, pins them in
the run's known_hosts and connects with ``StrictHostKeyChecking=yes``. The e2e test runs the rendered lines in
bash against a real sshd's key directory and connects with the real ssh client: the pinned key is accepted, a
different one is refused before any authentication.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.bootstrap import BootstrapConfig, render_startup_script
from rubberband.cloud.head_link import ssh_options
from rubberband.cloud.host_keys import (
    HOST_KEY_MARKER,
    await_host_keys,
    host_key_lines,
    host_keys_from_console,
    pin_host_keys,
)
from rubberband.errors import CloudError
from rubberband.net import free_port

VERSIONS = dict(ray_version="2.60.0", python_version="3.11", torch_version="2.13.0")
SSHD = "/usr/sbin/sshd"
ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJtVq0Yq5d0Vb1s2YkF6mQy0Z6bYk8m2m3Yl1i1o9a0b"


def test_the_head_prints_its_host_keys_before_it_waits_for_anything():
    head = render_startup_script(BootstrapConfig(run_id="run-k", dialect=AWS_BOOT, role="head", **VERSIONS))
    assert HOST_KEY_MARKER in head and "ssh-keygen -A" in head
    assert head.index(HOST_KEY_MARKER) < head.index("waiting for the run's Ray token from the CLI")
    worker = render_startup_script(
        BootstrapConfig(
            run_id="run-k", dialect=AWS_BOOT, role="worker", head_address="10.0.0.2", ray_auth="disabled", **VERSIONS
        )
    )
    assert HOST_KEY_MARKER not in worker


def test_keys_are_read_from_a_noisy_console_and_pinned_for_their_host_only(tmp_path):
    console = (
        f"[   12.3] cloud-init: {HOST_KEY_MARKER} {ED} root@ip-10-0-0-5\n"
        f"{HOST_KEY_MARKER} ecdsa-sha2-nistp256 AAAAE2VjZHNh=\n"
        f"{HOST_KEY_MARKER} {ED}\n"  # printed twice: kept once
        f"{HOST_KEY_MARKER} ssh-dss AAAAB3NzaC1kc3M=\n"  # not a type sshd offers any more: ignored
        f"{HOST_KEY_MARKER} ssh-ed25519 $(reboot)\n"  # not a key
    )
    keys = host_keys_from_console(console)
    assert keys == [ED, "ecdsa-sha2-nistp256 AAAAE2VjZHNh="]
    known = tmp_path / "known_hosts"
    known.write_text(f"203.0.113.9 {ED}\n198.51.100.7 ssh-ed25519 AAAAold\n")
    pin_host_keys(known, "198.51.100.7", keys)
    assert known.read_text().splitlines() == [
        f"203.0.113.9 {ED}",
        f"198.51.100.7 {ED}",
        "198.51.100.7 ecdsa-sha2-nistp256 AAAAE2VjZHNh=",
    ]


def test_a_head_that_shows_no_keys_is_not_connected_to():
    with pytest.raises(CloudError, match="no SSH host keys on its console") as info:
        await_host_keys(lambda: "rubberband-boot: booting a head\n", what="head i-0h", timeout_s=0, poll_s=0)
    assert "\n" not in str(info.value)
    assert "StrictHostKeyChecking=yes" in ssh_options(Path("known_hosts"), pinned=True)
    assert "StrictHostKeyChecking=accept-new" in ssh_options(Path("known_hosts"))


def _console_of(ssh_dir) -> str:
    """What the rendered head script's host-key lines print, run by bash over ``ssh_dir``."""
    done = subprocess.run(["bash", "-c", "\n".join(host_key_lines(str(ssh_dir)))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.e2e  # a real sshd and ssh
@pytest.mark.skipif(not os.path.exists(SSHD), reason="needs OpenSSH's sshd (apt-get install openssh-server)")
def test_the_pinned_key_is_accepted_and_any_other_refused_by_a_real_ssh(tmp_path):
    import time

    ssh_dir, other = tmp_path / "etc-ssh", tmp_path / "other"
    ssh_dir.mkdir()
    other.mkdir()
    for directory in (ssh_dir, other):
        key = directory / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "login")], check=True)
    port = free_port()
    config = tmp_path / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {ssh_dir / 'ssh_host_ed25519_key'}\n"
        f"PidFile {tmp_path / 'sshd.pid'}\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def connect(console: str) -> subprocess.CompletedProcess:
            known = pin_host_keys(tmp_path / "known_hosts", "[127.0.0.1]:" + str(port), host_keys_from_console(console))
            command = ["ssh", "-i", str(tmp_path / "login"), *ssh_options(known, pinned=True), "-p", str(port)]
            return subprocess.run(
                [*command, "nobody@127.0.0.1", "true"],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )

        for _ in range(50):  # until sshd listens
            done = connect(_console_of(ssh_dir))
            if "Connection refused" not in done.stderr:
                break
            time.sleep(0.1)
        # the host is who its console says: ssh goes on to authenticate (and is refused as nobody with no key)
        assert "Host key verification failed" not in done.stderr and "Permission denied" in done.stderr, done.stderr
        impostor = connect(_console_of(other))  # keys of another machine: refused before any login is tried
        assert impostor.returncode != 0 and "Host key verification failed" in impostor.stderr, impostor.stderr
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
