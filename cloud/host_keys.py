"""The head's SSH host keys, read from its console before the first connection: no trust on first use.

The CLI's first SSH connection to a run's head carries the run's Ray token, so it must not take whatever key
answers. The head's boot prints its public host keys on the serial console (:func:`host_key_lines`), which
only the cloud's API shows to the account that owns the instance; the CLI reads them there
(:func:`await_host_keys`), pins them in the run's own ``known_hosts`` (:func:`pin_host_keys`) and connects
with ``StrictHostKeyChecking=yes``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from rubberband.cloud.shell import shell_word
from rubberband.errors import CloudError

#: What precedes each public host key on the head's console.
HOST_KEY_MARKER = "rubberband-hostkey:"
_KEY_RE = re.compile(
    re.escape(HOST_KEY_MARKER) + r"\s*((?:ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,2})"
)


def host_key_lines(ssh_dir: str = "/etc/ssh") -> list[str]:
    """Boot-script lines that print the node's public host keys on its console (made first where the image has
    none yet, so the keys shown are the ones sshd will serve)."""
    lines = [
        "# the SSH host keys on the console: the CLI pins them before its first connection (no trust on first use)"
    ]
    if ssh_dir == "/etc/ssh":
        lines.append("command -v ssh-keygen >/dev/null 2>&1 && ssh-keygen -A >/dev/null 2>&1 || true")
    lines.append(
        f'for key in {shell_word(ssh_dir)}/ssh_host_*_key.pub; do [ -r "$key" ] && '
        f'echo "{HOST_KEY_MARKER} $(cut -d" " -f1,2 "$key")"; done'
    )
    return lines


def host_keys_from_console(text: str) -> list[str]:
    """The public host keys (``type base64``) the boot printed in ``text``, in order, each once."""
    return list(dict.fromkeys(match.group(1) for match in _KEY_RE.finditer(text)))


def await_host_keys(
    console: Callable[[], str],
    *,
    what: str,
    timeout_s: float,
    poll_s: float = 5.0,
) -> list[str]:
    """Poll ``console`` (the head's console output) until its boot has printed its host keys; a head that shows
    none within ``timeout_s`` is an error: the CLI will not connect to a key it cannot check."""
    deadline = time.monotonic() + timeout_s
    while True:
        keys = host_keys_from_console(console())
        if keys:
            return keys
        if time.monotonic() >= deadline:
            raise CloudError(
                f"{what} showed no SSH host keys on its console within {timeout_s:.0f}s, so its key cannot be "
                f"checked; see its console output, then end the run with `rubberband down`",
                kind="transient",
                code="HostKeysMissing",
            )
        time.sleep(poll_s)


def pin_host_keys(known_hosts: Path, host: str, keys: list[str]) -> Path:
    """Write ``keys`` as the only keys ``host`` may present in the run's ``known_hosts`` (other hosts' lines stay)."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if known_hosts.exists():
        kept = [line for line in known_hosts.read_text().splitlines() if line.split(" ", 1)[0] != host]
    known_hosts.write_text("".join(f"{line}\n" for line in [*kept, *(f"{host} {key}" for key in keys)]))
    return known_hosts
