"""Executor benchmark on the local backend: plan fidelity, resize overhead, elastic vs static cost.

    python bench/bench_executor.py [--quick] [--out DIR]

Every prediction comes from the real planner (``rubberband.planner.plan_job``) fitted on the
shipped, measured profiles; every run is a real local run (Ray nodes on this machine, torch DDP
in Ray actors, the real trial runtime) driven by the executor:

* fidelity — predicted (plan p50 JCT, mean cost) vs actual over several runs: the synthetic
  sleep-based workload with injected stragglers (``examples/quickstart_local.yaml``) at several
  deadlines, the real small torch workload (``examples/digits.yaml``) at two, and the two runs
  below; prints the median
  relative errors (target ≤ 5%).
* resize overhead — setup time of trials restarted from a checkpoint with a new worker count
  (stages ≥ 1, warm worker processes) versus first starts, from the journals (target ≤ 1 s).
* elastic vs static — the quickstart (27 one-epoch trials → 9 → 3 → 1 trained for 27 epochs, at its
  spec's deadline, 75 s) and a larger SHA job (``examples/sha_local.yaml``: 81 one-epoch trials → 27 →
  9 → 3 → 1 trained for 81 epochs, same workload and profile) at its spec's deadline (160 s, 1.1× the
  shortest the planner meets on a 2-core machine), each run for real twice: the elastic plan, and the
  best static plan the planner reports for the same deadline (``plan.baselines["static"]``, instances
  held to the end): actual cost ratio (target ≤ 0.7) and both JCTs. Both runs count as fidelity runs
  too (each against its own prediction).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from rubberband.catalog import load_catalog
from rubberband.cloud.local.provider import LocalProvider
from rubberband.executor import journal as J
from rubberband.executor.run import Executor, Job, Settings, Target
from rubberband.executor.runtime import TrialRuntime
from rubberband.inputs import load_job_inputs
from rubberband.planner import PlanOptions, plan_job

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart_local.yaml"
DIGITS = REPO / "examples" / "digits.yaml"
SHA = REPO / "examples" / "sha_local.yaml"


def run_once(spec, plan, run_dir: Path, *, elastic: bool = True) -> dict:
    # The deadline guard is relaxed so a run that is slower than predicted finishes and is measured.
    executor = Executor(
        Job(spec, plan, load_catalog(["local"])),
        Target(run_dir.name, run_dir, LocalProvider(run_dir), TrialRuntime.load()),
        Settings(deadline_s=3 * plan.deadline_s, elastic=elastic),
    )
    executor.run()
    return {"result": executor.result, "events": list(J.iter_events(run_dir / J.JOURNAL_NAME))}


def static_plan(plan):
    """The plan's best static baseline as an executable plan (same job, the baseline's stages)."""
    static = plan.baselines["static"]
    return plan.model_copy(
        update={"stages": static.stages, "predicted": static.predicted, "timeline": static.timeline or plan.timeline}
    )


def rel(actual: float, predicted: float) -> float:
    return abs(actual - predicted) / actual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer deadlines (5 runs)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default=None, help="run only the cases of this spec (e.g. quickstart_local)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    base = args.out or Path(tempfile.mkdtemp(prefix="rb-bench-executor-"))
    # Fixed deadlines, from loose to near the shortest the planner meets on this machine (a deadline of
    # None is the spec's own). Not 1.2× InfeasibleError.shortest_jct_s: on the local backend, where
    # nodes start one after another, that bound comes from the widest plan and is far from the shortest.
    cases = [(QUICKSTART, None), (QUICKSTART, "90s"), (DIGITS, None), (DIGITS, "45s"), (SHA, None)]
    if args.quick:
        cases = [(QUICKSTART, None), (DIGITS, None), (SHA, None)]
    if args.only:
        cases = [c for c in cases if c[0].stem == args.only]
    print(f"runs under {base}")
    rows, setups_resize, setups_first = [], [], []
    elastic_vs_static = []
    for i, (spec_path, deadline) in enumerate(cases):
        inputs = load_job_inputs(spec_path)
        spec, profile, catalog = inputs.spec, inputs.profile, inputs.catalog
        deadline_s = None
        if deadline is not None:
            from rubberband.units import parse_duration

            deadline_s = parse_duration(deadline)
        plan = plan_job(spec, profile, catalog, PlanOptions(deadline_s=deadline_s, samples=1000, seed=0))
        runs = [("elastic", plan)]
        if deadline is None and spec_path in (QUICKSTART, SHA):  # vs the best static plan, same deadline
            runs.append(("static", static_plan(plan)))
        actual_of = {}
        for kind, executed in runs:
            out = run_once(
                spec, executed, base / f"{'run' if kind == 'elastic' else 'static'}-{i}", elastic=kind == "elastic"
            )
            actual = actual_of[kind] = out["result"]["actual"]
            row = {
                "workload": spec.name,
                "plan": kind,
                "deadline_s": plan.deadline_s,
                "stages": [f"{s.instances}x{s.instance_type}/w{s.workers_per_trial}" for s in executed.stages],
                "jct_pred_s": executed.predicted.jct_s.p50,
                "jct_actual_s": actual["jct_s"],
                "cost_pred_usd": executed.predicted.cost_usd.mean,
                "cost_actual_usd": actual["cost_usd"],
            }
            rows.append(row)
            for e in out["events"]:
                if e["type"] == J.TRIAL_STOPPED and e.get("setup_s") is not None:
                    (setups_resize if e.get("stage", 0) > 0 else setups_first).append(e["setup_s"])
            print(
                f"{spec.name} ({kind}) deadline {plan.deadline_s:.0f}s {' '.join(row['stages'])}: JCT "
                f"{actual['jct_s']:.1f}s (pred {row['jct_pred_s']:.1f}s), cost ${actual['cost_usd']:.5f} "
                f"(pred ${row['cost_pred_usd']:.5f})",
                flush=True,
            )
        if "static" in actual_of:
            e_actual, s_actual = actual_of["elastic"], actual_of["static"]
            elastic_vs_static.append(
                {
                    "workload": spec.name,
                    "deadline_s": plan.deadline_s,
                    "elastic_cost_usd": e_actual["cost_usd"],
                    "static_cost_usd": s_actual["cost_usd"],
                    "elastic_jct_s": e_actual["jct_s"],
                    "static_jct_s": s_actual["jct_s"],
                    "ratio": e_actual["cost_usd"] / s_actual["cost_usd"],
                    "predicted_ratio": plan.predicted.cost_usd.mean / plan.baselines["static"].predicted.cost_usd.mean,
                    "static_stages": [
                        f"{s.instances}x{s.instance_type}/w{s.workers_per_trial}" for s in static_plan(plan).stages
                    ],
                }
            )
    figures = {
        "runs": len(rows),
        "median_rel_error_jct": statistics.median(rel(r["jct_actual_s"], r["jct_pred_s"]) for r in rows),
        "median_rel_error_cost": statistics.median(rel(r["cost_actual_usd"], r["cost_pred_usd"]) for r in rows),
        "resize_setup_s_median": statistics.median(setups_resize) if setups_resize else None,
        "first_start_setup_s_median": statistics.median(setups_first) if setups_first else None,
        "elastic_vs_static": elastic_vs_static,
        "rows": rows,
    }
    (base / "figures.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "rows"}, indent=2))
    print(
        f"fidelity over {len(rows)} runs: median |error| JCT {figures['median_rel_error_jct']:.1%}, cost "
        f"{figures['median_rel_error_cost']:.1%} (target ≤ 5%)"
    )
    if setups_resize:
        print(
            f"resize overhead (restart from checkpoint with a new worker count): median "
            f"{figures['resize_setup_s_median']:.3f}s (target ≤ 1 s); first starts "
            f"{figures['first_start_setup_s_median']:.3f}s"
        )
    for pair in elastic_vs_static:
        print(
            f"elastic / static actual cost ({pair['workload']}, deadline "
            f"{pair['deadline_s']:.0f}s): {pair['ratio']:.2f} (predicted "
            f"{pair['predicted_ratio']:.2f}; target ≤ 0.7); JCT elastic "
            f"{pair['elastic_jct_s']:.1f}s, static {pair['static_jct_s']:.1f}s"
        )


if __name__ == "__main__":
    main()
