"""ASHA simulation vs Ray Tune's ASHAScheduler on a local static cluster (needs the ray[tune] extra).

    python bench/bench_asha_ray.py [--trials 27] [--slots 4] [--epoch-s 1.0]

A function trainable sleeps ``epoch_s`` per epoch and reports a fixed score (a permutation of the
trials, the same latent quality order the simulator uses); ``ASHAScheduler(grace_period=1,
reduction_factor=3, max_t=9)`` runs it on a local Ray cluster with ``slots`` CPUs, one per trial.
Ray Tune's own overheads are calibrated first from three small runs without a scheduler (one
trial of 9 epochs, one of 1 epoch, four of 1 epoch one at a time): a fixed set-up time ``F``, a
per-trial start ``s`` and a per-epoch overhead ``o``. The simulator then predicts the ASHA run's
JCT (``F`` + :class:`rubberband.planner.asha.AshaSimulator` with ``task_start_s = s``,
``epoch_overhead_s = o``), compared with the measured one (target: within 10%). Starts its own
Ray instance (``address="local"``, own temp dir) and shuts it down.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def run_tuner(tune, trainable, qualities, *, max_t, cpus_per_trial, scheduler=None) -> float:
    """Seconds from Tuner.fit() to its return."""
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": cpus_per_trial}),
        param_space={"q": tune.grid_search(list(qualities)), "max_t": max_t},
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="score" if scheduler else None,
                                    mode="max" if scheduler else None),
    )
    started = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=27)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--epoch-s", type=float, default=1.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb-asha-"))
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from rubberband.catalog import InstanceType
    from rubberband.planner.asha import AshaCluster, AshaSimulator
    from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel

    epoch_s = args.epoch_s

    def trainable(config):
        for _ in range(int(config["max_t"])):
            time.sleep(epoch_s)
            tune.report({"score": float(config["q"])})

    rng = np.random.default_rng(0)
    qualities = rng.permutation(args.trials).astype(float)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    ray.init(address="local", num_cpus=args.slots, include_dashboard=False, log_to_driver=False)
    try:
        a = run_tuner(tune, trainable, [0.0], max_t=9, cpus_per_trial=args.slots)
        b = run_tuner(tune, trainable, [0.0], max_t=1, cpus_per_trial=args.slots)
        c = run_tuner(tune, trainable, [0.0, 1.0, 2.0, 3.0], max_t=1, cpus_per_trial=args.slots)
        o = max(0.0, (a - b) / 8 - epoch_s)
        s = max(0.0, (c - b) / 3 - epoch_s - o)
        fixed = max(0.0, b - s - epoch_s - o)
        print(f"calibration: 1x9 epochs {a:.2f} s, 1x1 {b:.2f} s, 4x1 serial {c:.2f} s -> set-up F {fixed:.2f} s, "
              f"trial start s {s:.2f} s, per-epoch overhead o {o:.3f} s")
        scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=1, reduction_factor=3, max_t=9)
        measured = run_tuner(tune, trainable, qualities, max_t=9, cpus_per_trial=1, scheduler=scheduler)
    finally:
        ray.shutdown()

    device = DeviceModel(alpha_grad=epoch_s, beta_grad=0.0, alpha_sync_node=0.0, beta_sync_node=0.0,
                         alpha_sync_cross=0.0, beta_sync_cross=0.0, gamma=1.0)
    model = PerformanceModel(dataset_size=1, batch_size_per_worker=1, restart_overhead_s=0.0, checkpoint_size_gb=0.0,
                             eval_time_s=0.0, reference_device="cpu", devices={"cpu": device}, straggler_sigma=0.0,
                             startup_by_cloud={"local": StartupModel((0.0,), "up")},
                             termination_by_cloud={"local": StartupModel((0.0,), "up")},
                             epoch_overhead_s=o, task_start_s=s)
    itype = InstanceType(cloud="local", name="ray", region="local", zones=("local",), device="cpu",
                         accelerator_count=0, vcpus=float(args.slots), memory_gib=8.0, price_hr=0.0,
                         spot_price_hr=None)
    sim = AshaSimulator(model, trials=args.trials, eta=3, min_epochs=1, max_epochs=9, samples=1)
    sim._quality = qualities[None, :]
    res = sim.simulate(AshaCluster(itype, 1, 1))
    predicted = fixed + float(res.jct[0])
    print(f"ASHA {args.trials} trials, eta 3, rungs 1/3/9 epochs of {epoch_s:g} s, {args.slots} slots: measured "
          f"{measured:.2f} s, predicted {predicted:.2f} s (set-up {fixed:.2f} + simulated {res.jct[0]:.2f}); "
          f"error {100 * (predicted - measured) / measured:+.1f}% (target within 10%); trials reaching each rung "
          f"(simulated) {res.promotions[0].tolist()}")


if __name__ == "__main__":
    main()
