"""A run on a GPU instance type, on local Ray nodes that advertise the type's GPUs (logical ones here).

``LocalProvider`` starts each node of a GPU type with ``--num-gpus`` (rubberband.devices.node_resources)
and the executor gives every trial the device policy's decision: one GPU per worker, nccl. This
machine has no CUDA, so the real CLI run stops with one line naming the type (never a CPU fall-back)
and leaves nothing running; the in-process run with the injected test stand-in shows each trial's
ranks got distinct GPUs from Ray and the journal records them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from executor_helpers import cli_env, make_plan, run_pids, write_job

from rubberband.catalog import Catalog, InstanceType, load_catalog
from rubberband.cloud.local.provider import LocalProvider
from rubberband.executor import journal as J
from rubberband.executor.run import Executor, Job, Settings, Target
from rubberband.devices import DevicePolicy
from rubberband.executor.runtime import TrialRuntime
from rubberband.plan import write_plan
from rubberband.spec import load_spec

pytestmark = pytest.mark.e2e

LOCAL_CSV = Path(__file__).resolve().parents[1] / "rubberband" / "catalogs" / "local.csv"
GPU_ROW = "local.gpu2,T4,2,4,8,,1.00,0.40,local,local-a\n"  # 2 (logical) GPUs, 4 vCPUs per instance
#: 3 trials at 2 workers on one 2-GPU instance, then the winner alone at 2 workers.
STAGES = [("local.gpu2", 1, 2), ("local.gpu2", 1, 2)]


def _job(directory: Path):
    catalogs = directory / "catalogs"
    catalogs.mkdir(parents=True)
    (catalogs / "local.csv").write_text(LOCAL_CSV.read_text() + GPU_ROW)
    spec_path = write_job(directory / "job", trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.2)
    spec = load_spec(spec_path)
    plan = make_plan(spec, STAGES, durations=[10.0, 10.0], prices={"local.gpu2": 1.0})
    write_plan(plan, directory / "plan.json")
    return catalogs, spec_path, spec, plan


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the run would succeed")
def test_run_on_a_gpu_type_without_cuda_stops_with_one_line_naming_the_type(cli, tmp_path):
    catalogs, spec_path, _, _ = _job(tmp_path)
    run_dir = tmp_path / "run"
    env = {**cli_env(tmp_path), "RUBBERBAND_CATALOG_DIR": str(catalogs)}
    result = cli(
        "run",
        spec_path,
        "--plan",
        tmp_path / "plan.json",
        "--cloud",
        "local",
        "--run-dir",
        run_dir,
        "--yes",
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("rubberband: error: ")]
    assert result.returncode == 1, result.stderr[-3000:]
    assert len(lines) == 1 and "instance type local.gpu2" in lines[0] and "CUDA is not usable" in lines[0], (
        result.stderr[-3000:]
    )
    stopped = [e for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == J.TRIAL_STOPPED]
    assert len(stopped) == 1  # the run stops at the first trial that finds no CUDA: the others would too
    assert all(e["reason"] == "failed" and "GpuUnavailableError" in e["error"] for e in stopped)
    assert run_pids(run_dir) == []


def test_run_on_a_gpu_type_gives_each_rank_its_own_gpu(tmp_path):
    """In process, with the test stand-in injected into the executor (trains on CPU after the check)."""
    _, _, spec, plan = _job(tmp_path)
    local = load_catalog(["local"])
    gpu2 = InstanceType(
        cloud="local",
        name="local.gpu2",
        region="local",
        zones=("local-a",),
        device="T4",
        accelerator_count=2,
        vcpus=4,
        memory_gib=8,
        price_hr=1.0,
        spot_price_hr=0.4,
    )
    catalog = Catalog(types=local.types + (gpu2,), dates=dict(local.dates))
    run_dir = tmp_path / "run"
    executor = Executor(
        Job(spec, plan, catalog),
        Target("gpu-run", run_dir, LocalProvider(run_dir), TrialRuntime.load()),
        Settings(deadline_s=600, device_policy=DevicePolicy(cpu_stand_in=True)),
    )
    executor.run()
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    stopped = [e for e in events if e["type"] == J.TRIAL_STOPPED]
    assert len(stopped) == 4 and all(e["reason"] == "finished" for e in stopped), json.dumps(stopped)[:2000]
    for event in stopped:
        ids = [tuple(ranks) for ranks in event["gpu_ids"]]
        assert len(ids) == 2 and all(len(r) == 1 for r in ids) and ids[0] != ids[1], event
        assert event["devices"] == ["cpu", "cpu"]  # the injected stand-in
    assert run_pids(run_dir) == []
