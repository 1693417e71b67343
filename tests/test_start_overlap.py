"""Start-ups that overlap on a shared host (the local cloud): measured by the profiler, added by the planner where a
run's serial provisioning overlaps them (issue 30, item 2: every start-up on the critical path as a run meets it)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from sim_helpers import write_cpu_profile

from rubberband.catalog import load_catalog
from rubberband.planner.model import StartOverlap, fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import StartupOverlap, load_profile

STARTUP_S = 2.0
WORKER_START_S = 2.0


def _overlap(**fields) -> dict:
    return {
        "cloud": "local",
        "instance_type": "local.cpu2",
        "workers": 2,
        "boot_alone_s": 2.0,
        "boot_overlapped_s": 3.5,
        "workers_alone_s": 2.0,
        "workers_overlapped_s": 3.0,
        **fields,
    }


def _model(tmp_path, overlaps: list[dict]):
    path = write_cpu_profile(tmp_path / "profile.json", epoch_s=1.0, startup_s=STARTUP_S)
    data = json.loads(path.read_text())
    data["workload"]["worker_start_s"] = WORKER_START_S
    data["startup_overlap"] = overlaps
    path.write_text(json.dumps(data))
    return fit_performance_model(load_profile(path))


def _ready_times(model, instances: int) -> list[tuple[float, float]]:
    """(requested, ready) of the first stage's instances, in request order."""
    cpu2 = load_catalog(["local"]).find("local.cpu2")
    sim = Simulator(sha_stages(9, 3, 1, 3), model, SimSettings(samples=20))
    plan = [StageConfig(cpu2, instances, 2), StageConfig(cpu2, 1, 2)]
    timeline, _, _ = sim.trace(sim.simulate(plan).configs, 0)
    first = sorted((i for i in timeline.instances if i.first_stage == 0), key=lambda i: i.requested_s)
    return [(i.requested_s, i.ready_s) for i in first]


def test_a_serial_start_pays_what_overlapping_the_previous_instances_workers_costs(tmp_path):
    alone = _ready_times(_model(tmp_path / "a", []), 3)
    overlapped = _ready_times(_model(tmp_path / "b", [_overlap()]), 3)
    boot_extra, worker_extra = 1.5, 1.0
    # the first instance boots alone; its workers start beside the second's boot (+1.0 s)
    assert overlapped[0][0] == pytest.approx(alone[0][0])
    assert overlapped[0][1] - alone[0][1] == pytest.approx(worker_extra)
    # the second boots beside the first's workers (+1.5 s), its workers beside the third's boot (+1.0 s)
    assert overlapped[1][0] - alone[1][0] == pytest.approx(0.0)
    assert overlapped[1][1] - alone[1][1] == pytest.approx(boot_extra + worker_extra)
    # the third is requested once the second is up (1.5 s later) and boots beside its workers; its own start alone
    assert overlapped[2][0] - alone[2][0] == pytest.approx(boot_extra)
    assert overlapped[2][1] - alone[2][1] == pytest.approx(2 * boot_extra)


def test_a_single_new_instance_overlaps_nothing(tmp_path):
    assert _ready_times(_model(tmp_path / "b", [_overlap()]), 1) == pytest.approx(
        _ready_times(_model(tmp_path / "a", []), 1)
    )


def test_the_model_takes_the_median_extra_never_a_speed_up_and_scales_with_the_workers_started(tmp_path):
    model = _model(
        tmp_path,
        [_overlap(), _overlap(boot_overlapped_s=2.5, workers_overlapped_s=4.0), _overlap(boot_overlapped_s=1.0)],
    )
    overlap = model.start_overlap("local")
    assert overlap == StartOverlap(workers=2, boot_extra_s=0.5, worker_extra_s=1.0)
    assert overlap.extras(4) == pytest.approx((1.0, 2.0))
    assert model.start_overlap("aws") is None
    assert model.describe()["start_overlap"]["local"]["worker_extra_s"] == pytest.approx(1.0)
    faster = _model(tmp_path / "f", [_overlap(boot_overlapped_s=1.0, workers_overlapped_s=1.5)])
    assert faster.start_overlap("local") == StartOverlap(workers=2, boot_extra_s=0.0, worker_extra_s=0.0)


def test_a_profile_s_overlap_must_be_seconds_and_at_least_one_worker():
    with pytest.raises(ValidationError, match="workers"):
        StartupOverlap.model_validate(_overlap(workers=0))
    with pytest.raises(ValidationError, match="boot_overlapped_s"):
        StartupOverlap.model_validate(_overlap(boot_overlapped_s=-1.0))
