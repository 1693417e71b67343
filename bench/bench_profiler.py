"""Leave-one-out accuracy of the profiled performance model, and the measured resize overhead.

For each workload (examples/digits.yaml, examples/synthetic.yaml): profile at the training worker
counts (default 1 and 2, one local node), fit the planner's performance model from that profile,
predict the iteration latency at a held-out worker count (default 3), then measure that count
for real and print the relative error (target: within 10%). Also prints the resize overhead the
profiler measured: checkpoint → restart with another worker count, with warm worker processes
(WorkerPool) and with fresh ones.

    python bench/bench_profiler.py [--workloads digits,synthetic] [--train 1,2] [--held-out 3]
                                   [--iterations 40] [--instance-type local.cpu4]

``--budget-check S`` also profiles a long epoch (synthetic, 20 000 iterations, ``--iterations 20000``) within an
``S``-second budget and prints the time the profiler took against it (target: ≤ 1.1×; iterations capped).

Needs the planner's ``rubberband.planner.model``; without it the prediction falls back to a
two-point linear extrapolation, printed as such. Figures vary with machine load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def steady_median(latencies: list[float]) -> float:
    """Median latency without warm-up (the first 10%, as the planner's model drops them)."""
    values = np.asarray(latencies, dtype=float)
    if len(values) >= 5:
        values = values[max(1, len(values) // 10) :]
    return float(np.median(values))


def predict(profile, device: str, workers: int) -> tuple[float, str]:
    try:
        from rubberband.planner.model import fit_performance_model
    except ImportError:
        points = sorted(
            (m.workers, steady_median(m.iteration_latencies_s)) for m in profile.measurements if m.nodes == 1
        )
        (w0, t0), (w1, t1) = points[0], points[-1]
        slope = (t1 - t0) / (w1 - w0) if w1 != w0 else 0.0
        return t0 + slope * (workers - w0), "linear baseline (planner model not installed)"
    model = fit_performance_model(profile)
    return float(model.iteration_time(device, workers, 1)), "planner performance model"


def bench(workload: str, args: argparse.Namespace) -> dict:
    from rubberband.catalog import load_catalog
    from rubberband.profiler.measured import ProfileOptions
    from rubberband.profiler.runner import run_profile
    from rubberband.spec import load_spec

    spec = load_spec(REPO / "examples" / f"{workload}.yaml")
    itype = load_catalog(["local"]).find(args.instance_type, cloud="local")
    train = tuple(int(w) for w in args.train.split(","))
    fit_run = run_profile(
        spec,
        ProfileOptions(
            cloud="local",
            instance_type=itype,
            workers=train,
            budget_s=args.budget,
            iterations=args.iterations,
            cross_node=False,
            measure_restart=True,
        ),
    )
    held_run = run_profile(
        spec,
        ProfileOptions(
            cloud="local",
            instance_type=itype,
            workers=(args.held_out,),
            budget_s=args.budget,
            iterations=args.iterations,
            cross_node=False,
            measure_restart=False,
        ),
    )
    profile = fit_run.profile
    device = profile.measurements[0].device
    predicted, how = predict(profile, device, args.held_out)
    measured = steady_median(held_run.profile.measurements[0].iteration_latencies_s)
    return {
        "workload": workload,
        "train": train,
        "predicted": predicted,
        "measured": measured,
        "how": how,
        "error": (predicted - measured) / measured,
        "fitted_points": {m.workers: steady_median(m.iteration_latencies_s) for m in profile.measurements},
        "restart_warm": profile.workload.restart_overhead_s,
        "restart_cold": profile.workload.restart_overhead_cold_s,
        "restart_how": profile.sources.get("restart_overhead_s", ""),
    }


def budget_check(budget_s: float, instance_type: str) -> None:
    """A long epoch profiled within ``budget_s``: the time the profiler took (its start-up samples to its last
    measurement) against the budget, and which shapes it capped."""
    import time

    import yaml

    from rubberband.catalog import load_catalog
    from rubberband.profiler.measured import ProfileOptions
    from rubberband.profiler.runner import run_profile
    from rubberband.spec import parse_spec

    data = yaml.safe_load((REPO / "examples" / "synthetic.yaml").read_text())
    data.setdefault("config", {})["dataset_size"] = 640000
    spec = parse_spec(data, base_dir=REPO / "examples")
    itype = load_catalog(["local"]).find(instance_type, cloud="local")
    began = time.monotonic()
    run = run_profile(
        spec,
        ProfileOptions(
            cloud="local",
            instance_type=itype,
            workers=(1, 2),
            budget_s=budget_s,
            iterations=20000,
            configs=1,
            cross_node=False,
        ),
    )
    wall = time.monotonic() - began
    capped = [n for n in run.notes if "capped at" in n]
    print(f"\nBudget kept: a {budget_s:.0f} s budget, 20 000 iterations per epoch asked (synthetic, {instance_type})")
    print(f"profiler took {run.wall_s:.1f} s = {run.wall_s / budget_s:.2f}× the budget (target ≤ 1.10×); ", end="")
    print(f"the command {wall:.1f} s with its cluster's start and teardown")
    for note in capped:
        print(f"  {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="digits,synthetic")
    parser.add_argument("--train", default="1,2", help="worker counts to profile and fit")
    parser.add_argument("--held-out", type=int, default=3, help="worker count to predict and measure")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per profile run")
    parser.add_argument("--instance-type", default="local.cpu4")
    parser.add_argument("--budget-check", type=float, default=0.0, help="also check a long epoch's budget (seconds)")
    args = parser.parse_args(argv)
    if args.budget_check > 0:
        budget_check(args.budget_check, "local.cpu2")
    rows = [bench(w.strip(), args) for w in args.workloads.split(",") if w.strip()]
    if not rows:  # --workloads '': the budget check alone
        return 0
    print(f"\nLeave-one-out: fit on {args.train} workers, predict {args.held_out} (one {args.instance_type} node)")
    print(f"{'workload':<10} {'fitted medians (ms)':<28} {'predicted ms':>12} {'measured ms':>12} {'error':>8}  model")
    for r in rows:
        pts = ", ".join(f"{w}w {t * 1e3:.1f}" for w, t in sorted(r["fitted_points"].items()))
        print(
            f"{r['workload']:<10} {pts:<28} {r['predicted'] * 1e3:>12.2f} {r['measured'] * 1e3:>12.2f} "
            f"{r['error']:>+8.1%}  {r['how']}"
        )
    print("\nResize overhead (checkpoint → restart at another worker count → first iteration):")
    for r in rows:
        cold = f"{r['restart_cold']:.2f} s" if r["restart_cold"] is not None else "n/a"
        print(
            f"{r['workload']:<10} warm workers {r['restart_warm']:.3f} s   fresh workers {cold}   "
            f"ratio fresh/warm {((r['restart_cold'] or 0) / max(r['restart_warm'], 1e-9)):.0f}×"
        )
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nworst leave-one-out error {worst:.1%} (target ≤ 10%)")
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    print(f"machine: {cores} cores, load average {load:.1f}")
    if args.held_out > cores or load > cores:
        print(
            "caution: the held-out count (or the load) exceeds this machine's cores, so CPU-bound workloads "
            "measure contention there, not the workload's scaling"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
