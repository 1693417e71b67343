"""Profiling a GPU instance type: its nodes advertise the type's GPUs and every worker asks for one.

This machine has no CUDA, so the nodes' GPUs are logical: the real CLI (a local GPU type added
through a user catalog, as docs/profiling.md describes) stops with one line naming the type, and
the API run with the injected test stand-in shows the profile is taken on GPU-requesting workers.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from rubberband.catalog import InstanceType
from rubberband.devices import DevicePolicy

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LOCAL_CSV = Path(__file__).resolve().parents[1] / "rubberband" / "catalogs" / "local.csv"
GPU2 = InstanceType(
    cloud="local",
    name="local.gpu2",
    region="local",
    zones=("local-a",),
    device="T4",
    accelerator_count=2,
    vcpus=4,
    memory_gib=8,
    price_hr=1.0,
    spot_price_hr=None,
)


@pytest.fixture
def synthetic_dir(tmp_path):
    for name in ("synthetic.py", "synthetic.yaml"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    return tmp_path


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the profile would succeed")
def test_profile_cli_on_a_gpu_type_without_cuda_stops_naming_the_type(cli, synthetic_dir, tmp_path):
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    (catalogs / "local.csv").write_text(LOCAL_CSV.read_text() + "local.gpu2,T4,2,4,8,,1.00,0.40,local,local-a\n")
    out = tmp_path / "p.json"
    env = {**os.environ, "RUBBERBAND_CATALOG_DIR": str(catalogs)}
    result = cli(
        "profile",
        synthetic_dir / "synthetic.yaml",
        "--instance-type",
        "local.gpu2",
        "--workers",
        "1,2",
        "--single-node",
        "--iterations",
        "4",
        "--budget",
        "10m",  # a cap: the error ends it in seconds; with 2m the Ray Tune and restart reserves left each shape 3 s,
        # which a worker's start did not fit on a loaded CI machine (exit 2, "budget too small", once)
        "--startup-samples",
        "0",  # the error comes from the first training shape; sampling start-ups first would only delay it
        "--out",
        out,
        env=env,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith("rubberband: error: "), result.stderr
    assert "instance type local.gpu2" in lines[0] and "CUDA is not usable" in lines[0]
    assert not out.exists()


def test_profile_of_a_gpu_type_measures_gpu_workers(synthetic_dir, monkeypatch):
    """With the test stand-in injected: shapes measured on workers that each held one (logical) GPU."""
    from rubberband.profiler import runner
    from rubberband.spec import load_spec

    from rubberband.executor import trials

    seen = []
    real_start = trials.TrialRun.start  # the runner imports TrialRun when it runs a shape: it calls the spy

    def spy(spec, **kwargs):
        seen.append(spec.device)
        return real_start(spec, **kwargs)

    monkeypatch.setattr(trials.TrialRun, "start", staticmethod(spy))
    spec = load_spec(synthetic_dir / "synthetic.yaml")
    options = runner.ProfileOptions(
        cloud="local",
        instance_type=GPU2,
        workers=(1, 2),
        budget_s=120,
        iterations=4,
        cross_node=False,
        measure_restart=False,
        configs=0,  # the shapes' workers are what this checks; whole epochs of configurations add nothing here
        tune_start=False,  # nor do Ray Tune's trial starts
        device_policy=DevicePolicy(cpu_stand_in=True),
    )
    run = runner.run_profile(spec, options)
    measured = run.profile.measurements
    assert sorted((m.workers, m.nodes) for m in measured) == [(1, 1), (2, 1)]
    assert {m.device for m in measured} == {"T4"} and all(m.iteration_latencies_s for m in measured)
    assert seen and all(
        d.use_gpu and d.num_gpus == 1 and d.num_cpus == 2 and d.instance_type == "local.gpu2" for d in seen
    )
    assert "gloo on cpu" in run.profile.sources["iteration_latencies"]  # the stand-in, said as it is
