"""Predictions against real runs, where configurations differ in speed (issue 30, items 1 and 3).

Three workloads of ``examples/synthetic.py`` (a sleep workload whose truth is set by its config): 27 trials cut to
9 and 3 (η 3, 1 → 9 epochs), configurations differing ≥ 5× in speed (log σ 0.6: 5 %–95 % of configurations
0.37–2.7× the median), and the speed either independent of quality (ρ 0), going with it (ρ 0.8: the better
configurations are slower, as bigger models are) or against it (ρ −0.6). Each workload is profiled once for real
(``rubberband profile --configs 8``, so the planner fits the speed–quality correlation), then run for real
``--runs`` times (local backend, Ray nodes on this machine; ``--overrun none``: a late run finishes, so its JCT
is measured), each with its own configurations (spec seed: the run number, plus 1000 per workload; see
:func:`seed_base`) and planned at 1.1, 1.2 or 1.3× the
planner's shortest feasible deadline at p = 0.9, in turn.

Per run: the plan's P(meet), JCT p50 and p95, the actual JCT (from the executor's start) and whether it met the
deadline; the last boundary's re-plan prediction of the last stage against its duration; and a **replay of the
run's own trials**: the same plan simulated with every trial at the speed the run's journal measured (its epochs'
seconds, in the order its promotions put them; ``executor/survivors.bracket_history``). The replay's truth is
real, the recorded epoch times, so ``actual / replay`` isolates the model's form (start-ups, overheads,
scheduling) from the population model (``replay / predicted``: which configurations came and who survived).

Summary: realized hit rate against the planned P(meet), median |actual − p50| / p50, median |last stage −
boundary prediction| / actual, and the medians of actual / replay and replay / predicted. Beside the centre error,
what a perfectly calibrated prediction would score (``own spread``: the median over runs of the median
|JCT − p50| / p50 of each run's own predicted distribution; a run's configurations are drawn at random and their
speeds are unknown before it runs, so no prediction of one run can be closer than that on average) and the share
of runs that ended before their p50 (``below p50``: 0.5 for a centred prediction).

    python bench/bench_real_runs.py [--runs 7] [--budget 150] [--workdir DIR] [--calibrate 2]

``--calibrate N``: after profiling, N more real runs per workload (not counted) are folded into its profile with
``rubberband profile --from-run`` before the counted runs are planned. About 25 minutes on an idle 2-core machine
(three profiles of ~1 min, 21 runs of ~35 s; 6 more runs with ``--calibrate 2``).

Last measured (idle 2-core machine; docs/simulator.md, Calibration, has the table): as profiled, 13 of 21 met
their deadline at a promised 0.95, median |JCT − p50| / p50 20.1 %; with ``--calibrate 2``, 21 of 21 and 12.2 %.
Again with ``--calibrate 2`` and the own-spread column (stop 39, before the first stage's dispatch order was fixed):

    workload     runs   hit  P(meet)  |JCT−p50|/p50  own spread  below p50  last stage err  actual/replay  replay/pred
    independent     7  0.86     0.94           7.0%        6.0%       0.57            4.2%          1.017        0.955
    slow-better     7  0.86     0.94          16.0%        7.5%       0.00            5.6%          1.039        1.119
    fast-better     7  1.00     0.94           7.7%        4.2%       0.71            6.9%          0.982        0.931
    all            21  0.90     0.94          11.7%        6.0%       0.43            5.9%          1.017        1.021

Where slow configurations score best every run ended past its p50, and the run's own trials replayed 12 % above
the prediction: the survivors ran slower than the model's population gives (the first-stage dispatch order, since
fixed, explains 1-2 % of it). The other two workloads were within the 8 % target. Per stage, the 1-worker trials
ran 8 % faster than planned and the 2-worker trials on one local.cpu2 node 11 % slower: the profile was taken on
local.cpu1 (the spec's first type), so a 2-worker trial on one node was never measured. With the profiler's new
default type (the narrowest that holds the widest allowed trial on one node: local.cpu2) and the dispatch order
fixed, fresh profiles, same machine:

    workload     runs   hit  P(meet)  |JCT−p50|/p50  own spread  below p50  last stage err  actual/replay  replay/pred
    independent     7  0.86     0.93          11.5%        6.5%       0.57            1.2%          1.060        0.874
    slow-better     7  1.00     0.93          10.1%        8.6%       0.00            1.9%          1.044        1.042
    fast-better     7  1.00     0.94          10.5%        4.2%       0.86            2.2%          1.000        0.869
    all            21  0.95     0.93          10.7%        6.5%       0.48            1.7%          1.048        0.994

Those three profiles fitted the population from 8 configurations each: their mean speed was off by +0.17,
−0.05 and +0.25 in log (the standard error of 8 draws at σ 0.6 is 0.21), ρ +0.50 where the truth is 0, and
the prediction carried none of that uncertainty (each trial's σ was widened instead, which 27 trials average
away). Now each sample draws the population's mean once (``config_mean_se``), ``profile --from-run`` folds
the calibration runs' 54 first-stage trials in as configurations (62 in all: the mean known to ±6–8 %, ρ
fitted −0.04, +0.78 and −0.52), and each workload draws its own configurations (:func:`seed_base`; before,
the three shared seeds 1–7, so their 21 runs were 7 draws of configurations, and those 7 happened to promote
survivors slower than 99 % of such sets would). Fresh profiles, same machine:

    workload     runs   hit  P(meet)  |JCT−p50|/p50  own spread  below p50  last stage err  actual/replay  replay/pred
    independent     7  0.86     0.94           7.0%        5.0%       0.43            1.3%          1.019        1.046
    slow-better     7  1.00     0.94           6.3%        6.4%       0.29            3.6%          1.027        1.029
    fast-better     7  0.86     0.94           5.6%        5.8%       0.14            2.5%          1.051        1.016
    all            21  0.90     0.94           6.3%        6.0%       0.29            2.3%          1.031        1.020

The two late runs: independent's sixth (seed 6, as before) promoted a configuration 5.7× the median's epoch
time (2.9σ) to the last stage, +38 %; fast-better's third missed by 0.3 s (+13 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_calibration import profile, shortest, spec_for  # noqa: E402  (the synthetic job, the profiler, ...)
from bench_sim_vs_local import cli_run  # noqa: E402  (`rubberband run SPEC --plan PLAN ...`, shared)

#: name → synthetic.py config overrides (the truth).
WORKLOADS = {
    "independent": {"straggler_sigma": 0.03, "epoch_sigma": 0.05, "config_speed_sigma": 0.6},
    "slow-better": {
        "straggler_sigma": 0.03,
        "epoch_sigma": 0.05,
        "config_speed_sigma": 0.6,
        "speed_quality_rho": 0.8,
    },
    "fast-better": {
        "straggler_sigma": 0.03,
        "epoch_sigma": 0.05,
        "config_speed_sigma": 0.6,
        "speed_quality_rho": -0.6,
    },
}
FACTORS = (1.1, 1.2, 1.3)
P = 0.9


def seed_base(name: str) -> int:
    """The workload's first spec seed less one: 0, 1000, 2000, ... in WORKLOADS' order, so that no two workloads
    draw the same configurations (the synthetic job's speeds are seeded by the configuration: with shared seeds
    the three workloads' runs drew the same learning rates and the same own speed draws, 7 draws, not 21)."""
    return 1000 * list(WORKLOADS).index(name)


def last_stage(run_dir: Path) -> tuple[float | None, float | None]:
    """(the last boundary's prediction of the last stage, its actual duration) from a run's journal."""
    from rubberband.executor import journal as J

    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    finished = [e for e in events if e["type"] == J.STAGE_FINISHED]
    if not finished:
        return None, None
    last = max(e["stage"] for e in finished)
    started = [e for e in events if e["type"] == J.STAGE_STARTED and e["stage"] == last][-1]
    actual = [e for e in finished if e["stage"] == last][-1]["t"] - started["t"]
    decisions = [e for e in events if e.get("kind") == "replan" and e["stage"] == last]
    if not decisions:
        return None, actual
    d = decisions[-1]
    predicted = d.get("proposal_jct_p50_s") if d.get("accepted") else d.get("current_jct_p50_s")
    return predicted, actual


def replay(inputs, run_dir: Path) -> float | None:
    """The median JCT of the plan the run followed (its re-plans taken) with the run's own trials at their measured
    speeds (None: nothing measured)."""
    from rubberband.executor import journal as J
    from rubberband.executor.runtime import known_trials
    from rubberband.executor.survivors import bracket_history
    from rubberband.planner.plan_record import configs_of, heads_of
    from rubberband.planner.model import fit_performance_model
    from rubberband.planner.simulator import SimSettings, Simulator

    from rubberband.plan import Plan

    state = J.read_state(run_dir)
    plan = Plan.model_validate(state.plan)
    spec = inputs.spec
    history = bracket_history(
        state,
        list(plan.stages),
        (spec.metric.name, spec.metric.mode),
        lambda s: inputs.catalog.find(s.instance_type, cloud=s.cloud, region=s.region),
    )
    model = fit_performance_model(inputs.profile)
    known = known_trials(model, history)
    if not known:
        return None
    stages, configs = configs_of(plan, inputs.catalog)
    settings = SimSettings(samples=500, seed=spec.seed, heads=heads_of(plan) or None, known_trials=known)
    return float(Simulator(stages, model, settings).simulate(configs).jct_quantile(0.5))


def calibrate(base: Path, workdir: Path, runs: int, first_seed: int) -> None:
    """``runs`` real runs (their own configurations: seeds ``first_seed``, +1, ...; planned at 1.2× the shortest feasible
    deadline, not counted), then ``rubberband profile --from-run`` each of them into the workload's profile."""
    from rubberband.inputs import load_job_inputs
    from rubberband.plan import write_plan
    from rubberband.planning import plan_from_inputs

    dirs = []
    for k in range(runs):
        spec = yaml.safe_load(base.read_text())
        spec["seed"] = first_seed + k
        spec_path = workdir / f"spec-cal-{k}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        inputs = load_job_inputs(spec_path)
        plan_path = workdir / f"plan-cal-{k}.json"
        write_plan(plan_from_inputs(inputs, deadline_s=1.2 * shortest(inputs, P), confidence=P), plan_path)
        run_dir = workdir / f"run-cal-{k}"
        result, _, _, tail = cli_run(spec_path, plan_path, run_dir)
        if result is None:
            raise SystemExit(f"calibration run {run_dir} failed: {tail[-300:]}")
        dirs.append(run_dir)
    args = [a for d in dirs for a in ("--from-run", str(d))]
    done = subprocess.run(
        [sys.executable, "-m", "rubberband", "profile", str(base), *args], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"profile --from-run failed: {done.stderr.strip()[-300:]}")
    print(done.stdout.strip())


def run_workload(name: str, overrides: dict, workdir: Path, args: argparse.Namespace) -> list[dict]:
    """Profile the workload (and calibrate its profile from ``args.calibrate`` runs), then ``args.runs`` runs."""
    from rubberband.inputs import load_job_inputs
    from rubberband.plan import write_plan
    from rubberband.planner.model import fit_performance_model
    from rubberband.planning import plan_from_inputs

    base = spec_for(name, overrides, workdir, profile_name="profile.json", spec_name="spec.yaml")
    if seed_base(name):  # the profiler's configurations are the base spec's seed's draws: the workload's own too
        base.write_text(yaml.safe_dump({**yaml.safe_load(base.read_text()), "seed": seed_base(name)}, sort_keys=False))
    if not (workdir / "profile.json").exists():
        wall = profile(base, args.budget, startup_samples=2, configs=8)
        print(f"profiled {name} in {wall:.0f} s (budget {args.budget:.0f} s, 8 configurations, 2 start-up samples)")
        if args.calibrate:
            calibrate(base, workdir, args.calibrate, seed_base(name) + 101)
    v = fit_performance_model(load_job_inputs(base).profile).variation
    print(
        f"\n== {name}: true config σ {overrides['config_speed_sigma']}, ρ {overrides.get('speed_quality_rho', 0.0)}; "
        f"fitted config σ {v.config_sigma_fit:.2f} (planned {v.config_sigma:.2f}) over {v.configs} configurations, "
        f"their mean ±{v.config_mean_se:.2f}; survivors: "
        f"{v.speed_quality_source}; load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    for k in range(args.runs):
        spec = yaml.safe_load(base.read_text())
        spec["seed"] = seed_base(name) + k + 1
        spec_path = workdir / f"spec-{k}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        inputs = load_job_inputs(spec_path)
        factor = FACTORS[k % len(FACTORS)]
        deadline = factor * shortest(inputs, P)
        plan = plan_from_inputs(inputs, deadline_s=deadline, confidence=P)
        plan_path = workdir / f"plan-{k}.json"
        write_plan(plan, plan_path)
        run_dir = workdir / f"run-{k}"
        result, wall, code, tail = cli_run(spec_path, plan_path, run_dir)
        if result is None:
            print(f"{name} run {k}: no result.json ({tail[-300:]})")
            continue
        boundary, stage_s = last_stage(run_dir)
        row = {
            "workload": name,
            "run": k,
            "factor": factor,
            "deadline": deadline,
            "p_meet": plan.predicted.p_meet_deadline,
            # from the command, as the user's deadline: the plan's prediction plus what went before the start
            "p50": float(result["predicted"]["jct_s"]),
            "p95": float(result["predicted"]["jct_p95_s"]),
            "jct": float(result["actual"]["jct_s"]),
            "before_start": float(result["actual"]["before_start_s"]),
            "met": bool(result.get("met_deadline")),
            "boundary": boundary,
            "last_stage": stage_s,
            "replay": replay(inputs, run_dir),
            "load": os.getloadavg()[0],
            # the prediction's own spread: median |JCT - p50| / p50 over its simulated samples (from the command)
            "own": own_spread(plan.predicted.jct_samples_s, float(result["actual"]["before_start_s"])),
        }
        rows.append(row)
        print(
            f"{name:<12} {k:>2} {factor:4.1f}× {deadline:6.1f}s P {row['p_meet']:.2f} p50 {row['p50']:5.1f} p95 "
            f"{row['p95']:5.1f} | JCT {row['jct']:5.1f} {'met ' if row['met'] else 'LATE'} "
            f"{(row['jct'] - row['p50']) / row['p50']:+6.1%} | last stage {_f(stage_s)} vs {_f(boundary)} | "
            f"replay {_f(row['replay'])} | load {row['load']:.1f}"
        )
    return rows


def own_spread(samples: list[float], before_start_s: float) -> float:
    """The median |JCT − p50| / p50 a run would show if it were one more draw of its own prediction (``samples``,
    the plan's simulated JCTs from the executor's start, shifted by what went before it): the centre error of a
    perfectly calibrated prediction, the floor the measured one is read against."""
    jct = np.asarray(samples) + before_start_s
    p50 = float(np.median(jct))
    return float(np.median(np.abs(jct - p50)) / p50)


def _f(x: float | None) -> str:
    return "  –  " if x is None else f"{x:5.1f}"


def summary(rows: list[dict]) -> None:
    def med(values) -> float:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    print(
        f"\n{'workload':<12} {'runs':>4} {'hit':>5} {'P(meet)':>8} {'|JCT−p50|/p50':>14} {'own spread':>11} "
        f"{'below p50':>10} {'last stage err':>15} {'actual/replay':>14} {'replay/pred':>12}"
    )
    groups = {name: [r for r in rows if r["workload"] == name] for name in dict.fromkeys(r["workload"] for r in rows)}
    groups["all"] = rows
    for name, rs in groups.items():
        if not rs:
            continue
        print(
            f"{name:<12} {len(rs):>4} {np.mean([r['met'] for r in rs]):>5.2f} {np.mean([r['p_meet'] for r in rs]):>8.2f} "
            f"{med(abs(r['jct'] - r['p50']) / r['p50'] for r in rs):>14.1%} "
            f"{med(r.get('own') for r in rs):>11.1%} {np.mean([r['jct'] < r['p50'] for r in rs]):>10.2f} "
            f"{med(abs(r['last_stage'] - r['boundary']) / r['last_stage'] if r['boundary'] else None for r in rs):>15.1%} "
            f"{med(r['jct'] / r['replay'] if r['replay'] else None for r in rs):>14.3f} "
            f"{med(r['replay'] / r['p50'] if r['replay'] else None for r in rs):>12.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="real runs per workload")
    parser.add_argument("--budget", type=float, default=150.0, help="profiling budget per workload, seconds")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--workdir", default=None, help="keep profiles and runs here (reused profiles)")
    parser.add_argument("--out", default=None, help="write the per-run rows here (JSON)")
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        help="real runs per workload folded into its profile (`rubberband profile --from-run`) before the runs "
        "measured (not counted)",
    )
    args = parser.parse_args()
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rb-real-"))
    rows: list[dict] = []
    for name in args.workloads.split(","):
        workdir = root / name
        workdir.mkdir(parents=True, exist_ok=True)
        rows += run_workload(name, WORKLOADS[name], workdir, args)
    summary(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
