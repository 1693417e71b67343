"""The plan's ASHA baseline against real Ray Tune ASHA runs (needs the raytune extra; an idle machine).

    python bench/bench_asha_ray.py [--nodes 1,2,3] [--slots 2] [--workloads A,B,C] [--repeat 3]

What a plan shows as "ASHA" is Ray Tune's ``ASHAScheduler`` on a fixed cluster. This bench checks that
prediction against Ray Tune itself with nothing fitted to the runs it predicts: the trial starts come from the
profiler's own measurement (:func:`rubberband.profiler.tune_start.measure_tune_start`, what ``rubberband
profile`` records as ``tune_trial_start``), taken once at the start of the bench on a node of its own, and the
simulator is set up from it by :func:`rubberband.planner.asha.ray_tune_starts`, as ``rubberband plan`` does.

Each workload runs on 1, 2 and 3 local Ray nodes (the profiler's ``LocalCluster``, ``--slots`` CPUs each, one
trial per CPU) with ``ASHAScheduler(grace_period=1, reduction_factor=3, max_t)``. A function trainable sleeps its
epoch time per epoch and reports a fixed score (a permutation of the trials; the simulator is given the same
order). Workloads:

* A: 27 trials, 1 s epochs, rungs 1/3/9 (starts and training alike);
* B: 9 trials, 3 s epochs, rungs 1/3/9 (training-bound);
* C: 36 trials, 0.5 s epochs, rungs 1/3 (start-bound).

Printed per case: Ray Tune's JCT (``Tuner.fit()``) in each of ``--repeat`` runs and their median, the plan's ASHA
prediction (median of 64 draws of the start spread), its error against the median run (target: within 10 %), the
draws' 10th to 90th percentile and where each run falls among the draws (a case whose promotions go two ways, as
B on two nodes, has two modes in the draws as in Tune, and its median between them), the prediction without
Tune's starts (the trials starting as this executor's do, as plans did before the profiler measured Tune) and the
trials reaching each rung (the run nearest the median). One run says little: the same case (C on one node) took
55.0 to 74.4 s on this machine from one day to the next, and where a trial is promoted depends on which results
Tune happens to record first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str
    trials: int
    epoch_s: float
    max_t: int


WORKLOADS = {
    "A": Workload("A", 27, 1.0, 9),
    "B": Workload("B", 9, 3.0, 9),
    "C": Workload("C", 36, 0.5, 3),
}
#: Draws of the trials' start lengths: the prediction is their median.
SAMPLES = 64


def run_asha(tune, storage: str, work: Workload, qualities: np.ndarray) -> tuple[float, list[int]]:
    """Ray Tune's ASHA on the connected cluster: (seconds in ``Tuner.fit()``, trials reaching each rung)."""
    from ray.tune.schedulers import ASHAScheduler

    epoch_s = work.epoch_s

    def trainable(config):
        for _ in range(int(config["max_t"])):
            time.sleep(epoch_s)
            tune.report({"score": float(config["q"])})

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"q": tune.grid_search([float(q) for q in qualities]), "max_t": work.max_t},
        tune_config=tune.TuneConfig(
            scheduler=ASHAScheduler(
                time_attr="training_iteration", grace_period=1, reduction_factor=3, max_t=work.max_t
            ),
            metric="score",
            mode="max",
        ),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    began = time.perf_counter()
    results = tuner.fit()
    jct = time.perf_counter() - began
    ladder = [m for m in (1, 3, 9, 27) if m <= work.max_t]
    return jct, [sum(1 for r in results if r.metrics.get("training_iteration", 0) >= m) for m in ladder]


@dataclass(frozen=True)
class Predicted:
    """The simulator's JCT draws for one case with Ray Tune's measured starts (``draws``; the prediction is their
    median), the median without Tune's starts, and the trials reaching each rung in the median draw."""

    draws: np.ndarray
    without_s: float
    rungs: list

    @property
    def median_s(self) -> float:
        return float(np.median(self.draws))

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.draws, q))

    def error(self, jct: float) -> float:
        """The prediction's signed error against a run's JCT, as a fraction of it."""
        return (self.median_s - jct) / jct

    def error_without(self, jct: float) -> float:
        """The same for the prediction without Tune's starts."""
        return (self.without_s - jct) / jct

    def percentile_of(self, jct: float) -> float:
        """Where a run's JCT falls among the draws (0-100: the share of draws at or below it)."""
        return 100.0 * float(np.mean(self.draws <= jct))


def predict(work: Workload, nodes: int, slots: int, tune_start, qualities: np.ndarray) -> Predicted:
    """The case's draws with Ray Tune's measured starts, and the median without them."""
    from rubberband.catalog import InstanceType
    from rubberband.planner.asha import AshaCluster, AshaSchedule, AshaSettings, AshaSimulator, ray_tune_starts
    from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel

    device = DeviceModel(
        alpha_grad=work.epoch_s,
        beta_grad=0.0,
        alpha_sync_node=0.0,
        beta_sync_node=0.0,
        alpha_sync_cross=0.0,
        beta_sync_cross=0.0,
        gamma=1.0,
    )
    zero = StartupModel((0.0,), "the bench's nodes are up before Tune starts")
    model = PerformanceModel(
        dataset_size=1,
        batch_size_per_worker=1,
        restart_overhead_s=0.0,
        checkpoint_size_gb=0.0,
        eval_time_s=0.0,
        reference_device="cpu",
        devices={"cpu": device},
        straggler_sigma=0.0,
        startup_by_cloud={"local": zero},
        termination_by_cloud={"local": zero},
        tune_start=tune_start,
    )
    itype = InstanceType(
        cloud="local",
        name="bench",
        region="local",
        zones=("local",),
        device="cpu",
        accelerator_count=0,
        vcpus=float(slots),
        memory_gib=8.0,
        price_hr=0.0,
        spot_price_hr=None,
    )
    schedule = AshaSchedule(trials=work.trials, eta=3, min_epochs=1, max_epochs=work.max_t)
    out = []
    for m in (model, replace(model, tune_start=None)):
        sim = AshaSimulator(m, schedule, AshaSettings(samples=SAMPLES, starts=lambda t, m=m: ray_tune_starts(m, t)))
        sim.set_qualities(qualities)
        res = sim.simulate(AshaCluster(itype, nodes, 1))
        median = int(np.argsort(res.jct)[len(res.jct) // 2])
        out.append((res.jct, res.promotions[median].tolist()))
    return Predicted(draws=out[0][0], without_s=float(np.median(out[1][0])), rungs=out[0][1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="1,2,3", help="node counts, comma-separated")
    parser.add_argument("--slots", type=int, default=2, help="CPUs (trial slots) per node")
    parser.add_argument("--workloads", default="A,B,C")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="Ray Tune runs per case (their median is compared: one run of the "
        "same case took 55-70 s on this 2-core machine)",
    )
    args = parser.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    works = [WORKLOADS[w] for w in args.workloads.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="rb-asha-"))

    from ray import tune

    from rubberband.cloud.provider import node_resource
    from rubberband.planner.model import tune_start_model
    from rubberband.profiler.local_cluster import LocalCluster
    from rubberband.profiler.tune_start import measure_tune_start, concurrent_starts

    rows = []
    load_before = os.getloadavg()[0]
    try:
        with LocalCluster(temp_root=tmp / "r") as cluster:
            cluster.add_instance("n0", args.slots)
            cores = os.cpu_count() or 1
            cluster.add_instance("tune-probe", concurrent_starts(cores), num_cpus=concurrent_starts(cores))
            measured = measure_tune_start(tmp / "probe", node_resource("tune-probe"), cpus=concurrent_starts(cores))
            cluster.remove_instance("tune-probe")
            model_start = tune_start_model(measured)
            print(
                f"profiler's Ray Tune trial start: {statistics.mean(measured.serial_s):.2f} s alone "
                f"({', '.join(f'{x:.2f}' for x in measured.serial_s)}), {measured.concurrent} at once "
                f"{statistics.mean(measured.concurrent_s):.2f} s -> {model_start.lanes(cores):.2f} start lanes on "
                f"{cores} cores, spread σ {model_start.sigma:.3f}; {measured.busy_concurrent} at once among "
                f"training trials {statistics.mean(measured.busy_concurrent_s):.2f} s -> "
                f"{model_start.busy_s:.2f} s on top"
            )
            for nodes in counts:
                while len(cluster.nodes) < nodes:
                    cluster.add_instance(f"n{len(cluster.nodes)}", args.slots)
                while len(cluster.nodes) > nodes:
                    cluster.remove_instance(f"n{len(cluster.nodes) - 1}")
                for work in works:
                    qualities = np.random.default_rng(work.trials).permutation(work.trials).astype(float)
                    runs = [run_asha(tune, str(tmp / "results"), work, qualities) for _ in range(args.repeat)]
                    jcts = [jct for jct, _ in runs]
                    jct = statistics.median(jcts)
                    reached = min(runs, key=lambda r: abs(r[0] - jct))[1]
                    pred = predict(work, nodes, args.slots, model_start, qualities)
                    rows.append((work, nodes, jcts, jct, pred, reached))
                    print(
                        f"{work.name} ({work.trials} trials, {work.epoch_s:g} s epochs, max_t {work.max_t}) on "
                        f"{nodes} node(s) x {args.slots}: Ray Tune {', '.join(f'{j:.1f}' for j in jcts)} s (median "
                        f"{jct:.1f} s), predicted {pred.median_s:.1f} s ({100 * pred.error(jct):+.1f} %), without "
                        f"Tune's starts {pred.without_s:.1f} s ({100 * pred.error_without(jct):+.1f} %), rungs {reached} vs "
                        f"{pred.rungs}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nload average {load_before:.1f} before, on {os.cpu_count()} CPUs")
    print(
        f"| workload | nodes × slots | Ray Tune JCT (median of {args.repeat}; range) | predicted | error | "
        "predicted p10–p90 | runs' percentiles | without Tune's starts | rungs (Tune / predicted) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for work, nodes, jcts, jct, pred, reached in rows:
        percentiles = ", ".join(f"{pred.percentile_of(j):.0f}" for j in jcts)
        print(
            f"| {work.name}: {work.trials} × {work.epoch_s:g} s, max_t {work.max_t} | {nodes} × {args.slots} | "
            f"{jct:.1f} s ({min(jcts):.1f}–{max(jcts):.1f}) | {pred.median_s:.1f} s | "
            f"{100 * pred.error(jct):+.1f} % | {pred.quantile(0.1):.1f}–{pred.quantile(0.9):.1f} s | "
            f"{percentiles} | {100 * pred.error_without(jct):+.1f} % | {reached} / {pred.rungs} |"
        )
    errors = [abs(pred.error(jct)) for _, _, _, jct, pred, _ in rows]
    inside = sum(min(jcts) * 0.9 <= pred.median_s <= max(jcts) * 1.1 for _, _, jcts, _, pred, _ in rows)
    runs = [(j, pred) for _, _, jcts, _, pred, _ in rows for j in jcts]
    widened = sum(0.9 * pred.quantile(0.1) <= j <= 1.1 * pred.quantile(0.9) for j, pred in runs)
    print(
        f"\n|error| against the median run: median {100 * statistics.median(errors):.1f} %, max "
        f"{100 * max(errors):.1f} % over {len(rows)} cases; within 10 %: {sum(e <= 0.10 for e in errors)} of "
        f"{len(rows)}; within 10 % of the runs' range: {inside} of {len(rows)}; runs within 10 % of their "
        f"prediction's p10–p90: {widened} of {len(runs)}"
    )


if __name__ == "__main__":
    main()
