"""Shared builders for the planner tests: synthetic profiles, instance types and models."""

from __future__ import annotations

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


def synthetic_profile(
    shapes,
    *,
    truth: DeviceModel = TRUE,
    noise: float = 0.0,
    n: int = 20,
    seed: int = 0,
    startup=None,
    device_speed=None,
) -> Profile:
    """A profile whose latencies follow ``truth`` exactly (or with lognormal ``noise``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    measurements = []
    for workers, nodes in shapes:
        t = truth.t_iter(64, workers, nodes)
        lat = t * np.exp(noise * rng.standard_normal(n)) if noise else np.full(n, t)
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
        "startup": startup or [],
    }
    if device_speed:
        data["reference_device"] = "V100"
        data["device_speed"] = device_speed
    return Profile.model_validate(data)


def ideal_model(
    *,
    t_iter: float = 0.5,
    startup: float = 0.0,
    sigma: float = 0.0,
    dataset: int = 1000,
    batch: int = 10,
    restart: float = 0.0,
    eval_s: float = 0.0,
    ckpt_gb: float = 0.0,
    startup_samples=None,
    termination: float = 0.0,
    epoch_overhead: float = 0.0,
    task_start: float = 0.0,
    worker_start: float = 0.0,
) -> PerformanceModel:
    """Perfect scaling (no sync cost), fixed start-up and termination: a model with a closed form."""
    device = DeviceModel(
        alpha_grad=t_iter,
        beta_grad=0.0,
        alpha_sync_node=0.0,
        beta_sync_node=0.0,
        alpha_sync_cross=0.0,
        beta_sync_cross=0.0,
        gamma=1.0,
    )
    samples = tuple(startup_samples) if startup_samples else (startup,)
    return PerformanceModel(
        dataset_size=dataset,
        batch_size_per_worker=batch,
        restart_overhead_s=restart,
        checkpoint_size_gb=ckpt_gb,
        eval_time_s=eval_s,
        reference_device="V100",
        devices={"V100": device},
        straggler_sigma=sigma,
        startup_by_cloud={"aws": StartupModel(samples, "test")},
        termination_by_cloud={"aws": StartupModel((termination,), "test")},
        epoch_overhead_s=epoch_overhead,
        task_start_s=task_start,
        worker_start_s=worker_start,
    )
