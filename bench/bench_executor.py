"""Executor benchmark on the local backend: plan fidelity, resize overhead, elastic vs static cost.

    python bench/bench_executor.py [--runs 5] [--epoch-s 4.0] [--out DIR]

* fidelity — predicted (plan) vs actual JCT and cost over ``--runs`` runs of a 9-trial SHA job
  (η=3, 1 → 9 epochs, 3 stages) on real local Ray nodes; prints the median relative errors (target ≤ 5%).
  With the planner installed (``rubberband.planner.plan_job``) and ``--profile`` given, the plan
  and its predictions come from the planner; otherwise from :func:`analytic_plan` below, a
  stand-in model (waves × (epoch time + trial setup) + instance startup) whose constants are
  measured by a first calibration run — say which one was used when quoting the figures.
* resize overhead — trial setup time (new workers + restore) of the restarts in stages 1 and 2
  (resizes 1 → 2 → 1 workers per trial) versus fresh stage-0 starts, from the journal.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from executor_helpers import make_plan, write_job  # noqa: E402

from rubberband.catalog import load_catalog  # noqa: E402
from rubberband.cloud.local import LocalProvider  # noqa: E402
from rubberband.executor import journal as J  # noqa: E402
from rubberband.executor.controller import Controller  # noqa: E402
from rubberband.executor.runtime import TrialRuntime  # noqa: E402
from rubberband.spec import load_spec  # noqa: E402

# The job: 9 trials, η=3, 1 → 9 epochs: stages of 9×1, 3×3 and 1×9 cumulative epochs.
# Elastic: three instances while there are 9 and 3 trials (the survivors resized to 2 workers each),
# one for the last trial (resized back to 1 worker); the two others are released when stage 1 ends.
# Static: the same three instances held for the whole job.
ELASTIC = [("local.cpu2", 3, 1), ("local.cpu2", 3, 2), ("local.cpu2", 1, 1)]
STATIC = [("local.cpu2", 3, 1), ("local.cpu2", 3, 2), ("local.cpu2", 3, 1)]
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


def simulate(spec, stages, k: dict[str, float]) -> tuple[list[float], list[float]]:
    """Stand-in predictions (per-stage durations and costs) from a small replay of the executor's rules.

    Instances start one after another (``startup_s`` each) once the head is up (``head_s``); trials go
    to the earliest free slot and take ``setup_s`` + epochs × ``epoch_s``; same-type instances carry
    over; the next stage's extra instances are requested ``startup_s`` before the current stage's
    end; an instance is billed from its request to the end of its last trial (idle ones are
    released as soon as no trial is left to dispatch).
    """
    plan = make_plan(spec, stages, prices=PRICES)
    t = k["head_s"]
    provisioner_free = t
    every: list[dict] = []
    carried: list[dict] = []
    windows, durations = [], []
    for g, (s, (itype, n, w)) in enumerate(zip(plan.stages, stages)):
        stage_start = t
        instances = [inst for inst in carried if inst["type"] == itype][:n]
        for inst in carried:
            if inst not in instances:
                inst["released"] = inst["last_end"]
        request_at = stage_start if g == 0 else max(k["head_s"], stage_start - k["startup_s"])
        while len(instances) < n:
            requested = max(provisioner_free, request_at)
            provisioner_free = requested + k["startup_s"]
            inst = {"type": itype, "requested": requested, "ready": provisioner_free, "last_end": stage_start,
                    "released": None}
            instances.append(inst)
            every.append(inst)
        per_instance = WORKERS[itype] // w
        slots = [inst for inst in instances for _ in range(per_instance)]
        free = [max(inst["ready"], stage_start) for inst in slots]
        trial_s = k["setup_s"] + s.epochs_this_stage * k["epoch_s"]
        for _ in range(s.trials):
            i = min(range(len(free)), key=lambda j: free[j])
            free[i] += trial_s
            slots[i]["last_end"] = max(slots[i]["last_end"], free[i])
        t = max(free)
        windows.append((stage_start, t))
        durations.append(t - stage_start)
        carried = instances
    for inst in carried:
        inst["released"] = inst["last_end"]
    costs = [0.0] * len(stages)
    for inst in every:
        price = PRICES[inst["type"]] / 3600
        for g, (lo, hi) in enumerate(windows):
            lo = -math.inf if g == 0 else lo
            hi = math.inf if g + 1 == len(windows) else hi
            costs[g] += price * max(0.0, min(hi, inst["released"]) - max(lo, inst["requested"]))
    durations[0] += k["head_s"]
    return durations, costs


def analytic_plan(spec, stages, k: dict[str, float]):
    durations, costs = simulate(spec, stages, k)
    plan = make_plan(spec, stages, durations=durations, prices=PRICES)
    total = sum(costs)
    stage_plans = [s.model_copy(update={"predicted_cost_usd": c}) for s, c in zip(plan.stages, costs)]
    predicted = plan.predicted.model_copy(update={
        "cost_usd": plan.predicted.cost_usd.model_copy(update={"mean": total, "p50": total, "p95": total * 1.1}),
        "stage_cost_usd": costs})
    return plan.model_copy(update={"stages": stage_plans, "predicted": predicted})


def rel(a: float, b: float) -> float:
    return abs(a - b) / b if b else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epoch-s", type=float, default=4.0)
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runtime = args.runtime or default_runtime()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    base = args.out or Path(tempfile.mkdtemp(prefix="rb-bench-"))
    spec = load_spec(write_job(base / "job", epoch_s=args.epoch_s, deadline="1h", max_epochs=9))
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
                (resize if e["stage"] > 0 else fresh).append(e["setup_s"])
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
    print(f"resize overhead: restart setup {figures['resize_setup_s_median']:.2f}s vs fresh "
          f"{figures['fresh_setup_s_median']:.2f}s")
    print(f"elastic / static actual cost: {figures['elastic_over_static_cost']:.2f} (target ≤ 0.7)")


if __name__ == "__main__":
    main()
