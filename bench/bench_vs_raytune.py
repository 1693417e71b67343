"""rubberband vs Ray Tune, side by side, on the same workload, trials, η and epochs.

    pip install -e '.[raytune]'
    python bench/bench_vs_raytune.py [--workload spread] [--nodes 1,2,3] [--schedulers hyperband,asha] [--out DIR]

Workloads (``--workload``, see :data:`WORKLOADS`); each names the spec rubberband runs and the Ray
Tune function trainable Ray Tune runs:

* ``spread``: ``examples/raytune_spread.yaml``, the Ray Tune trainable ``examples/raytune_trainable.py``
  run by Ray Tune itself and, unchanged, by rubberband through its Ray Tune adapter: 27 trials, η = 3,
  1 → 9 epochs of 2 s whose length differs per configuration (``speed_sigma`` 0.4), a known winner;
* ``nasbench201``: ``examples/nasbench201.yaml``, the 27 recorded NAS-Bench-201 architectures replayed
  (``examples/recorded.py``: rubberband runs ``train``, Ray Tune the same replay as ``train_fn``);
  recorded speeds differ 3×, the recorded best is ``311021``;
* ``digits``: ``examples/digits_spread.yaml``, the torch CNN on scikit-learn's digits (real training:
  rubberband runs ``train`` with DDP over the workers its plan gives a trial, Ray Tune runs the same
  model, data and optimizer as the function trainable ``train_fn``, one process per trial): 27
  configurations of learning rate, momentum and conv width (16–128 channels, so speeds differ);
* ``tiny``: ``examples/raytune.yaml``, 9 trials of 0.5-second epochs: every run fits in the 60-second
  minimum, so it shows the floors, not the schedulers.

* Ray Tune 2.x: ``HyperBandScheduler(max_t=R, reduction_factor=η)`` and ``ASHAScheduler(max_t=R,
  grace_period=r, reduction_factor=η)``, ``reuse_actors=True``, over the same configurations
  (rubberband's first-stage trials, in its order, as ``BasicVariantGenerator(points_to_evaluate=...)``), on a static
  local cluster of 1, 2 or 3 one-CPU nodes (``ray.cluster_utils.Cluster``, one trial per node at a
  time), each cell in its own process. JCT: cluster start → ``Tuner.fit()`` returns.
* rubberband: the elastic plan for the same spec (local.cpu1 / local.cpu2 instances, real local
  run by the executor), with the deadline at (a) each Ray Tune run's JCT and (b) 1.2× the shortest
  JCT rubberband's planner can meet. JCT: run start (head start included) → last stage done.

Both are billed the same way: the local catalog's price per node-second (local.cpu1 $0.05/h,
local.cpu2 $0.10/h; Ray Tune's nodes are one-CPU nodes, priced as local.cpu1), 1-second
granularity, 60-second minimum per node (rubberband's per-instance lifetimes from its result.json).
Prints JCT, billed cost, the best configuration and its metric, the epochs trained over all trials
(Ray Tune's HyperBandScheduler spreads its samples over several brackets and trains more of them to
max_t than one SHA bracket does; ASHA lets a trial go on whenever it is in the top 1/η of those that
reached its rung *so far*), and two cost ratios per rubberband row: against the Ray Tune run whose
JCT was its deadline, and against the cheapest Ray Tune run that finished no sooner than it (the
goal: ≤ 0.6×).

Everything runs on this machine: the figures are only as good as its load (printed with them). Local
nodes share its cores: with real training (``digits``), more training processes than cores slow each one
down, which neither Ray Tune's static clusters nor rubberband's planner allow for (the planner models each
local node as a machine of its own).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rubberband.spec import JobSpec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class Workload:
    """The spec rubberband runs, and the Ray Tune function trainable (in ``examples/``) Ray Tune runs."""

    spec: Path
    trainable: str  # module:function


WORKLOADS = {
    "spread": Workload(EXAMPLES / "raytune_spread.yaml", "raytune_trainable:train_fn"),
    "nasbench201": Workload(EXAMPLES / "nasbench201.yaml", "recorded:train_fn"),
    "digits": Workload(EXAMPLES / "digits_spread.yaml", "digits:train_fn"),
    "tiny": Workload(EXAMPLES / "raytune.yaml", "raytune_trainable:train_fn"),
}
NODE_PRICE_HR = 0.05  # local.cpu1: Ray Tune's one-CPU nodes
GRANULARITY_S, MINIMUM_S = 1.0, 60.0


def billed_usd(lifetimes_s: list[float], price_hr: float | list[float]) -> float:
    """Per node-second, 1 s granularity, 60 s minimum per node."""
    prices = price_hr if isinstance(price_hr, list) else [price_hr] * len(lifetimes_s)
    return sum(
        math.ceil(max(t, MINIMUM_S) / GRANULARITY_S) * GRANULARITY_S * p / 3600 for t, p in zip(lifetimes_s, prices)
    )


def same_trials(spec: "JobSpec") -> list[dict]:
    """The configurations rubberband's first stage runs for the spec (its fixed configurations, then its
    seeded samples), each reduced to the hyperparameters that vary between them."""
    from rubberband.planner.schedule import stages_for
    from rubberband.search import make_config_source, trial_id_for

    sched = spec.scheduler
    first = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )[0]
    source = make_config_source(spec)
    configs = [source.propose(trial_id_for(0, i)) for i in range(first.trials)]
    varying = sorted({k for c in configs for k in c if k not in spec.config})
    return [{k: c[k] for k in varying} for c in configs]


def trial_number(config: dict, trials: list[dict]) -> str:
    """``#i``: which of the same trials ``config`` (a full configuration) is, by its varying hyperparameters."""
    for i, trial in enumerate(trials):
        if all(config.get(k) == v for k, v in trial.items()):
            return f"#{i}"
    return "?"


# -- Ray Tune (one cell per process) -----------------------------------------------------------------


def raytune_cell(workload: Workload, scheduler: str, nodes: int, out: Path) -> dict:
    # Ray Tune's trial actors import the trainable by module name: the nodes' workers inherit this path
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    import importlib

    from rubberband.profiler.local_cluster import LocalCluster  # one Ray node per instance, as our local runs
    from rubberband.spec import load_spec

    spec = load_spec(workload.spec)
    trials = same_trials(spec)
    sys.path.insert(0, str(EXAMPLES))
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    module, function = workload.trainable.split(":")
    trainable = getattr(importlib.import_module(module), function)

    sched, metric = spec.scheduler, spec.metric
    started = time.time()
    with LocalCluster() as cluster:
        for i in range(nodes):
            cluster.add_instance(f"n{i}", 1)
        if scheduler == "hyperband":
            chosen = HyperBandScheduler(
                time_attr="training_iteration", max_t=sched.max_epochs, reduction_factor=sched.eta
            )
        else:
            chosen = ASHAScheduler(
                time_attr="training_iteration",
                max_t=sched.max_epochs,
                grace_period=sched.min_epochs,
                reduction_factor=sched.eta,
            )
        # the same trials: rubberband's configurations, in its order, as Ray Tune's points to evaluate
        varying = {k: tune.choice(sorted({t[k] for t in trials})) for k in trials[0]}
        space = {**varying, **spec.config, "max_epochs": sched.max_epochs}
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=metric.name,
                mode=metric.mode,
                num_samples=len(trials),
                search_alg=BasicVariantGenerator(points_to_evaluate=[dict(t) for t in trials]),
                scheduler=chosen,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(storage_path=str(out / "ray_results"), name=f"{scheduler}-{nodes}", verbose=0),
        )
        results = tuner.fit()
        jct = time.time() - started
        best = results.get_best_result(metric=metric.name, mode=metric.mode, scope="last")
        epochs = int(sum(r.metrics.get("training_iteration", 0) for r in results))
    lifetime = time.time() - started
    return {
        "system": f"Ray Tune {scheduler} (reuse_actors)",
        "nodes": nodes,
        "jct_s": jct,
        "cost_usd": billed_usd([lifetime] * nodes, NODE_PRICE_HR),
        "best": trial_number(best.config, trials),
        "best_metric": best.metrics[metric.name],
        "trial_epochs": epochs,
    }


def run_raytune(workload: str, scheduler: str, nodes: int, out: Path, *, tries: int = 3) -> dict:
    """One Ray Tune cell in a fresh process; tried again when it fails (a Ray node that times out
    starting on a loaded machine), at most ``tries`` times."""
    for attempt in range(1, tries + 1):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--workload",
                workload,
                "--raytune-cell",
                scheduler,
                str(nodes),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        last = done.stderr.strip().splitlines()[-1:] or ["?"]
        print(f"Ray Tune {scheduler} on {nodes} nodes: attempt {attempt} failed ({last[0][:200]})", flush=True)
    raise RuntimeError(f"Ray Tune {scheduler} on {nodes} nodes failed {tries} times")


# -- rubberband ----------------------------------------------------------------------------------------


def run_rubberband(spec_path: Path, deadline_s: float, out: Path, label: str) -> dict:
    """A real local run, as ``rubberband run SPEC --deadline D --overrun none`` makes it: the plan for the
    deadline, the re-planner at every stage boundary, and a late run finished rather than stopped."""
    from rubberband.catalog import load_catalog
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.errors import InfeasibleError
    from rubberband.executor.run import Executor, Job, Settings, Target
    from rubberband.executor.runtime import TrialRuntime, planner_replanner
    from rubberband.inputs import load_job_inputs
    from rubberband.planner import PlanOptions, plan_job

    inputs = load_job_inputs(spec_path)
    trials = same_trials(inputs.spec)
    try:
        plan = plan_job(
            inputs.spec, inputs.profile, inputs.catalog, PlanOptions(deadline_s=deadline_s, samples=1000, seed=0)
        )
    except InfeasibleError as exc:
        return {"system": f"rubberband elastic ({label})", "deadline_s": deadline_s, "infeasible": str(exc)}
    run_dir = out / f"rubberband-{label}"
    catalog = load_catalog(["local"])
    executor = Executor(
        Job(inputs.spec, plan, catalog, inputs.profile),
        Target(run_dir.name, run_dir, LocalProvider(run_dir), TrialRuntime.load()),
        Settings(deadline_s=deadline_s, overrun_s=math.inf),
        replanner=planner_replanner(catalog, inputs.profile),
    )
    result = executor.run().result
    lifetimes = [i["lifetime_s"] for i in result["instances"]]
    prices = [i["price_hr"] for i in result["instances"]]
    best = result["best"] or {}
    from rubberband.executor import journal as J

    epochs = sum(len(t.epochs) for t in J.read_state(run_dir).trials.values())
    planned = " → ".join(f"{s.instances}×{s.instance_type}" for s in plan.stages)
    ran = " → ".join(  # what each stage started with, after the re-planner's changes
        f"{e['instances']}×{e['instance_type']}"
        for e in J.iter_events(run_dir / "journal.jsonl")
        if e["type"] == "stage_started"
    )
    return {
        "system": f"rubberband elastic ({label})",
        "deadline_s": deadline_s,
        "plan": ran if ran == planned else f"{ran} (planned {planned})",
        "jct_s": result["actual"]["jct_s"],
        "cost_usd": billed_usd(lifetimes, prices),
        "best": trial_number(best.get("config") or {}, trials),
        "best_metric": best.get("metric"),
        "trial_epochs": epochs,
    }


def shortest_feasible_s(spec_path: Path) -> float:
    from rubberband.errors import InfeasibleError
    from rubberband.inputs import load_job_inputs
    from rubberband.planner import PlanOptions, plan_job

    inputs = load_job_inputs(spec_path)
    try:
        plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(deadline_s=1.0, samples=1000, seed=0))
    except InfeasibleError as exc:
        return float(exc.shortest_jct_s)
    raise RuntimeError("a 1-second deadline was feasible")


# -- the table -----------------------------------------------------------------------------------------


def is_raytune(row: dict) -> bool:
    return row["system"].startswith("Ray Tune")


def cell(row: dict) -> str:
    """A Ray Tune row's scheduler/nodes ("asha/1"), as rubberband rows name it in ``vs``."""
    return f"{row['system'].split()[2]}/{row['nodes']}"


def cheapest_no_sooner(rows: list[dict], jct_s: float) -> dict | None:
    """The cheapest Ray Tune run that finished no sooner than ``jct_s``: what a run that fast must beat."""
    slower = [r for r in rows if is_raytune(r) and r["jct_s"] >= jct_s]
    return min(slower, key=lambda r: r["cost_usd"]) if slower else None


def print_table(rows: list[dict], workload: str, trials: list[dict]) -> None:
    print(
        f"\n{workload}: load average at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; billed per "
        f"node-second, 1 s granularity, 60 s minimum per node"
    )
    print(
        f"{'system':38} {'nodes / plan (as run)':46} {'deadline':>8} {'JCT':>7} {'billed $':>10} {'best':>8} "
        f"{'metric':>7} {'epochs':>6} {'÷ Ray Tune at its JCT':>21} {'÷ cheapest no sooner':>20}"
    )
    by_cell = {cell(r): r for r in rows if is_raytune(r)}
    for r in rows:
        if "infeasible" in r:
            print(f"{r['system']:38} infeasible at {r['deadline_s']:.0f} s")
            continue
        where = str(r.get("nodes", r.get("plan", "")))
        deadline = f"{r['deadline_s']:.0f}s" if "deadline_s" in r else "-"
        same = by_cell.get(r.get("vs", ""))
        ratio = f"{r['cost_usd'] / same['cost_usd']:.2f}" if same else "-"
        bar = None if is_raytune(r) else cheapest_no_sooner(rows, r["jct_s"])
        ratio_bar = f"{r['cost_usd'] / bar['cost_usd']:.2f} ({cell(bar)})" if bar else "-"
        print(
            f"{r['system']:38} {where:46} {deadline:>8} {r['jct_s']:6.1f}s {r['cost_usd']:10.6f} "
            f"{r['best']:>8} {r['best_metric']:7.4f} {r.get('trial_epochs', 0):6d} {ratio:>21} {ratio_bar:>20}"
        )
    for number in sorted({r["best"] for r in rows if "best" in r and r["best"] != "?"}):
        print(f"best {number}: {trials[int(number[1:])]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="spread")
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--schedulers", default="hyperband,asha")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--raytune-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="take the Ray Tune rows from an earlier run's DIR/rows.json (same workload) instead of running them",
    )
    parser.add_argument("--raytune-cell", nargs=2, metavar=("SCHEDULER", "NODES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    out = args.out or Path(tempfile.mkdtemp(prefix="rb-vs-raytune-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.raytune_cell:
        print(json.dumps(raytune_cell(workload, args.raytune_cell[0], int(args.raytune_cell[1]), out)))
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    print(
        f"{args.workload}: runs under {out}; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    earlier = {}
    if args.raytune_from is not None:
        earlier = {cell(r): r for r in json.loads((args.raytune_from / "rows.json").read_text()) if is_raytune(r)}
    rows = []
    for scheduler in args.schedulers.split(","):
        for nodes in (int(n) for n in args.nodes.split(",")):
            tune_row = earlier.get(f"{scheduler}/{nodes}") or run_raytune(args.workload, scheduler, nodes, out)
            rows.append(tune_row)
            print(json.dumps(tune_row), flush=True)
            ours = run_rubberband(workload.spec, tune_row["jct_s"], out, f"{scheduler}-{nodes}")
            ours["vs"] = f"{scheduler}/{nodes}"
            rows.append(ours)
            print(json.dumps(ours), flush=True)
    shortest = shortest_feasible_s(workload.spec)
    tight = run_rubberband(workload.spec, 1.2 * shortest, out, "1.2x-shortest")
    tight["vs"] = "1.2× shortest feasible"
    rows.append(tight)
    print(json.dumps(tight), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=2))
    from rubberband.spec import load_spec

    print_table(rows, args.workload, same_trials(load_spec(workload.spec)))


if __name__ == "__main__":
    main()
