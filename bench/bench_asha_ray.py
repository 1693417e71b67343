"""ASHA simulation vs Ray Tune's ASHAScheduler on a local static cluster (needs the ray[tune] extra).

    python bench/bench_asha_ray.py [--trials 27] [--slots 4] [--epoch-s 1.0]

A function trainable sleeps ``epoch_s`` per epoch and reports a fixed score (a permutation of the
trials, the same latent quality order the simulator uses); ``ASHAScheduler(grace_period=1,
reduction_factor=3, max_t=9)`` runs it on a local Ray cluster with ``slots`` CPUs, one per trial.

What drives Ray Tune's JCT here is the trial start, not the training: with ``reuse_actors=False``
(Tune's default) every trial is a new actor, i.e. a new worker process whose interpreter and Ray
imports take ~1.7 CPU-seconds, and most ASHA trials train one epoch only. Starts that overlap share
the node's cores. The driver's work per report is small (~15-30 ms, overlapped with the next epoch
since a function trainable's report only waits for the driver's next ``train`` call).

The simulator's parameters are calibrated from small Ray Tune runs, never from the ASHA run it
predicts, each trial's start and end taken by a Tune callback on the driver (the start runs are
made before and again after the ASHA run, and averaged, so that a drift of the machine's load
during the bench is followed):

* one slot (``slots`` CPUs per trial), one trial of 9 epochs: the per-epoch overhead ``o`` (from
  its first report to its last / 8 − epoch); one trial of 1 epoch: the fixed set-up ``F`` (Tuner
  start-up and teardown: its JCT − ``s`` − epoch − ``o``);
* one slot, five trials of 1 epoch one after another: the per-trial start ``s`` (the mean gap
  from a trial's end to the next trial's start);
* ``slots`` slots, a small ASHA run (12 trials, ``max_t`` 3, other scores): the start concurrency
  ``c`` (starts in progress share ``c`` lanes, processor sharing), fitted by bisection so that the
  simulator reproduces that run's JCT. (Fitted on synchronous waves of ``slots`` 1-epoch trials
  instead, ``c`` comes out near 1 and over-states the contention of ASHA's staggered starts: Ray's
  placement groups for a wave are placed ~2 s apart and their workers boot together.)

* the serial start gaps' spread (log standard deviation over both calibrations): the start spread
  ``σ``. Trial starts of uneven length finish out of queue order, as Ray's do, and ASHA's promotions
  depend on the order in which results arrive; the prediction is the median over 64 draws of the starts.

The simulator then predicts the ASHA run's JCT (``F`` + :class:`rubberband.planner.asha.AshaSimulator`
with ``task_start_s = s``, ``epoch_overhead_s = o``, ``start_concurrency = c``) and the trials
reaching each rung, compared with the measured ones (target: JCT within 10%); the prediction
without the start contention (today's planning default) is printed beside it. Starts its own Ray
instance (``address="local"``, own temp dir, results under it) and shuts it down, removing the dir. The machine's
load average is printed: other processes' load slows the starts.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The small ASHA run the start concurrency is fitted on (not the run predicted).
SMALL_TRIALS = 12
SMALL_MAX_T = 3
#: Draws of the trials' start lengths (lognormal, σ from the serial start gaps): the prediction is their median.
SIGMA_SAMPLES = 64


@dataclass(frozen=True)
class Tuning:
    """What every Ray Tune run of the bench shares: Ray Tune itself, the trainable and where results go."""

    tune: Any
    trainable: Any
    storage: str


def run_tuner(tuning: Tuning, qualities, *, max_t, cpus_per_trial, scheduler=None):
    """(seconds from Tuner.fit() to its return, [(start, end, score)] per trial and the times of every
    result (driver clock, from the Tuner's start), the ResultGrid)."""
    tune = tuning.tune
    marks: dict[str, list[float]] = {}
    scores: dict[str, float] = {}
    reports: list[float] = []

    class Marks(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            marks.setdefault(trial.trial_id, [time.perf_counter(), 0.0])
            scores[trial.trial_id] = float(trial.config["q"])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            reports.append(time.perf_counter())

        def on_trial_complete(self, iteration, trials, trial, **info):
            marks[trial.trial_id][1] = time.perf_counter()

    tuner = tune.Tuner(
        tune.with_resources(tuning.trainable, {"cpu": cpus_per_trial}),
        param_space={"q": tune.grid_search(list(qualities)), "max_t": max_t},
        tune_config=tune.TuneConfig(
            scheduler=scheduler, metric="score" if scheduler else None, mode="max" if scheduler else None
        ),
        run_config=tune.RunConfig(storage_path=tuning.storage, callbacks=[Marks()], verbose=0),
    )
    started = time.perf_counter()
    results = tuner.fit()
    jct = time.perf_counter() - started
    spans = sorted((a - started, b - started, scores[k]) for k, (a, b) in marks.items())
    return jct, spans, [t - started for t in reports], results


@dataclass(frozen=True)
class Starts:
    """The fitted trial-start figures the simulator is run with: each trial's start ``start_s``, the per-epoch
    overhead, the start concurrency (None: no start contention) and the start lengths' spread ``sigma``
    (log-sd; 0: every start alike)."""

    start_s: float
    epoch_overhead_s: float
    concurrency: float | None
    sigma: float = 0.0


def start_gaps(spans: list[tuple[float, float]], slots: int) -> list[float]:
    """Per trial after the first wave: its start − the end that freed its slot (ends in order)."""
    ends = sorted(span[1] for span in spans)
    starts = sorted(span[0] for span in spans)
    return [starts[k] - ends[k - slots] for k in range(slots, len(starts))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=27)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--epoch-s", type=float, default=1.0)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="rb-asha-")
    os.environ.setdefault("RAY_TMPDIR", tmp)
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from rubberband.catalog import InstanceType
    from rubberband.planner.asha import AshaCluster, AshaSchedule, AshaSettings, AshaSimulator
    from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel

    epoch_s = args.epoch_s
    slots = args.slots
    storage = os.path.join(tmp, "results")

    def trainable(config):
        for _ in range(int(config["max_t"])):
            time.sleep(epoch_s)
            tune.report({"score": float(config["q"])})

    def simulate(trials: int, max_epochs: int, starts: Starts, qualities=None, samples: int = 1):
        """(median JCT, promotions per rung of the median sample, all JCTs)."""
        s, o, c, sigma = starts.start_s, starts.epoch_overhead_s, starts.concurrency, starts.sigma
        device = DeviceModel(
            alpha_grad=epoch_s,
            beta_grad=0.0,
            alpha_sync_node=0.0,
            beta_sync_node=0.0,
            alpha_sync_cross=0.0,
            beta_sync_cross=0.0,
            gamma=1.0,
        )
        model = PerformanceModel(
            dataset_size=1,
            batch_size_per_worker=1,
            restart_overhead_s=0.0,
            checkpoint_size_gb=0.0,
            eval_time_s=0.0,
            reference_device="cpu",
            devices={"cpu": device},
            straggler_sigma=0.0,
            startup_by_cloud={"local": StartupModel((0.0,), "up")},
            termination_by_cloud={"local": StartupModel((0.0,), "up")},
            epoch_overhead_s=o,
            task_start_s=s,
        )
        itype = InstanceType(
            cloud="local",
            name="ray",
            region="local",
            zones=("local",),
            device="cpu",
            accelerator_count=0,
            vcpus=float(slots),
            memory_gib=8.0,
            price_hr=0.0,
            spot_price_hr=None,
        )
        sim = AshaSimulator(
            model,
            AshaSchedule(trials=trials, eta=3, min_epochs=1, max_epochs=max_epochs),
            AshaSettings(samples=samples, start_concurrency=c, start_sigma=sigma),
        )
        if qualities is not None:
            sim.set_qualities(qualities)
        res = sim.simulate(AshaCluster(itype, 1, 1))
        median = int(np.argsort(res.jct)[len(res.jct) // 2])
        return float(np.median(res.jct)), res.promotions[median].tolist(), res.jct

    rng = np.random.default_rng(0)
    qualities = rng.permutation(args.trials).astype(float)
    load_before = os.getloadavg()[0]
    ray.init(address="local", num_cpus=slots, include_dashboard=False, log_to_driver=False)
    try:
        tuning = Tuning(tune, trainable, storage)
        _, _, nine, _ = run_tuner(tuning, [0.0], max_t=9, cpus_per_trial=slots)
        b, _, _, _ = run_tuner(tuning, [0.0], max_t=1, cpus_per_trial=slots)
        small_q = np.random.default_rng(1).permutation(SMALL_TRIALS).astype(float)

        def calibrate_starts() -> tuple[list[float], float, list]:
            """Serial start gaps (one slot, five 1-epoch trials) and the small ASHA run (JCT, spans)."""
            _, serial, _, _ = run_tuner(tuning, [float(i) for i in range(5)], max_t=1, cpus_per_trial=slots)
            small, small_spans, _, _ = run_tuner(
                tuning,
                small_q,
                max_t=SMALL_MAX_T,
                cpus_per_trial=1,
                scheduler=ASHAScheduler(
                    time_attr="training_iteration", grace_period=1, reduction_factor=3, max_t=SMALL_MAX_T
                ),
            )
            return start_gaps(serial, 1), small, small_spans

        before = calibrate_starts()
        load_calibrated = os.getloadavg()[0]
        scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=1, reduction_factor=3, max_t=9)
        measured, spans, _, results = run_tuner(tuning, qualities, max_t=9, cpus_per_trial=1, scheduler=scheduler)
        load_measured = os.getloadavg()[0]
        after = calibrate_starts()
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()[0]

    o = max(0.0, (nine[-1] - nine[0]) / (len(nine) - 1) - epoch_s)
    fixed = max(0.0, b - statistics.mean(before[0]) - epoch_s - o)

    def fit_c(s: float, target: float) -> float:
        """The start concurrency in [1, slots] whose simulated small run takes ``target`` (JCT falls as c grows)."""

        def small_jct(c: float) -> float:
            return simulate(SMALL_TRIALS, SMALL_MAX_T, Starts(s, o, c, sigma), small_q, SIGMA_SAMPLES)[0]

        lo, hi = 1.0, float(slots)
        if small_jct(hi) >= target:
            return hi
        if small_jct(lo) <= target:
            return lo
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if small_jct(mid) > target else (lo, mid)
        return (lo + hi) / 2

    # the calibration runs bracket the ASHA run (before and after it): their mean follows a load drift
    s = statistics.mean(before[0] + after[0])
    # uneven trial starts (the serial gaps' spread) reorder the reports, on which ASHA's promotions depend
    sigma = statistics.pstdev([math.log(g) for g in before[0] + after[0] if g > 0])
    c = fit_c(s, (before[1] + after[1]) / 2 - fixed)
    print(
        f"load average {load_before:.1f} before, {load_calibrated:.1f} after calibrating, {load_measured:.1f} after "
        f"ASHA, {load_after:.1f} after calibrating again, on {os.cpu_count()} CPUs"
    )
    for name, (gaps_, small, small_spans) in (("before", before), ("after", after)):
        print(
            f"calibration {name} the ASHA run: 5x1 serial starts {statistics.mean(gaps_):.2f} s apart, ASHA "
            f"{SMALL_TRIALS} trials max_t {SMALL_MAX_T} on {slots} slots {small:.2f} s (start gaps mean "
            f"{statistics.mean(start_gaps(small_spans, slots)):.2f} s) -> alone: start concurrency c "
            f"{fit_c(statistics.mean(gaps_), small - fixed):.2f}"
        )
    print(
        f"calibration: 1x9 epochs {nine[-1] - nine[0]:.2f} s from the first report to the last, 1x1 {b:.2f} s "
        f"-> set-up F {fixed:.2f} s, trial start s {s:.2f} s, per-epoch overhead o {o:.3f} s, "
        f"start concurrency c {c:.2f}, start spread σ {sigma:.2f} (log-sd of the serial gaps)"
    )

    reached = [sum(1 for r in results if r.metrics.get("training_iteration", 0) >= m) for m in (1, 3, 9)]
    jct, promoted, jcts = simulate(args.trials, 9, Starts(s, o, c, sigma), qualities, SIGMA_SAMPLES)
    in_order, promoted_in_order, _ = simulate(args.trials, 9, Starts(s, o, c), qualities)
    jct_free, promoted_free, _ = simulate(args.trials, 9, Starts(s, o, None), qualities)
    predicted, predicted_free = fixed + jct, fixed + jct_free
    gaps = start_gaps(spans, slots)
    print(
        f"ASHA {args.trials} trials, eta 3, rungs 1/3/9 epochs of {epoch_s:g} s, {slots} slots: measured "
        f"{measured:.2f} s, predicted median {predicted:.2f} s (set-up {fixed:.2f} + simulated {jct:.2f}; "
        f"10-90% {fixed + np.quantile(jcts, 0.1):.2f}-{fixed + np.quantile(jcts, 0.9):.2f} s over "
        f"{SIGMA_SAMPLES} draws of the start spread); error {100 * (predicted - measured) / measured:+.1f}% "
        f"(target within 10%)"
    )
    print(
        f"trials reaching rungs 1/3/9: measured {reached}, predicted {promoted}; measured start gaps mean "
        f"{statistics.mean(gaps):.2f} s (min {min(gaps):.2f}, max {max(gaps):.2f})"
    )
    order = [int(np.flatnonzero(qualities == q)[0]) for _, _, q in spans]
    ahead = sum(1 for i, k in enumerate(order) if any(j < k for j in order[i + 1 :]))
    print(
        f"start order: {ahead} of {len(order)} trials started ahead of one queued before them (ASHA's "
        f"promotions depend on the order of reports); the simulator with every start alike (queue order): "
        f"{fixed + in_order:.2f} s, error {100 * (fixed + in_order - measured) / measured:+.1f}%, rungs "
        f"{promoted_in_order}"
    )
    for name, (gaps_, small, _) in (("before", before), ("after", after)):
        s_alone = statistics.mean(gaps_)
        alone = (
            fixed
            + simulate(
                args.trials, 9, Starts(s_alone, o, fit_c(s_alone, small - fixed), sigma), qualities, SIGMA_SAMPLES
            )[0]
        )
        print(
            f"calibrated {name} the run only: predicted {alone:.2f} s, error "
            f"{100 * (alone - measured) / measured:+.1f}%"
        )
    print(
        f"without start contention (start_concurrency None, the planning default): predicted "
        f"{predicted_free:.2f} s, error {100 * (predicted_free - measured) / measured:+.1f}%, rungs {promoted_free}"
    )


if __name__ == "__main__":
    main()
