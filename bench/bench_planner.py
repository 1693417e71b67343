"""Planner benchmarks: planning time, gap to the exact optimum, savings over static, work bound.

    python bench/bench_planner.py [--quick]

Prints figures and ratios (no assertions). Targets: SHA n=81 η=3 with 3 instance types and 1000
samples plans in ≤ 1 s; Hyperband R=81 η=3 in ≤ 5 s; plan cost / exact optimum ≤ 1.01 on small
cases; best static / plan ≥ 2 at 1.2× the shortest feasible JCT on the quickstart, never < 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import plan_stages
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import hyperband_brackets, sha_stages
from rubberband.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_TYPES = ("p3.2xlarge", "g4dn.xlarge", "g5.xlarge")


def shortest_jct(stages, model, types, *, confidence, max_workers, samples=1000) -> float:
    try:
        plan_stages(stages, model, types, deadline_s=1.0, confidence=confidence, samples=samples,
                    max_workers_per_trial=max_workers)
    except InfeasibleError as exc:
        return exc.shortest_jct_s
    raise RuntimeError("a 1-second deadline was feasible")


def timed(stages, model, types, deadline, *, confidence=0.95, max_workers=1, samples=1000, repeat=3):
    times, cpu, out = [], [], None
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        out = plan_stages(stages, model, types, deadline_s=deadline, confidence=confidence, samples=samples,
                          max_workers_per_trial=max_workers)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return min(times), statistics.median(times), min(cpu), out


def work_lower_bound(stages, model, types, max_workers) -> float:
    """Σ trial-epochs × the cheapest $ per epoch of any (type, width): no idle, no start-up."""
    best = float("inf")
    for t in types:
        for w in sorted({1, 2, 4, 8, t.workers}):
            if w > max_workers:
                continue
            nodes = 1 if w <= t.workers else -(-w // t.workers)
            per_epoch = model.epoch_time(t.device, w, nodes) * t.price_hr / 3600 * w / t.workers
            best = min(best, per_epoch)
    return sum(s.trials * s.epochs_this_stage for s in stages) * best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and cases")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    model = fit_performance_model(load_profile(ROOT / "examples/profiles/resnet50_cifar10_v100.json"))
    catalog = load_catalog(["aws"])
    types = [catalog.find(n) for n in QUICKSTART_TYPES]

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs inflate wall times)")
    print("== planning time (1000 samples, 3 instance types: " + ", ".join(QUICKSTART_TYPES) + ")")
    sha = sha_stages(81, 3, 1, 27)
    j_sha = shortest_jct(sha, model, types, confidence=0.95, max_workers=1)
    for factor in (1.2, 2.0):
        best, med, cpu, out = timed(sha, model, types, j_sha * factor, repeat=repeat)
        print(f"SHA n=81 eta=3 r=1 R=27, deadline {factor}x shortest: wall best {best:.2f} s, median {med:.2f} s, "
              f"CPU {cpu:.2f} s (target <= 1 s), {out.candidates_evaluated} candidates")
    hb = [s for b in hyperband_brackets(3, 1, 81) for s in b]
    j_hb = shortest_jct(hb, model, types, confidence=0.95, max_workers=1)
    best, med, cpu, out = timed(hb, model, types, j_hb * 1.5, repeat=repeat)
    print(f"Hyperband R=81 eta=3 ({len(hb)} stages), deadline 1.5x shortest: wall best {best:.2f} s, median "
          f"{med:.2f} s, CPU {cpu:.2f} s (target <= 5 s), {out.candidates_evaluated} candidates")

    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs

    mixed = load_job_inputs(ROOT / "examples/mixed.yaml")
    started, cpu0 = time.perf_counter(), time.process_time()
    plan = plan_from_inputs(mixed)
    print(f"examples/mixed.yaml (Hyperband R=27 eta=3, aws + gcp catalogs): wall "
          f"{time.perf_counter() - started:.2f} s, CPU {time.process_time() - cpu0:.2f} s, "
          f"{plan.planner.candidates_evaluated} candidates")

    print("\n== plan cost / exact optimum (small cases, 3 types, <= 2 workers/trial, 300 samples)")
    small_types = [catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge", "p3.8xlarge")]
    ratios = []
    cases = [(9, 3, 9), (12, 3, 16), (27, 3, 9), (18, 3, 6), (8, 2, 8)] if not args.quick else [(9, 3, 9), (27, 3, 9)]
    for n, eta, big_r in cases:
        stages = sha_stages(n, eta, 1, big_r)
        j = shortest_jct(stages, model, small_types, confidence=0.9, max_workers=2, samples=300)
        for factor in (1.2, 1.5, 2.0):
            out = plan_stages(stages, model, small_types, deadline_s=j * factor, confidence=0.9, samples=300,
                              max_workers_per_trial=2, include_exact=True)
            ratio = out.result.cost_mean / out.exact[1].cost_mean
            ratios.append(ratio)
            print(f"SHA n={n} eta={eta} R={big_r} deadline {factor}x: plan ${out.result.cost_mean:.3f} exact "
                  f"${out.exact[1].cost_mean:.3f} ratio {ratio:.3f} (exact: {out.exact_note})")
    print(f"cases {len(ratios)}: mean ratio {statistics.mean(ratios):.3f}, max {max(ratios):.3f} (target <= 1.01); "
          f"within 1.01: {sum(r <= 1.01 for r in ratios)}/{len(ratios)}")

    print("\n== best static / plan and plan / work lower bound (quickstart: SHA n=81, 3 types, 1 worker/trial)")
    bound = work_lower_bound(sha, model, types, 1)
    for factor in (1.2, 1.5, 2.0):
        out = plan_stages(sha, model, types, deadline_s=j_sha * factor, confidence=0.95, samples=1000,
                          max_workers_per_trial=1)
        static = out.static[1].cost_mean if out.static else float("nan")
        print(f"deadline {factor}x shortest ({j_sha * factor:.0f} s): plan ${out.result.cost_mean:.2f}, static "
              f"${static:.2f}, static/plan {static / out.result.cost_mean:.2f}x, plan/work bound "
              f"{out.result.cost_mean / bound:.2f} (bound ${bound:.2f})")


if __name__ == "__main__":
    main()
