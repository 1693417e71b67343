"""One read of a node's metadata server (link-local: answers come in milliseconds, or not at all)."""

from __future__ import annotations

import urllib.error
import urllib.request


def read_metadata(request: urllib.request.Request, timeout_s: float) -> tuple[int, str]:
    """The answer's HTTP status and body; an HTTP error's status with an empty body. OSError (no server, a timeout)
    propagates: the caller decides what "no answer" means."""
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - a metadata server
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
