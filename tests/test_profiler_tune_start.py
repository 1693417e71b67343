"""Ray Tune's own trial starts, timed for real by `rubberband profile` (the plan's ASHA baseline), and the probe's
stop at the end of its budget. The conversion to a start model is proven in tests/test_asha_tune_starts.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rubberband.errors import ExecutionError
from rubberband.profile import load_profile

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.timeout(660)
def test_profile_times_ray_tune_trial_starts_on_a_node_of_their_own(cli, tmp_path):
    """One shape, nothing else but the Ray Tune probe: Ray Tune's trials one after another, then a stream keeping
    every CPU of a node of 2 × cores starting one, then half as many at once among training trials.

    The probe takes about 50 s on an idle 2-core machine and past 3 minutes beside the suite's other Ray clusters,
    so the budget is generous: the profile stops when its measurements are done, and the stop at the end of the
    budget has a test of its own (below)."""
    for name in ("synthetic.py", "synthetic.yaml"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    out = tmp_path / "profile.json"
    result = cli(
        "profile",
        tmp_path / "synthetic.yaml",
        "--instance-type",
        "local.cpu2",
        "--workers",
        "1",
        "--single-node",
        "--iterations",
        "4",
        "--configs",
        "0",
        "--startup-samples",
        "0",
        "--budget",
        "600s",
        "--out",
        out,
        timeout=640,
    )
    assert result.returncode == 0, result.stderr
    tune_start = load_profile(out).tune_trial_start
    assert tune_start is not None, result.stderr
    assert tune_start.host_cores == os.cpu_count()
    assert tune_start.concurrent == max(2, min(16, 2 * tune_start.host_cores))
    # five trials one after another (the first and the one after it left out); four rounds (the first two left out)
    assert len(tune_start.serial_s) == 3 and len(tune_start.concurrent_s) == 2 * tune_start.concurrent
    # the busy stream: half as many at once, eight rounds (the first two left out)
    assert tune_start.busy_concurrent == tune_start.concurrent // 2 and tune_start.busy_concurrent_s is not None
    assert len(tune_start.busy_concurrent_s) == 6 * tune_start.busy_concurrent
    assert all(0.0 < s < 60.0 for s in tune_start.serial_s + tune_start.concurrent_s + tune_start.busy_concurrent_s)
    profile = load_profile(out)
    assert profile.sources["tune_trial_start"].startswith("measured with Ray Tune")
    assert profile.fitted["tune_start"]["lanes_per_core"] > 0 and profile.fitted["tune_start"]["busy_s"] >= 0
    assert "Ray Tune trial start" in result.stdout


@pytest.mark.e2e
def test_the_probe_stops_at_the_end_of_its_budget(tmp_path):
    """The probe runs within what is left of the profile's budget: Ray Tune's own time budget stops its run, and the
    probe says so instead of running on (the profiler notes it and writes the profile without the field)."""
    from ray_helpers import start_cluster

    from rubberband.cloud.provider import node_resource
    from rubberband.profiler.tune_start import measure_tune_start

    cluster = start_cluster({"tune-probe": 2})
    try:
        with pytest.raises(ExecutionError, match=r"ran past its 1 s of the budget"):
            measure_tune_start(tmp_path, node_resource("tune-probe"), cpus=2, time_budget_s=1.0)
    finally:
        cluster.close()
