"""Compute Engine's preemption notice: a preempted spot VM has about 30 s, and its metadata ``instance/preempted``
turns ``TRUE`` (header ``Metadata-Flavor: Google``)."""

from __future__ import annotations

import urllib.request
from typing import Any

from rubberband.cloud.metadata import read_metadata


class GcpNoticeReader:
    """Reads the notice at ``base_url`` (``/``-terminated: the metadata server's ``computeMetadata/v1/``)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s

    def read(self) -> dict[str, Any] | None:
        request = urllib.request.Request(self.base_url + "instance/preempted", headers={"Metadata-Flavor": "Google"})
        status, body = read_metadata(request, self.timeout_s)
        if status == 200 and body.strip().upper() == "TRUE":
            return {"cloud": "gcp", "action": "preempted", "time": None}
        return None
