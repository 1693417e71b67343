"""A real run logs its trials to TensorBoard and to a real MLflow tracking server, and its report links both.

The server is ``mlflow server`` on a SQLite store, started here in a session of its own and ended by its process
group (it starts a uvicorn worker and a job runner) in ``finally``. The run is the scikit-learn example
(examples/tabular.yaml, about 10 s) with ``tracking: {tensorboard: true, mlflow: URI}`` added; what MLflow holds
is read back through its REST API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from executor_helpers import cli_env
from tracking_helpers import tensorboard_scalars

from conftest import EXAMPLES
from rubberband.net import free_port

pytestmark = pytest.mark.e2e
pytest.importorskip("tensorboardX", reason="the TensorBoard tracker needs pip install -e '.[tensorboard]'")
pytest.importorskip("mlflow.server", reason="a real MLflow tracking server needs pip install mlflow (the test extra)")

SERVER_START_S = 90.0


def _api(base: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", data=data, method="POST" if body else "GET")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _wait_healthy(base: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"mlflow server exited {server.returncode}: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise AssertionError(f"mlflow server did not answer within {SERVER_START_S:.0f} s: {log.read_text()[-2000:]}")


def _stop(server: subprocess.Popen) -> None:
    """End the server's process group (its own session: the server, its uvicorn worker, its job runner)."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait_s)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:  # its children leave with it, or get the next signal
                os.killpg(server.pid, 0)
                time.sleep(0.2)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


def test_a_run_logs_each_trial_to_tensorboard_and_a_real_mlflow_server(cli, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    home = tmp_path / "mlflow"
    home.mkdir()
    log = home / "server.log"
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--backend-store-uri",
        f"sqlite:///{home / 'mlflow.db'}",
        "--default-artifact-root",
        str(home / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    (home / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(home / "tmp")}  # its SQLite store's init lock goes there, not to the session's
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        started = time.monotonic()
        _wait_healthy(base, server, log)
        server_s = time.monotonic() - started

        code = tmp_path / "code"
        (code / "profiles").mkdir(parents=True)
        shutil.copy(EXAMPLES / "tabular.py", code)
        shutil.copy(EXAMPLES / "profiles" / "tabular.json", code / "profiles")
        spec = code / "tabular.yaml"
        spec.write_text(
            (EXAMPLES / "tabular.yaml").read_text()
            + f"tracking: {{tensorboard: true, mlflow: '{base}', mlflow_experiment: tabular-e2e}}\n"
        )
        run_dir = tmp_path / "run"
        result = cli(
            "run", spec, "--yes", "--overrun", "none", "--run-dir", run_dir, env=cli_env(tmp_path), timeout=300
        )
        assert result.returncode in (0, 4), result.stderr[-3000:]  # met, or late on a loaded machine: it ran to its end
        events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines() if line.strip()]
        run_id = events[0]["run_id"]
        epochs: dict[str, list[int]] = {}
        for e in events:
            if e["type"] == "epoch":
                epochs.setdefault(e["trial_id"], []).append(e["epoch"])
        assert len(epochs) == 9

        tracked = json.loads((run_dir / "tracking.json").read_text())
        assert tracked["mlflow"]["error"] is None and tracked["tensorboard"]["error"] is None, tracked
        for trial, steps in epochs.items():  # TensorBoard: every epoch of every trial, at its step
            scalars = tensorboard_scalars(run_dir / "tensorboard" / trial)
            assert sorted(step for step, _ in scalars["val_acc"]) == sorted(steps), trial

        experiment = _api(base, "experiments/get-by-name?experiment_name=tabular-e2e")["experiment"]
        assert tracked["mlflow"]["experiment_url"] == f"{base}/#/experiments/{experiment['experiment_id']}"
        runs = _api(base, "runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 100})["runs"]
        by_trial = {}
        for run in runs:
            tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
            assert tags["rubberband.run_id"] == run_id
            by_trial[tags["rubberband.trial_id"]] = (run, tags)
        assert set(by_trial) == set(epochs)
        configs = {e["trial_id"]: e["config"] for e in events if e["type"] == "trial_created"}
        best = json.loads((run_dir / "result.json").read_text())["best"]["trial_id"]
        for trial, (run, tags) in by_trial.items():
            params = {p["key"]: p["value"] for p in run["data"].get("params", [])}
            assert params == {k: str(v) for k, v in configs[trial].items()}
            history = _api(base, f"metrics/get-history?run_id={run['info']['run_id']}&metric_key=val_acc")["metrics"]
            assert sorted(int(m["step"]) for m in history) == sorted(epochs[trial])
            assert run["info"]["status"] == "FINISHED" and tags["rubberband.state"] == "finished"
            assert (tags.get("rubberband.best") == "true") == (trial == best)

        report = tmp_path / "report"
        done = cli("report", run_dir, "--out", report, env=cli_env(tmp_path), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        markdown = (report / "report.md").read_text()
        assert f"- MLflow: [{base}/#/experiments/{experiment['experiment_id']}]" in markdown
        assert f"- TensorBoard: `tensorboard --logdir {(run_dir / 'tensorboard').resolve()}`" in markdown
        print(f"mlflow server up in {server_s:.1f} s; {len(runs)} MLflow runs, {sum(map(len, epochs.values()))} epochs")
    finally:
        _stop(server)
