"""Ray clients in a process of their own, for checking who a run's Ray lets in: a job-server client (``CLIENT``)
and a driver joining the GCS (``DRIVER``), each printing ``{"ok": ...}``; :func:`ray_client` runs one with only the
Ray auth settings given (none inherited from the test's process). And :func:`job_server_client`, a booted head's
job server reached as the CLI reaches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CLIENT = r"""
import json, sys
from ray.job_submission import JobSubmissionClient
try:
    jobs = JobSubmissionClient(sys.argv[1]).list_jobs()
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
"""

DRIVER = r"""
import json, sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print(json.dumps({"ok": bool(ray.cluster_resources() is not None)}))
    ray.shutdown()
except BaseException as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
"""


def ray_client(code: str, target: str, env: dict[str, str], *, timeout_s: float = 120.0) -> dict:
    """Run ``code`` against ``target`` (a job server URL or a GCS address) with ``env`` (``HOME`` required: a home
    without ``~/.ray/auth_token`` to fall back on); what it printed."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, target],
            env={**clean, "HOME": env.pop("HOME"), **env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "error": f"no answer in {timeout_s:g}s", "stderr": str(exc.stderr or "")[-2000:]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])


def job_server_client(dashboard_port: int, token: str, timeout_s: float = 180.0):
    """A job client of a booted head's job server on this machine, with the run's token. `ray start` returns once
    the GCS is up; the dashboard's job server follows seconds later (more on a busy machine): wait for it as the CLI
    does for a real head (HeadSession.__enter__)."""
    from ray.job_submission import JobSubmissionClient

    from rubberband.cloud.ray_token import auth_headers

    answer_by = time.monotonic() + timeout_s
    while True:
        try:
            return JobSubmissionClient(f"http://127.0.0.1:{dashboard_port}", headers=auth_headers(token))
        except ConnectionError:
            assert time.monotonic() < answer_by, "the head's job server never answered"
            time.sleep(2.0)
