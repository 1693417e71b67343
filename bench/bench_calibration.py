"""Calibration of P(meet deadline): plans made from a real profile, replayed under the TRUE noise.

For each workload (examples/synthetic.py with known per-iteration, per-epoch and per-configuration
variance):

1. profile it with the real profiler (``rubberband profile``, a short budget, local Ray nodes);
2. plan it with the fitted model at p ∈ {0.5, 0.9, 0.99} and at deadlines from the shortest the
   planner calls feasible at that p to 2× it;
3. replay each plan ``--replays`` times (≥ 500) in the simulator under the TRUE noise: per-epoch σ
   and configuration-speed σ as configured in the workload, never the fitted ones;
4. print the realized hit rate per cell; a cell passes when it is ≥ p − 0.02.

The truth's deterministic part (iteration latencies, overheads, start-up) is the fitted model's,
with what is known to be noise in it divided out: the profiled configuration's own speed factor
(``synthetic.config_speed``) and the epoch factors of the passes that timed its iterations
(``synthetic.epoch_factor``). So this bench measures the noise model's calibration, not the
latency fit's accuracy (``bench_profiler.py`` does that). Its straggler σ is the workload's
per-iteration σ, applied as the simulator applies stragglers.

``--real N`` then profiles the first workload again as a user would (start-up sampling on: the nodes'
start-ups are measured) and runs it N times for real (local backend, ``--overrun none``: a late
run finishes, so its JCT and cost are measured) at 1.05× the
planner's shortest feasible deadline at p = 0.9 and prints the realized hit rate and the median
|predicted − actual| of JCT and cost. Real figures depend on machine load; say how loaded it was.

    python bench/bench_calibration.py [--budget 180] [--replays 2000] [--profiles DIR] [--real 10]
                                      [--without-variation]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "bench"))

import synthetic  # noqa: E402  (the workload whose truth is known)
from bench_sim_vs_local import cli_run  # noqa: E402  (`rubberband run SPEC --plan PLAN ...`, shared)

PS = (0.5, 0.9, 0.99)
FACTORS = (1.0, 1.1, 1.25, 1.5, 2.0)
TOLERANCE = 0.02

#: name → config overrides of examples/synthetic.py (σs are the truth).
WORKLOADS = {
    "mixed": {"straggler_sigma": 0.05, "epoch_sigma": 0.1, "config_speed_sigma": 0.2},
    "epoch-heavy": {"straggler_sigma": 0.03, "epoch_sigma": 0.25, "config_speed_sigma": 0.05},
    "config-heavy": {"straggler_sigma": 0.03, "epoch_sigma": 0.03, "config_speed_sigma": 0.35},
}


def spec_for(
    name: str, overrides: dict, workdir: Path, *, profile_name: str = "profile.json", spec_name: str = "spec.yaml"
) -> Path:
    """A SHA job on the synthetic workload with ``overrides``, planned from ``profile_name``; returns the
    spec path."""
    spec = {
        "name": f"calib-{name}",
        "train": "synthetic:train",
        "metric": {"name": "score", "mode": "max"},
        "search_space": {"lr": {"type": "loguniform", "low": 0.0001, "high": 1.0}},
        "config": {
            "best_lr": 0.01,
            "iteration_s": 0.02,
            "sync_s": 0.002,
            "dataset_size": 640,
            "batch_size": 32,
            "decay": 0.05,
            **overrides,
        },
        "scheduler": {"kind": "sha", "trials": 27, "eta": 3, "min_epochs": 1, "max_epochs": 9},
        "deadline": "10m",
        "confidence": 0.9,
        "resources": {"clouds": ["local"], "instance_types": ["local.cpu1", "local.cpu2"], "max_workers_per_trial": 2},
        "profile": profile_name,
    }
    (workdir / "synthetic.py").write_text((REPO / "examples" / "synthetic.py").read_text())
    path = workdir / spec_name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def profile(
    spec_path: Path, budget_s: float, *, out: str = "profile.json", startup_samples: int = 0, configs: int | None = None
) -> float:
    """Run the real profiler; returns its wall seconds. The calibration cells need no measured start-up (the
    truth they replay under has the profile's own); the real runs do, as a user's plan would. ``configs``: how many
    configurations to time (None: the profiler's default)."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "profile",
            str(spec_path),
            "--workers",
            "1,2",
            "--budget",
            f"{budget_s:.0f}s",
            "--startup-samples",
            str(startup_samples),
            *(["--configs", str(configs)] if configs else []),
            "--out",
            str(spec_path.parent / out),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"profiling {spec_path} failed: {done.stderr.strip()[-500:]}")
    return time.monotonic() - started


def truth_model(fitted, prof, overrides: dict):
    """The fitted model with the profiled configuration's known noise divided out and the TRUE variation."""
    from rubberband.planner.noise import Variation

    config = json.loads(prof.sources["config"])
    s_ref = synthetic.config_speed(config)
    # the w=1 shape's iterations were timed over two passes with known epoch factors
    trial = "profile-w1-n1"
    e_ref = math.exp(np.mean([math.log(synthetic.epoch_factor(config, trial, e)) for e in (0, 1)]))
    truth = Variation(
        epoch_sigma=overrides["epoch_sigma"],
        config_sigma=overrides["config_speed_sigma"],
        config_log_mean=-math.log(s_ref * e_ref),
        source="truth",
    )
    return dataclasses.replace(fitted, variation=truth, straggler_sigma=overrides["straggler_sigma"]), s_ref, e_ref


def shortest(inputs, p: float) -> float:
    from rubberband.errors import InfeasibleError
    from rubberband.planning import plan_from_inputs

    try:
        plan_from_inputs(inputs, deadline_s=1.0, confidence=p)
    except InfeasibleError as exc:
        return float(exc.shortest_jct_s)
    return 1.0


def calibrate(name: str, overrides: dict, workdir: Path, args) -> list[dict]:
    from rubberband.inputs import load_job_inputs
    from rubberband.planner.plan_record import configs_of, heads_of
    from rubberband.planner.model import fit_performance_model
    from rubberband.planner.simulator import SimSettings, Simulator
    from rubberband.planning import plan_from_inputs

    spec_path = spec_for(name, overrides, workdir)
    wall = None
    if not (workdir / "profile.json").exists():
        wall = profile(spec_path, args.budget)
    inputs = load_job_inputs(spec_path)
    if args.without_variation:  # ablation: plan as a v1 profile would (no per-epoch / per-configuration fit)
        inputs = dataclasses.replace(inputs, profile=inputs.profile.model_copy(update={"epoch_measurements": []}))
    fitted = fit_performance_model(inputs.profile)
    truth, s_ref, e_ref = truth_model(fitted, inputs.profile, overrides)
    v = fitted.variation
    print(
        f"\n== {name}: true σ per-iteration {overrides['straggler_sigma']}, per-epoch {overrides['epoch_sigma']}, "
        f"config {overrides['config_speed_sigma']}"
        + (f"; profiled in {wall:.0f} s (budget {args.budget:.0f} s)" if wall else f"; profile {workdir}")
    )
    print(
        f"fitted: straggler σ {fitted.straggler_sigma:.3f}; per-epoch σ {v.epoch_sigma_fit:.3f} (planned "
        f"{v.epoch_sigma:.3f}); config σ {v.config_sigma_fit:.3f} (planned {v.config_sigma:.3f}), log-mean "
        f"{v.config_log_mean:+.3f} (truth {-math.log(s_ref * e_ref):+.3f}); {v.configs} configs, {v.epochs} epochs"
    )
    print(f"{'p':>5} {'deadline':>9} {'x':>5} {'P(meet) planned':>16} {'realized':>9} {'ok':>3}  plan")
    rows = []
    for p in PS:
        base = shortest(inputs, p)
        for factor in FACTORS:
            deadline = base * factor
            plan = plan_from_inputs(inputs, deadline_s=deadline, confidence=p)
            stages, configs = configs_of(plan, inputs.catalog)
            replay = Simulator(stages, truth, SimSettings(samples=args.replays, seed=args.seed, heads=heads_of(plan)))
            hit = replay.simulate(configs).p_meet(deadline)
            ok = hit >= p - TOLERANCE
            rows.append(
                {
                    "workload": name,
                    "p": p,
                    "deadline_s": deadline,
                    "factor": factor,
                    "planned": plan.predicted.p_meet_deadline,
                    "realized": hit,
                    "ok": ok,
                }
            )
            where = " | ".join(f"{s.instances}×{s.instance_type} w{s.workers_per_trial}" for s in plan.stages)
            print(
                f"{p:5.2f} {deadline:8.1f}s {factor:5.2f} {plan.predicted.p_meet_deadline:16.3f} {hit:9.3f} "
                f"{'ok' if ok else 'NO':>3}  {where}"
            )
    return rows


def real_runs(name: str, overrides: dict, workdir: Path, n: int, args) -> None:
    """N real runs, each with its own sampled configurations (spec seed k), planned for them at 1.05× the
    shortest feasible deadline at p = 0.9: so the runs are independent draws of what P(meet) promises
    (per-configuration speed included), not N replays of one set of 27 configurations."""
    import yaml

    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs
    from rubberband.plan import write_plan

    # Planned as a user would plan it: from a profile with measured local node start-ups, which the
    # calibration cells' profile leaves out.
    base = spec_for(name, overrides, workdir, profile_name="profile-real.json", spec_name="spec-real.yaml")
    if not (workdir / "profile-real.json").exists():
        wall = profile(base, args.budget, out="profile-real.json", startup_samples=3)
        print(f"\nprofiled for the real runs in {wall:.0f} s (budget {args.budget:.0f} s, 3 start-up samples)")
    startup = load_job_inputs(base).profile.startup
    print(
        f"\n== real runs of {name}, each with its own configurations (spec seed = run number), at 1.05× the "
        f"shortest feasible deadline at p = 0.9; start-up in the profile: "
        + "; ".join(f"{s.cloud} {s.source} {np.median(s.samples_s):.1f} s" for s in startup)
        + f"; load average at start {os.getloadavg()[0]:.1f}"
    )
    rows = []
    runs = Path(tempfile.mkdtemp(prefix="real-", dir=workdir))  # fresh run directories every time
    for k in range(n):
        spec = yaml.safe_load(base.read_text())
        spec["seed"] = k + 1
        spec_path = workdir / f"spec-real-{k}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        inputs = load_job_inputs(spec_path)
        deadline = 1.05 * shortest(inputs, 0.9)
        plan = plan_from_inputs(inputs, deadline_s=deadline, confidence=0.9)
        plan_path = runs / f"plan-{k}.json"
        write_plan(plan, plan_path)
        run_dir = runs / f"run-{k}"
        result, wall, code, tail = cli_run(spec_path, plan_path, run_dir)
        if code == 2 or result is None:
            print(f"run {k}: no result.json: {tail[-300:]}")
            continue
        row = {
            "deadline": deadline,
            "p_meet": plan.predicted.p_meet_deadline,
            "pred_jct": float(result["predicted"]["jct_s"]),  # from the command, as the actual JCT counts
            "pred_cost": plan.predicted.cost_usd.mean,
            "jct": float(result["actual"]["jct_s"]),
            "cost": float(result["actual"]["cost_usd"]),
            "met": bool(result.get("met_deadline")),
            "wall": wall,
        }
        rows.append(row)
        print(
            f"run {k}: deadline {deadline:.1f} s, predicted JCT p50 {row['pred_jct']:.1f} s, cost "
            f"${row['pred_cost']:.6f}, P(meet) {row['p_meet']:.3f} | exit {code}, JCT {row['jct']:.1f} s "
            f"(command {wall:.1f} s), cost ${row['cost']:.6f}, {'met' if row['met'] else 'LATE'}; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
    if rows:

        def col(key: str) -> np.ndarray:
            return np.asarray([r[key] for r in rows], dtype=float)

        dj = np.abs(col("jct") - col("pred_jct")) / col("pred_jct")
        dc = np.abs(col("cost") - col("pred_cost")) / col("pred_cost")
        print(
            f"realized hit rate {np.mean(col('met')):.2f} over {len(rows)} runs (planned P(meet) mean "
            f"{np.mean(col('p_meet')):.3f}); median |pred − actual| / pred: JCT {np.median(dj):.1%}, cost "
            f"{np.median(dc):.1%}; actual / predicted, median: JCT {np.median(col('jct') / col('pred_jct')):.3f}, "
            f"cost {np.median(col('cost') / col('pred_cost')):.3f}; command wall median {np.median(col('wall')):.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=180.0, help="profiling budget per workload, seconds")
    parser.add_argument("--replays", type=int, default=2000, help="replays of each plan under the true noise")
    parser.add_argument("--seed", type=int, default=20261124, help="seed of the replays (not the planner's)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--profiles", default=None, help="keep/reuse profiles in this folder (one per workload)")
    parser.add_argument("--real", type=int, default=0, help="real local runs of the first workload")
    parser.add_argument(
        "--without-variation",
        action="store_true",
        help="ablation: plan without the per-epoch / per-configuration fit (as from a v1 profile)",
    )
    args = parser.parse_args()
    if args.replays < 500:
        raise SystemExit("--replays must be at least 500")
    root = Path(args.profiles) if args.profiles else Path(tempfile.mkdtemp(prefix="rb-calib-"))
    rows = []
    names = args.workloads.split(",")
    for name in names:
        workdir = root / name
        workdir.mkdir(parents=True, exist_ok=True)
        rows += calibrate(name, WORKLOADS[name], workdir, args)
    failed = [r for r in rows if not r["ok"]]
    print(
        f"\ncells {len(rows)}: {len(rows) - len(failed)} with realized hit rate ≥ p − {TOLERANCE}"
        + "".join(f"\n  FAILED {r['workload']} p={r['p']} {r['factor']}×: {r['realized']:.3f}" for r in failed)
    )
    if args.real:
        real_runs(names[0], WORKLOADS[names[0]], root / names[0], args.real, args)


if __name__ == "__main__":
    main()
