"""Ray token authentication on a run's cluster, for real: a local Ray head started as a cloud head starts (token mode,
the run's own token file), and clients with no token, a wrong token and the run's token."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from rubberband.cloud.local import LocalProvider, _free_port

pytestmark = pytest.mark.e2e

CLIENT = r'''
import json, sys
from ray.job_submission import JobSubmissionClient
try:
    jobs = JobSubmissionClient(sys.argv[1]).list_jobs()
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
'''

DRIVER = r'''
import json, sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print(json.dumps({"ok": bool(ray.cluster_resources() is not None)}))
    ray.shutdown()
except BaseException as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
'''


def _client(code: str, target: str, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run([sys.executable, "-c", code, target], env={**clean, "HOME": env.pop("HOME"), **env},
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])


def test_the_runs_ray_refuses_clients_without_its_token(tmp_path):
    token_file = tmp_path / "state" / "ray-token"
    token_file.parent.mkdir()
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    local = LocalProvider(tmp_path / "head", auth_mode="token")
    port = _free_port()
    try:
        head = local.start_head("run-t", dashboard_port=port, env={"RAY_AUTH_TOKEN_PATH": str(token_file)})
        url = f"http://127.0.0.1:{port}"
        (tmp_path / "tmp").mkdir()
        home = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}  # no ~/.ray/auth_token to fall on
        assert not _client(CLIENT, url, {**home, "RAY_AUTH_MODE": "disabled"})["ok"]
        wrong = _client(CLIENT, url, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
        assert not wrong["ok"]
        assert _client(CLIENT, url, {**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token_file.read_text()})["ok"]
        # the GCS (what a worker node or a driver joins) refuses a wrong token too
        assert not _client(DRIVER, head.address, {**home, "RAY_AUTH_MODE": "token",
                                                   "RAY_AUTH_TOKEN": secrets.token_hex(32)})["ok"]
        assert _client(DRIVER, head.address, {**home, "RAY_AUTH_MODE": "token",
                                               "RAY_AUTH_TOKEN_PATH": str(token_file)})["ok"]
    finally:
        local.stop_head()
