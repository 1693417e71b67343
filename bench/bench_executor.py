"""Executor benchmark on the local backend: plan fidelity, resize overhead, elastic vs static cost.

    python bench/bench_executor.py [--runs 5] [--epoch-s 3.0] [--out DIR]

* fidelity — predicted (plan) vs actual JCT and cost over ``--runs`` runs of a 9-trial SHA job
  (η=3, 2 stages) on real local Ray nodes; prints the median relative errors (target ≤ 5%).
  With the planner installed (``rubberband.planner.plan_job``) and ``--profile`` given, the plan
  and its predictions come from the planner; otherwise from :func:`analytic_plan` below, a
  stand-in model (waves × (epoch time + trial setup) + instance startup) whose constants are
  measured by a first calibration run — say which one was used when quoting the figures.
* resize overhead — trial setup time (new workers + restore) of stage-1 starts (a resize from 1
  to 2 workers per trial) versus stage-0 starts, from the journal.
* elastic vs static — actual cost of the elastic plan (instances released as soon as idle,
  next-stage instances prefetched) over a static plan that holds its instances to the end
  (target ratio ≤ 0.7).

The trial runtime is ``rubberband.executor.trials`` when installed, else the tests' stand-in
(``tests/executor_helpers.py``); ``--runtime`` overrides.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from executor_helpers import make_plan, write_job  # noqa: E402

from rubberband.catalog import load_catalog  # noqa: E402
from rubberband.cloud.local import LocalProvider  # noqa: E402
from rubberband.executor import journal as J  # noqa: E402
from rubberband.executor.controller import Controller  # noqa: E402
from rubberband.executor.placement import waves  # noqa: E402
from rubberband.executor.runtime import TrialRuntime  # noqa: E402
from rubberband.spec import load_spec  # noqa: E402

# Elastic: wide for the 9-trial stage, one bigger instance for the 3 survivors (2 workers each).
# Static: the same stage-0 cluster held for the whole job (survivors use it with 2 workers each).
ELASTIC = [("local.cpu2", 3, 1), ("local.cpu4", 1, 2)]
STATIC = [("local.cpu2", 3, 1), ("local.cpu2", 3, 2)]
PRICES = {"local.cpu1": 0.05, "local.cpu2": 0.10, "local.cpu4": 0.20}
WORKERS = {"local.cpu1": 1, "local.cpu2": 2, "local.cpu4": 4}


def default_runtime() -> str:
    if importlib.util.find_spec("rubberband.executor.trials") is not None:
        return "rubberband.executor.trials"
    return "executor_helpers"


def run_once(spec, plan, directory: Path, runtime: str, *, elastic: bool = True) -> dict:
    run_dir = directory / "run"
    controller = Controller(spec=spec, plan=plan, catalog=load_catalog(["local"]), run_dir=run_dir,
                            backend=LocalProvider(run_dir), runtime=TrialRuntime.load(runtime),
                            run_id=directory.name, elastic=elastic)
    controller.run()
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    return {"result": controller.result, "events": events}


def calibrate(events: list[dict]) -> dict[str, float]:
    """Constants of the stand-in model, measured from one run's journal."""
    startup = [e["startup_s"] for e in events if e["type"] == J.INSTANCE_READY and "startup_s" in e]
    setup = [e["setup_s"] for e in events if e["type"] == J.TRIAL_STOPPED and e.get("setup_s") is not None]
    per_epoch = [e["seconds"] for e in events if e["type"] == J.EPOCH]
    started = next(e["t"] for e in events if e["type"] == J.RUN_STARTED)
    first_stage = next(e["t"] for e in events if e["type"] == J.STAGE_STARTED)
    return {"startup_s": statistics.median(startup), "setup_s": statistics.median(setup),
            "epoch_s": statistics.median(per_epoch), "head_s": first_stage - started}


def analytic_plan(spec, stages, k: dict[str, float]):
    """Stand-in predictions: waves × (setup + epochs × epoch time) per stage, plus instance startup."""
    plan = make_plan(spec, stages, prices=PRICES)
    durations, costs = [], []
    previous = None
    for s, (itype, n, w) in zip(plan.stages, stages):
        rounds = waves(s.trials, n, WORKERS[itype], w)
        duration = rounds * (k["setup_s"] + s.epochs_this_stage * k["epoch_s"])
        reused = previous is not None and previous[0] == itype
        if not reused:
            duration += k["startup_s"]
        durations.append(duration)
        costs.append(PRICES[itype] * n * (duration + (0 if reused else k["startup_s"])) / 3600)
        previous = (itype, n)
    durations[0] += k["head_s"]
    return make_plan(spec, stages, durations=durations, prices=PRICES)


def rel(a: float, b: float) -> float:
    return abs(a - b) / b if b else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epoch-s", type=float, default=3.0)
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runtime = args.runtime or default_runtime()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    base = args.out or Path(tempfile.mkdtemp(prefix="rb-bench-"))
    spec = load_spec(write_job(base / "job", epoch_s=args.epoch_s, deadline="1h"))
    print(f"runtime: {runtime}; runs under {base}")

    calibration = run_once(spec, make_plan(spec, ELASTIC, prices=PRICES), base / "calibrate", runtime)
    k = calibrate(calibration["events"])
    print("calibration: " + ", ".join(f"{name} {value:.2f}s" for name, value in k.items()))
    plan = analytic_plan(spec, ELASTIC, k)
    print(f"predictions from: stand-in analytic model (planner not used); predicted JCT "
          f"{plan.predicted.jct_s.p50:.1f}s, cost ${plan.predicted.cost_usd.mean:.5f}")

    jct_err, cost_err, resize, fresh, elastic_costs = [], [], [], [], []
    for i in range(args.runs):
        out = run_once(spec, plan, base / f"elastic-{i}", runtime)
        actual = out["result"]["actual"]
        jct_err.append(rel(actual["jct_s"], plan.predicted.jct_s.p50))
        cost_err.append(rel(actual["cost_usd"], plan.predicted.cost_usd.mean))
        elastic_costs.append(actual["cost_usd"])
        for e in out["events"]:
            if e["type"] == J.TRIAL_STOPPED and e.get("setup_s") is not None:
                (resize if e["stage"] == 1 else fresh).append(e["setup_s"])
        print(f"run {i}: JCT {actual['jct_s']:.1f}s (pred {plan.predicted.jct_s.p50:.1f}s), cost "
              f"${actual['cost_usd']:.5f} (pred ${plan.predicted.cost_usd.mean:.5f})")
    static = run_once(spec, make_plan(spec, STATIC, prices=PRICES), base / "static", runtime, elastic=False)
    static_cost = static["result"]["actual"]["cost_usd"]
    figures = {
        "runs": args.runs,
        "median_rel_error_jct": statistics.median(jct_err),
        "median_rel_error_cost": statistics.median(cost_err),
        "resize_setup_s_median": statistics.median(resize) if resize else None,
        "fresh_setup_s_median": statistics.median(fresh) if fresh else None,
        "elastic_cost_usd_median": statistics.median(elastic_costs),
        "static_cost_usd": static_cost,
        "elastic_over_static_cost": statistics.median(elastic_costs) / static_cost,
        "static_jct_s": static["result"]["actual"]["jct_s"],
    }
    print(json.dumps(figures, indent=2))
    print(f"fidelity: median |error| JCT {figures['median_rel_error_jct']:.1%}, cost "
          f"{figures['median_rel_error_cost']:.1%} (target ≤ 5%)")
    print(f"resize overhead: stage-1 setup {figures['resize_setup_s_median']:.2f}s vs fresh "
          f"{figures['fresh_setup_s_median']:.2f}s")
    print(f"elastic / static actual cost: {figures['elastic_over_static_cost']:.2f} (target ≤ 0.7)")


if __name__ == "__main__":
    main()
