"""Free local ports for the Ray processes and tunnels this machine starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on every address of this machine now (the OS picks it; the caller binds it soon after, and
    copes with another process taking it in between)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
