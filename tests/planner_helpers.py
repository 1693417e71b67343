"""Shared builders for the planner tests: synthetic profiles, instance types and models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.catalog import InstanceType
from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel
from rubberband.profile import Profile

TRUE = DeviceModel(
    alpha_grad=0.10,
    beta_grad=0.0,
    alpha_sync_node=0.012,
    beta_sync_node=0.003,
    alpha_sync_cross=0.06,
    beta_sync_cross=0.012,
    gamma=1.6,
)


def itype(
    name: str = "gpu1", *, cloud: str = "aws", gpus: int = 1, price: float = 3.6, device: str = "V100"
) -> InstanceType:
    return InstanceType(
        cloud=cloud,
        name=name,
        region="r1",
        zones=("r1a",),
        device=device,
        accelerator_count=gpus,
        vcpus=8.0 * gpus,
        memory_gib=60.0,
        price_hr=price,
        spot_price_hr=price / 3,
    )


@dataclass(frozen=True)
class SyntheticProfile:
    """A profile whose latencies follow ``truth`` exactly (or with lognormal ``noise``): ``n`` latencies per
    (workers, nodes) shape, drawn with ``seed``; ``startup``: its start-up samples; ``device_speed``: other devices'
    speeds relative to the V100 measured."""

    shapes: tuple[tuple[int, int], ...]
    truth: DeviceModel = TRUE
    noise: float = 0.0
    n: int = 20
    seed: int = 0
    startup: list | None = None
    device_speed: dict[str, float] | None = None

    def build(self) -> Profile:
        import numpy as np

        rng = np.random.default_rng(self.seed)
        measurements = []
        for workers, nodes in self.shapes:
            t = self.truth.t_iter(64, workers, nodes)
            lat = t * np.exp(self.noise * rng.standard_normal(self.n)) if self.noise else np.full(self.n, t)
            measurements.append(
                {"device": "V100", "workers": workers, "nodes": nodes, "iteration_latencies_s": [float(x) for x in lat]}
            )
        data = {
            "workload": {
                "name": "synthetic",
                "origin": "tests",
                "dataset_size": 6400,
                "batch_size_per_worker": 64,
                "restart_overhead_s": 5.0,
                "checkpoint_size_gb": 0.5,
            },
            "measurements": measurements,
            "startup": self.startup or [],
        }
        if self.device_speed:
            data["reference_device"] = "V100"
            data["device_speed"] = self.device_speed
        return Profile.model_validate(data)


def synthetic_profile(shapes, **options: Any) -> Profile:
    """``SyntheticProfile(shapes, **options).build()``: see :class:`SyntheticProfile` for the options."""
    return SyntheticProfile(tuple(shapes), **options).build()


@dataclass(frozen=True)
class IdealModel:
    """The figures of a model with perfect scaling (no sync cost) and fixed start-up and termination (one
    sample each, unless ``startup_samples``): a model with a closed form."""

    t_iter: float = 0.5
    startup: float = 0.0
    sigma: float = 0.0
    dataset: int = 1000
    batch: int = 10
    restart: float = 0.0
    eval_s: float = 0.0
    ckpt_gb: float = 0.0
    startup_samples: Sequence[float] | None = None
    termination: float = 0.0
    epoch_overhead: float = 0.0
    task_start: float = 0.0
    worker_start: float = 0.0

    def build(self) -> PerformanceModel:
        device = DeviceModel(
            alpha_grad=self.t_iter,
            beta_grad=0.0,
            alpha_sync_node=0.0,
            beta_sync_node=0.0,
            alpha_sync_cross=0.0,
            beta_sync_cross=0.0,
            gamma=1.0,
        )
        samples = tuple(self.startup_samples) if self.startup_samples else (self.startup,)
        return PerformanceModel(
            dataset_size=self.dataset,
            batch_size_per_worker=self.batch,
            restart_overhead_s=self.restart,
            checkpoint_size_gb=self.ckpt_gb,
            eval_time_s=self.eval_s,
            reference_device="V100",
            devices={"V100": device},
            straggler_sigma=self.sigma,
            startup_by_cloud={"aws": StartupModel(samples, "test")},
            termination_by_cloud={"aws": StartupModel((self.termination,), "test")},
            epoch_overhead_s=self.epoch_overhead,
            task_start_s=self.task_start,
            worker_start_s=self.worker_start,
        )


def ideal_model(**figures: Any) -> PerformanceModel:
    """``IdealModel(**figures).build()``: perfect scaling (no sync cost), fixed start-up and termination; see
    :class:`IdealModel` for the figures."""
    return IdealModel(**figures).build()
