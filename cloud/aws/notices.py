"""EC2's spot interruption notice: IMDS ``latest/meta-data/spot/instance-action`` answers 404 until two minutes
before the instance is taken back, then ``{"action": "terminate", "time": "…"}``. IMDSv2: a session token from
``PUT latest/api/token`` goes with every read."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from rubberband.cloud.metadata import read_metadata

#: IMDSv2 session token lifetime asked for (seconds).
TOKEN_TTL_S = 21600


class AwsNoticeReader:
    """Reads the notice at ``base_url`` (``/``-terminated), renewing its IMDSv2 token at half its lifetime."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._token: str | None = None
        self._token_at = 0.0

    def _session_token(self) -> str | None:
        if self._token is None or time.monotonic() - self._token_at > TOKEN_TTL_S / 2:
            request = urllib.request.Request(
                self.base_url + "latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            status, body = read_metadata(request, self.timeout_s)
            if status != 200 or not body.strip():
                return None
            self._token, self._token_at = body.strip(), time.monotonic()
        return self._token

    def read(self) -> dict[str, Any] | None:
        token = self._session_token()
        if token is None:
            return None
        request = urllib.request.Request(
            self.base_url + "latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token}
        )
        status, body = read_metadata(request, self.timeout_s)
        if status == 401:  # the token expired early: ask again next time
            self._token = None
            return None
        if status != 200:
            return None  # 404: no interruption scheduled
        action = json.loads(body)
        return {"cloud": "aws", "action": str(action.get("action", "terminate")), "time": action.get("time")}
