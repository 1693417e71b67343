"""GPU trials on local Ray nodes with *logical* GPUs (``num_gpus`` on a machine without CUDA).

What this machine can prove: each worker of a GPU type's trial asks Ray for one GPU and its CPU
share, ranks on one instance get distinct GPUs, a trial wider than an instance's GPUs packs
onto the next instance, and — since CUDA is absent here — a real run on such a node stops with
GpuUnavailableError naming the instance type. The tests that go on to train inject the test hook
``DevicePolicy(cpu_stand_in=True)`` (CPU + gloo after the assignment is checked). On a machine with
CUDA, ``bench/bench_gpu.py`` runs the real thing (nccl on real GPUs).
"""

from __future__ import annotations

from ray_helpers import TestCluster, busy_resources, wait_until_idle  # noqa: F401  (import first)

import time
from pathlib import Path

import pytest
import torch

from rubberband.catalog import InstanceType
from rubberband.errors import GpuUnavailableError
from rubberband.devices import DevicePolicy, node_resources
from rubberband.executor.placement import make_slots
from rubberband.executor.pool import WorkerPool
from rubberband.executor.trials import TrialRun, TrialSpec

# One worker, one cluster. Exclusive: in full 4-worker CI runs (never alone or in pairs) a trial's first worker
# was destroyed before it started ("all references to the actor were removed"); the cause is not known yet.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("trials_gpu_cluster"), pytest.mark.exclusive]

CODE = str(Path(__file__).parent / "trial_code")
#: A made-up GPU type: 2 GPUs and 4 vCPUs per instance → 2 workers of {"GPU": 1, "CPU": 2}.
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
STAND_IN = DevicePolicy(cpu_stand_in=True).for_type(GPU2)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: logical GPUs would be real")


@pytest.fixture(scope="module")
def gpu_cluster():
    """Two "instances" of GPU2 (nodes g and h), each with 2 logical GPUs, 4 CPUs, rb-node-<id>: 2."""
    cluster = TestCluster().__enter__()
    try:
        node = node_resources(GPU2)
        for instance_id in ("g", "h"):
            cluster.add_instance(instance_id, node.slots, num_gpus=node.num_gpus, num_cpus=node.num_cpus)
        yield cluster
    finally:
        cluster.close()


def _spec(tmp_path: Path, placement: tuple[str, ...], device, *, trial_id: str = "g0-t000", **config) -> TrialSpec:
    return TrialSpec(
        trial_id=trial_id,
        config=config,
        entry_point="tiny_train:train",
        code_dir=CODE,
        start_epoch=0,
        end_epoch=1,
        placement=placement,
        device=device,
        checkpoint_dir=str(tmp_path / "ckpt" / trial_id),
        timeout_s=60,
    )


def _held_while_running(run: TrialRun, timeout_s: float = 60.0) -> dict[str, float]:
    """What the trial holds once all its workers are placed (polled while it runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = busy_resources()
        if busy.get("GPU", 0) >= run.spec.workers:
            return busy
        time.sleep(0.05)
    return busy_resources()


def test_each_rank_requests_one_gpu_and_gets_its_own(gpu_cluster, tmp_path):
    g = gpu_cluster.resource("g")
    run = TrialRun.start(_spec(tmp_path, (g, g), STAND_IN, sleep=0.3))
    held = _held_while_running(run)
    from ray.util.placement_group import placement_group_table

    bundles = placement_group_table(run.placement_group)["bundles"]
    outcome = run.result(timeout_s=120)
    assert held == {"GPU": 2.0, "CPU": 4.0, g: 2.0}
    assert list(bundles.values()) == [{"GPU": 1.0, "CPU": 2.0, g: 1.0}] * 2
    ids = [set(map(str, ranks)) for ranks in outcome.gpu_ids]
    assert [len(i) for i in ids] == [1, 1] and ids[0] != ids[1]  # distinct GPU per rank on one instance
    assert outcome.devices == ("cpu", "cpu") and outcome.backend == "gloo"  # the injected stand-in
    assert outcome.reports and outcome.reports[0].metrics["world_size"] == 2.0
    assert wait_until_idle() == {}


def test_a_trial_wider_than_an_instance_packs_gpus_per_instance(gpu_cluster, tmp_path):
    """3 workers on 2-GPU instances: 2 on g (distinct GPUs), 1 on h, as make_slots lays them out."""
    (slot,) = make_slots(["g", "h"], GPU2.workers, 3)
    assert slot.placement == (gpu_cluster.resource("g"),) * 2 + (gpu_cluster.resource("h"),)
    run = TrialRun.start(_spec(tmp_path, slot.placement, STAND_IN, sleep=0.3))
    held = _held_while_running(run)
    outcome = run.result(timeout_s=120)
    assert held == {"GPU": 3.0, "CPU": 6.0, gpu_cluster.resource("g"): 2.0, gpu_cluster.resource("h"): 1.0}
    assert len(outcome.gpu_ids) == 3 and all(len(ids) == 1 for ids in outcome.gpu_ids)
    assert outcome.gpu_ids[0] != outcome.gpu_ids[1]
    assert wait_until_idle() == {}


def test_warm_gpu_workers_keep_their_gpu_and_cpu_workers_are_not_reused_for_gpu_trials(gpu_cluster, tmp_path):
    h = gpu_cluster.resource("h")
    with WorkerPool() as pool:
        pool.warm(h, 2, timeout_s=60)  # CPU workers (the pool's default device) on the GPU instance
        first = TrialRun.start(_spec(tmp_path, (h, h), STAND_IN, trial_id="g0-t001"), pool=pool)
        one = first.result(timeout_s=120)
        assert one.warm_workers == (False, False)  # the CPU workers were not handed to a GPU trial
        again = TrialRun.start(_spec(tmp_path, (h, h), STAND_IN, trial_id="g0-t002"), pool=pool)
        two = again.result(timeout_s=120)
        assert two.warm_workers == (True, True)
        assert sorted(map(str, two.gpu_ids)) == sorted(map(str, one.gpu_ids))
        assert busy_resources() == {"GPU": 2.0, "CPU": 4.0, h: 2.0}  # idle warm GPU workers hold their slots
    assert wait_until_idle() == {}


@no_cuda
def test_logical_gpus_without_cuda_fail_the_trial_naming_the_instance_type(gpu_cluster, tmp_path):
    """No stand-in: what a production run hits on a node that advertises GPUs CUDA cannot use."""
    g = gpu_cluster.resource("g")
    run = TrialRun.start(_spec(tmp_path, (g, g), DevicePolicy().for_type(GPU2)))
    with pytest.raises(GpuUnavailableError) as err:
        run.result(timeout_s=120)
    message = str(err.value)
    assert "instance type local.gpu2" in message and "CUDA is not usable" in message and "\n" not in message
    assert message.startswith("trial g0-t000: rank ")
    assert wait_until_idle() == {}
