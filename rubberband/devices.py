"""Where a trial's workers run: one GPU each with nccl on GPU types, one CPU each with gloo otherwise.

Two small I/O-free decisions, kept here so the executor, the profiler and the node start-up
agree on them:

* :func:`worker_device` — from a catalog :class:`~rubberband.catalog.InstanceType` to a
  :class:`WorkerDevice`: what one data-parallel worker asks Ray for (``{"GPU": 1, "CPU": c}`` on
  a type with ``g`` GPUs and ``v`` vCPUs, ``c = v // g``; ``{"CPU": 1}`` on CPU types) and which
  process-group backend it joins (``nccl`` / ``gloo``). :func:`node_resources` is the matching
  node side: what a Ray node standing for one instance advertises, so an instance holds exactly
  ``InstanceType.workers`` workers — the count the planner and ``executor.placement`` pack by.
* :func:`resolve` — inside the worker, from what the process sees (:class:`CudaFacts`: CUDA
  available?, devices visible, the GPU ids Ray assigned) to the torch device and backend. Ray sets
  ``CUDA_VISIBLE_DEVICES`` to the assigned GPU, so the worker trains on ``cuda:0``. A node that
  advertises GPUs without a usable CUDA raises :class:`~rubberband.errors.GpuUnavailableError`
  naming the instance type: never a silent fall-back to the CPU, which would make every
  measurement and prediction for a GPU type wrong by an order of magnitude.

:class:`DevicePolicy` bundles the first decision with the one test hook: ``cpu_stand_in=True``
(given to a policy's constructor, never read from the environment) lets a test on *logical*
GPUs (Ray nodes started with ``--num-gpus`` on a machine without CUDA) check the GPU requests and
assignment, then go on training on the CPU with gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rubberband.catalog import InstanceType
from rubberband.errors import GpuUnavailableError


@dataclass(frozen=True)
class WorkerDevice:
    """What one DDP worker of a trial asks Ray for and which backend its process group uses."""

    kind: Literal["cpu", "gpu"] = "cpu"
    #: Ray CPUs per worker: 1 on CPU types, the instance's vCPUs per GPU on GPU types.
    num_cpus: float = 1.0
    #: The catalog type the worker runs on (named by errors); empty when not known.
    instance_type: str = ""
    #: Test hook (logical GPUs without CUDA): after checking the assignment, train on CPU with gloo.
    cpu_stand_in: bool = False

    @property
    def use_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def num_gpus(self) -> int:
        return 1 if self.use_gpu else 0

    @property
    def backend(self) -> str:
        """The process-group backend the plan intends (``resolve`` says what a worker really uses)."""
        return "nccl" if self.use_gpu else "gloo"

    def bundle(self, resource: str | None) -> dict[str, float]:
        """One placement-group bundle: the worker's CPUs (and GPU) and one slot of its instance."""
        out: dict[str, float] = {"CPU": self.num_cpus}
        if self.use_gpu:
            out["GPU"] = 1
        if resource is not None:
            out[resource] = 1
        return out

    def actor_options(self, resource: str | None) -> dict[str, Any]:
        """Ray actor options for one worker (``resource``: pin it to an instance; None inside a placement group)."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "max_restarts": 0}
        if resource is not None:
            options["resources"] = {resource: 1}
        return options


#: A worker on a CPU-only type: one Ray CPU, gloo.
CPU_WORKER = WorkerDevice()


def cpus_per_gpu(itype: InstanceType) -> int:
    """The CPU share of one GPU worker: the instance's vCPUs split evenly over its GPUs (at least 1)."""
    if itype.accelerator_count <= 0:
        return 1
    return max(1, int(itype.vcpus) // itype.accelerator_count)


def worker_device(itype: InstanceType, *, cpu_stand_in: bool = False) -> WorkerDevice:
    """The device of one trial worker on ``itype``: a GPU where the catalog lists accelerators."""
    if itype.accelerator_count > 0:
        return WorkerDevice(
            kind="gpu", num_cpus=float(cpus_per_gpu(itype)), instance_type=itype.name, cpu_stand_in=cpu_stand_in
        )
    return WorkerDevice(kind="cpu", num_cpus=1.0, instance_type=itype.name, cpu_stand_in=cpu_stand_in)


@dataclass(frozen=True)
class NodeResources:
    """What the Ray node standing for one instance advertises (``ray start`` flags / ``add_node`` args)."""

    num_cpus: int
    num_gpus: int
    #: Worker slots: the amount of the node's ``rb-node-<id>`` resource (= ``InstanceType.workers``).
    slots: int

    def ray_start_args(self) -> list[str]:
        """``ray start`` flags for the CPUs and GPUs (the ``rb-node-<id>`` resource is added by the caller).

        ``--num-gpus 0`` on CPU types: a CPU type's node never offers the host's GPUs (Ray would detect them).
        """
        return ["--num-cpus", str(self.num_cpus), "--num-gpus", str(self.num_gpus)]


def node_resources(itype: InstanceType) -> NodeResources:
    """A node that holds exactly ``itype.workers`` workers of :func:`worker_device` (GPUs: one per worker)."""
    slots = itype.workers
    if itype.accelerator_count > 0:
        return NodeResources(num_cpus=slots * cpus_per_gpu(itype), num_gpus=slots, slots=slots)
    return NodeResources(num_cpus=slots, num_gpus=0, slots=slots)


@dataclass(frozen=True)
class DevicePolicy:
    """Chooses each trial's :class:`WorkerDevice` from its instance type.

    ``cpu_stand_in`` is for tests on logical GPUs only (see the module docstring); production
    code constructs ``DevicePolicy()``.
    """

    cpu_stand_in: bool = False

    def for_type(self, itype: InstanceType) -> WorkerDevice:
        return worker_device(itype, cpu_stand_in=self.cpu_stand_in)


# -- inside the worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaFacts:
    """What a worker process sees of CUDA (gathered by :func:`observe_cuda`; plain data so tests can make it)."""

    available: bool
    device_count: int
    #: ``ray.get_gpu_ids()`` in the worker: the GPUs Ray assigned it.
    gpu_ids: tuple[Any, ...] = ()
    #: ``torch.version.cuda``: None for a CPU-only torch build.
    torch_cuda: str | None = None
    torch_version: str = ""


@dataclass(frozen=True)
class ResolvedDevice:
    """The torch device a worker trains on and the backend of its process group."""

    device: str  # "cpu" | "cuda:<index>"
    backend: str  # "gloo" | "nccl"
    gpu_ids: tuple[Any, ...] = ()
    #: True when a test's cpu_stand_in made a GPU worker train on the CPU.
    stand_in: bool = False


def resolve(device: WorkerDevice, facts: CudaFacts | None) -> ResolvedDevice:
    """The device and backend of one worker; GpuUnavailableError when a GPU worker cannot use CUDA. ``facts``: what
    the worker sees of CUDA (:func:`observe_cuda`), needed for GPU workers only (None: not looked at)."""
    if not device.use_gpu:
        return ResolvedDevice("cpu", "gloo")
    if facts is None:
        raise ValueError("a GPU worker's device is resolved from what it sees of CUDA (observe_cuda())")
    where = f"instance type {device.instance_type}" if device.instance_type else "this instance type"
    if not facts.gpu_ids:
        raise GpuUnavailableError(
            f"{where} has GPUs, but Ray assigned this worker none; the node must be "
            f"started with --num-gpus (see rubberband.devices.node_resources)"
        )
    if not facts.available or facts.device_count < 1:
        if device.cpu_stand_in:
            return ResolvedDevice("cpu", "gloo", facts.gpu_ids, stand_in=True)
        if facts.torch_cuda is None:
            why = f"torch {facts.torch_version} is a CPU-only build; install a CUDA build of torch on the image"
        else:
            why = (
                f"torch {facts.torch_version} (CUDA {facts.torch_cuda}) sees {facts.device_count} CUDA "
                f"device(s); check the NVIDIA driver on the image (nvidia-smi)"
            )
        raise GpuUnavailableError(
            f"{where}: the node advertises GPUs (Ray assigned GPU "
            f"{', '.join(map(str, facts.gpu_ids))}) but CUDA is not usable in the worker: "
            f"{why}. Refusing to train a GPU type on its CPUs"
        )
    if facts.device_count == 1:
        index = 0  # Ray set CUDA_VISIBLE_DEVICES to the one assigned GPU
    else:  # CUDA_VISIBLE_DEVICES was not narrowed by Ray: index by the assigned id
        try:
            index = int(facts.gpu_ids[0])
        except (TypeError, ValueError):
            index = 0
        index = index if 0 <= index < facts.device_count else 0
    return ResolvedDevice(f"cuda:{index}", "nccl", facts.gpu_ids)


def observe_cuda() -> CudaFacts:
    """What this process (a Ray worker) sees of CUDA and of its Ray GPU assignment."""
    import ray
    import torch

    try:
        gpu_ids = tuple(ray.get_gpu_ids())
    except Exception:  # noqa: BLE001 - outside a Ray worker
        gpu_ids = ()
    available = bool(torch.cuda.is_available())
    return CudaFacts(
        available=available,
        device_count=torch.cuda.device_count() if available else 0,
        gpu_ids=gpu_ids,
        torch_cuda=torch.version.cuda,
        torch_version=torch.__version__,
    )
