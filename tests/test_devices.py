"""The device / backend policy (rubberband.devices): pure, no Ray, no CUDA needed."""

from __future__ import annotations

import pytest

from rubberband.catalog import load_catalog
from rubberband.errors import ExecutionError, GpuUnavailableError
from rubberband.devices import CPU_WORKER, CudaFacts, DevicePolicy, WorkerDevice, node_resources, resolve, worker_device
from rubberband.executor.placement import make_slots

CATALOG = load_catalog(["aws", "gcp", "local"])


def _type(name: str):
    return next(t for t in CATALOG.types if t.name == name)


@pytest.mark.parametrize(
    "name, cpus",
    [("p3.2xlarge", 8), ("p3.8xlarge", 8), ("g5.xlarge", 4), ("a2-highgpu-1g", 12), ("n1-standard-8+V100x1", 8)],
)
def test_gpu_types_get_one_gpu_and_their_cpu_share_per_worker_with_nccl(name, cpus):
    device = worker_device(_type(name))
    assert device.use_gpu and device.backend == "nccl" and device.instance_type == name
    assert device.num_gpus == 1 and device.num_cpus == cpus
    assert device.bundle("rb-node-i1") == {"GPU": 1, "CPU": cpus, "rb-node-i1": 1}
    assert device.actor_options("rb-node-i1") == {
        "num_gpus": 1,
        "num_cpus": cpus,
        "max_restarts": 0,
        "resources": {"rb-node-i1": 1},
    }
    assert device.actor_options(None) == {"num_gpus": 1, "num_cpus": cpus, "max_restarts": 0}


@pytest.mark.parametrize("name", ["local.cpu1", "local.cpu4"])
def test_cpu_types_keep_one_cpu_per_worker_with_gloo(name):
    device = worker_device(_type(name))
    assert not device.use_gpu and device.backend == "gloo" and device.num_gpus == 0
    assert device.bundle("rb-node-x") == {"CPU": 1, "rb-node-x": 1}
    assert device.actor_options(None) == {"num_gpus": 0, "num_cpus": 1, "max_restarts": 0}


def test_every_catalog_node_holds_exactly_the_workers_the_planner_packs():
    """node_resources ⇔ worker_device ⇔ InstanceType.workers (what the planner and placement count)."""
    for itype in CATALOG.types:
        node, device = node_resources(itype), worker_device(itype)
        assert node.slots == itype.workers
        assert node.num_gpus == (itype.accelerator_count if itype.accelerator_count else 0)
        fits_by_cpu = node.num_cpus // device.num_cpus
        fits_by_gpu = node.num_gpus if device.use_gpu else fits_by_cpu
        assert min(fits_by_cpu, fits_by_gpu) == itype.workers, itype.name
        assert node.num_cpus <= max(itype.vcpus, itype.workers)


def test_packing_puts_at_most_the_gpu_count_of_workers_on_an_instance():
    p3_8 = _type("p3.8xlarge")  # 4 × V100
    slots = make_slots(["i1", "i2"], p3_8.workers, 6)
    assert len(slots) == 1 and slots[0].placement == ("rb-node-i1",) * 4 + ("rb-node-i2",) * 2
    assert [len(s.placement) for s in make_slots(["i1"], p3_8.workers, 2)] == [2, 2]


def test_node_flags_for_ray_start():
    assert node_resources(_type("p3.8xlarge")).ray_start_args() == ["--num-cpus", "32", "--num-gpus", "4"]
    assert node_resources(_type("local.cpu2")).ray_start_args() == ["--num-cpus", "2", "--num-gpus", "0"]


def test_policy_injects_the_test_stand_in_and_defaults_to_none():
    assert DevicePolicy().for_type(_type("p3.2xlarge")).cpu_stand_in is False
    assert DevicePolicy(cpu_stand_in=True).for_type(_type("p3.2xlarge")).cpu_stand_in is True


# -- resolve: inside the worker ------------------------------------------------------------------

GPU = worker_device(_type("g5.xlarge"))
CUDA_ONE = CudaFacts(available=True, device_count=1, gpu_ids=(3,), torch_cuda="12.4", torch_version="2.13.0")


def test_cpu_worker_resolves_to_cpu_gloo_whatever_cuda_says():
    assert resolve(CPU_WORKER, CUDA_ONE) == resolve(CPU_WORKER, CudaFacts(False, 0))
    assert (resolve(CPU_WORKER, CUDA_ONE).device, resolve(CPU_WORKER, CUDA_ONE).backend) == ("cpu", "gloo")


def test_gpu_worker_trains_on_cuda0_with_nccl_since_ray_narrowed_visible_devices():
    out = resolve(GPU, CUDA_ONE)
    assert (out.device, out.backend, out.gpu_ids, out.stand_in) == ("cuda:0", "nccl", (3,), False)


def test_gpu_worker_indexes_by_its_ray_id_when_every_device_is_visible():
    many = CudaFacts(available=True, device_count=4, gpu_ids=(2,), torch_cuda="12.4")
    assert resolve(GPU, many).device == "cuda:2"
    assert resolve(GPU, CudaFacts(True, 4, gpu_ids=("GPU-uuid",), torch_cuda="12.4")).device == "cuda:0"


@pytest.mark.parametrize(
    "facts, hint",
    [
        (
            CudaFacts(available=False, device_count=0, gpu_ids=(0,), torch_cuda=None, torch_version="2.13.0+cpu"),
            "CPU-only build",
        ),
        (
            CudaFacts(available=False, device_count=0, gpu_ids=(1,), torch_cuda="12.4", torch_version="2.13.0"),
            "NVIDIA driver",
        ),
        (CudaFacts(available=True, device_count=0, gpu_ids=(1,), torch_cuda="12.4"), "NVIDIA driver"),
    ],
)
def test_gpu_worker_without_usable_cuda_fails_naming_the_instance_type(facts, hint):
    with pytest.raises(GpuUnavailableError) as err:
        resolve(GPU, facts)
    message = str(err.value)
    assert "instance type g5.xlarge" in message and hint in message and "\n" not in message
    assert isinstance(err.value, ExecutionError)


def test_gpu_worker_without_a_ray_gpu_fails_too():
    with pytest.raises(GpuUnavailableError, match="g5.xlarge.*assigned this worker none"):
        resolve(GPU, CudaFacts(available=True, device_count=1, gpu_ids=()))


def test_stand_in_trains_on_cpu_only_when_injected_and_keeps_the_assignment():
    facts = CudaFacts(available=False, device_count=0, gpu_ids=(1,))
    out = resolve(WorkerDevice(kind="gpu", num_cpus=4, instance_type="g5.xlarge", cpu_stand_in=True), facts)
    assert (out.device, out.backend, out.gpu_ids, out.stand_in) == ("cpu", "gloo", (1,), True)
    # the stand-in never hides a missing assignment
    with pytest.raises(GpuUnavailableError):
        resolve(WorkerDevice(kind="gpu", instance_type="g5.xlarge", cpu_stand_in=True), CudaFacts(False, 0))
