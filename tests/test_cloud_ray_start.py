"""A node's ``ray start`` is tried again when it fails, and a failed try's processes are stopped, nothing else.

``ray start`` waits a fixed 30 s for its raylet to register; on a loaded boot it can run out and exit 1 with its
GCS and dashboard still running (the boot tier saw it once, beside another cluster's boot on two cores). The
rendered script's ``ray_start`` runs each try in a process group of its own and stops that group when the try
fails. Here a real bash runs the rendered function and the rendered ``ray start`` line verbatim against a stand-in
for the node's Python that, like a failed ``ray start``, leaves a process behind and exits 1; the real ``ray
start`` through the same function is the boot tier's (``tests/test_cloud_boot.py``, ``tests/test_boot_os.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from rubberband.cloud import bootstrap
from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.bootstrap import BootstrapConfig, render_startup_script

pytestmark = pytest.mark.e2e  # runs bash and the processes a failed `ray start` leaves

VERSIONS = dict(ray_version="2.60.0", python_version="3.11", torch_version="2.13.0")

#: The node's Python, played: each call is one `ray start` try. It starts a process that outlives it (as Ray's
#: GCS does) and fails until its ``FAILS`` tries are used up; a process that ignores SIGTERM where ``STUBBORN``.
FAKE_PYTHON = """#!/bin/bash
n=$(( $(cat "$DIR/tries" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$DIR/tries"
echo "$*" > "$DIR/args"
if [ -n "${STUBBORN:-}" ]; then
  bash -c 'trap "" TERM; while true; do sleep 1; done' </dev/null >/dev/null 2>&1 &
else
  sleep 600 </dev/null >/dev/null 2>&1 &
fi
echo "$!" >> "$DIR/pids"
[ "$n" -gt "$FAILS" ]
"""


def _function_and_start(script: str) -> str:
    """The rendered ``ray_start`` function and the rendered line that calls it, as the script has them."""
    lines = script.splitlines()
    begin = lines.index("ray_start() {")
    end = lines.index("}", begin)
    calls = [line for line in lines if line.startswith("ray_start ")]
    assert len(calls) == 1, calls
    return "\n".join([*lines[begin : end + 1], *calls])


def _alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _run(tmp_path: Path, *, fails: int, stubborn: bool = False) -> tuple[subprocess.CompletedProcess, list[int]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    (venv / "bin" / "python").chmod(0o755)
    script = render_startup_script(
        BootstrapConfig(run_id="run-r", dialect=AWS_BOOT, role="head", ray_auth="disabled", venv=str(venv), **VERSIONS)
    )
    harness = 'say() { echo "SAY: $*"; }\nfail() { echo "FAILED: $*"; exit 1; }\n' + _function_and_start(script)
    env = {"PATH": os.environ["PATH"], "DIR": str(tmp_path), "FAILS": str(fails), "STUBBORN": "1" if stubborn else ""}
    done = subprocess.run(["/bin/bash", "-c", harness], env=env, capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    return done, pids


def _stop(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_failed_try_is_stopped_and_the_next_one_kept(tmp_path):
    done, pids = _run(tmp_path, fails=2)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ray start failed (try 1 of 3)" in done.stdout and "ray start failed (try 2 of 3)" in done.stdout
        assert (tmp_path / "args").read_text().startswith("-m ray.scripts.scripts start --head --port=6379")
        assert [_alive(pid) for pid in pids] == [False, False, True]  # the failed tries' leftovers only
    finally:
        _stop(pids)


def test_three_failed_tries_fail_the_boot_and_leave_nothing(tmp_path):
    done, pids = _run(tmp_path, fails=3)
    try:
        assert done.returncode == 1
        assert "FAILED: ray start failed 3 times" in done.stdout
        assert len(pids) == 3 and not any(_alive(pid) for pid in pids)
    finally:
        _stop(pids)


def test_a_leftover_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(bootstrap, "RAY_START_STOP_GRACE_S", 1)
    done, pids = _run(tmp_path, fails=1, stubborn=True)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert [_alive(pid) for pid in pids] == [False, True]
    finally:
        _stop(pids)
