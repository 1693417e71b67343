"""One plan three ways: the planner's prediction, the executor on simulated time (``--cloud sim``), and a real run
on the local backend, with the real run's overheads as its journal shows them.

The local quickstart (``examples/quickstart_local.yaml``, the README's main job: 27 one-epoch trials cut to 9, 3
and 1 trained for 27 epochs, ~80 s on 2 cores) is planned as ``rubberband run`` plans it (the spec's profile,
its cloud's catalog, a head instance with the default ``--results-grace``, which a local run does not bill).
That one plan is then

* predicted: the plan's median JCT, mean cost and P(meet deadline);
* simulated ``--seeds`` times (≥ 50): the unchanged executor on a simulated cluster (executor/simulated.py,
  :func:`bench_sim_executor.simulate`, seed 0, 1, ...): median JCT, mean cost, hit rate; plus one run through
  the CLI itself (``rubberband run SPEC --plan PLAN --cloud sim``, the spec's seed) as a check of that path;
* run for real ``--real K`` times (default 2): ``rubberband run SPEC --plan PLAN --yes --overrun none`` (a late
  run finishes, so its JCT and cost are measured), Ray nodes on this machine, torch DDP in Ray actors.

Printed: a table of JCT / cost / P(meet) with the ratios real / sim and real / predicted, the per-stage durations,
and the overheads each journal records (real runs beside the simulated runs' medians, which are what the
performance model plays): head start, instance start-up (request → ready), worker start on a fresh instance (ready
→ its first trial started, plus that trial's setup), the run's start up to its first trial's training (head, first
instance and its workers, one after another), warm per-trial setup, dispatch gaps between a trial's end and the
next on the same instance, stage boundaries, release → terminated (billing only) and the teardown after the JCT;
each as a share of the real JCT where it is time the run spends. The real − sim JCT gap is split into its part
before the first trial's training and the rest; the cost gap into billed instance-seconds, their release →
terminated part and which instance was kept to the end. Real figures depend on machine load: the load average is
printed beside each real run.

    python bench/bench_sim_vs_local.py [--real 2] [--seeds 50] [--spec examples/quickstart_local.yaml] [--out DIR]

About 3 minutes on an idle 2-core machine (two real runs of ~85 s each, 50 simulated runs of < 1 s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_sim_executor import Planned, simulate  # noqa: E402  (the --cloud sim leg, shared)

LOCAL = REPO / "examples" / "quickstart_local.yaml"
RESULTS_GRACE_S = 600.0  # `rubberband run`'s default --results-grace (10m), which the plan's head billing takes


# -- the journal's overheads ----------------------------------------------------------------------------------


def overheads(run_dir: Path, result: dict) -> dict:
    """What one run's journal records beyond training: seconds, per run (medians and sums as named)."""
    from rubberband.executor import journal as J

    events = list(J.iter_events(Path(run_dir) / J.JOURNAL_NAME))
    t0 = next(e["t"] for e in events if e["type"] == J.RUN_STARTED)
    head_up = next((e["t"] for e in events if e["type"] == J.DECISION and e.get("kind") == "head_started"), None)
    ready = {e["id"]: e["t"] for e in events if e["type"] == J.INSTANCE_READY}
    startups = [e["startup_s"] for e in events if e["type"] == J.INSTANCE_READY and e.get("startup_s") is not None]
    released = {e["id"]: e["t"] for e in events if e["type"] == J.DECISION and e.get("kind") == "release"}
    gone = [e["t"] - released[e["id"]] for e in events if e["type"] == J.INSTANCE_TERMINATED and e["id"] in released]
    running: dict[str, tuple[list[str], int, float, bool]] = {}
    seen: set[str] = set()
    last_end: dict[str, tuple[int, float]] = {}
    worker_starts, warm_setups, gaps, per_epoch = [], [], [], []
    training = 0.0
    first_trial = first_training = None  # the first trial (id, started at); when its training began
    stage_started: dict[int, float] = {}
    stage_finished: dict[int, float] = {}
    run_finished = None
    for e in events:
        kind = e["type"]
        if kind == J.TRIAL_STARTED:
            instances = list(e.get("instances") or [])
            fresh = any(i not in seen for i in instances)
            seen.update(instances)
            first_trial = (e["trial_id"], e["t"]) if first_trial is None else first_trial
            for i in instances[:1]:
                if i in last_end and last_end[i][0] == e["stage"]:
                    gaps.append(e["t"] - last_end[i][1])
            running[e["trial_id"]] = (instances, e["stage"], e["t"], fresh)
        elif kind == J.TRIAL_STOPPED and e["trial_id"] in running:
            instances, stage, started, fresh = running.pop(e["trial_id"])
            for i in instances:
                last_end[i] = (stage, e["t"])
            if e.get("reason") != "finished" or e.get("setup_s") is None or e.get("seconds") is None:
                continue
            setup = float(e["setup_s"])
            if first_trial is not None and e["trial_id"] == first_trial[0] and first_training is None:
                first_training = started + setup
            if fresh:
                wait = max((started - ready[i] for i in instances if i in ready), default=0.0)
                worker_starts.append(wait + setup)
            else:
                warm_setups.append(setup)
            epochs = (e.get("end_epoch") or 0) - (e.get("start_epoch") or 0)
            if epochs > 0:
                per_epoch.append((e["seconds"] - setup) / epochs)
                training += e["seconds"] - setup
        elif kind == J.STAGE_STARTED:
            stage_started.setdefault(e["stage"], e["t"])
        elif kind == J.STAGE_FINISHED:
            stage_finished[e["stage"]] = e["t"]
        elif kind == J.RUN_FINISHED:
            run_finished = e["t"]
    requested = sorted((e["t"], e["id"]) for e in events if e["type"] == J.INSTANCE_REQUESTED)
    ended = sorted((e["t"], e["id"]) for e in events if e["type"] == J.INSTANCE_TERMINATED)
    boundaries = [stage_started[g + 1] - t for g, t in stage_finished.items() if g + 1 in stage_started]

    def median(xs: list[float]) -> float:
        return statistics.median(xs) if xs else math.nan

    return {
        "head_start": head_up - t0 if head_up is not None else math.nan,
        "startup_median": median(startups),
        "worker_start_median": median(worker_starts),
        "to_first_trial": first_training - t0 if first_training is not None else math.nan,
        "warm_setup_median": median(warm_setups),
        "warm_setup_sum": sum(warm_setups),
        "dispatch_gap_median": median(gaps),
        "dispatch_gap_sum": sum(gaps),
        "stage_boundaries_sum": sum(boundaries),
        "epoch_median": median(per_epoch),
        "training_sum": training,
        "release_to_gone_median": median(gone),
        "release_to_gone_sum": sum(gone),
        "billed_sum": sum(i["billed_s"] for i in result["instances"]),
        # the last instance standing was the first one requested (the longest billed, when the run keeps one)
        "kept_first": bool(requested and ended and ended[-1][1] == requested[0][1]),
        "teardown": (run_finished - max(stage_finished.values())) if run_finished and stage_finished else math.nan,
        "instances": len(ready),
        # from the previous stage's end (the run's start for stage 0), as the plan predicts a stage's duration
        "stages": {
            g: t - ([t0] + [stage_finished[h] for h in sorted(stage_finished) if h < g])[-1]
            for g, t in stage_finished.items()
        },
    }


#: (key, label, counts toward the JCT: its share of the real JCT is printed)
OVERHEAD_ROWS = [
    ("head_start", "head start (run start → Ray head up)", True),
    ("startup_median", "instance start-up (request → ready), median", False),
    ("worker_start_median", "worker start on a fresh instance (ready → first trial + its setup), median", False),
    ("to_first_trial", "run start → first trial's training begins (serial: head, 1st instance, its workers)", True),
    ("warm_setup_median", "warm trial setup (per trial), median", False),
    ("warm_setup_sum", "warm trial setup, Σ over trials (all instances)", True),
    ("dispatch_gap_median", "dispatch gap (trial end → next trial on that instance), median", False),
    ("dispatch_gap_sum", "dispatch gaps, Σ (all instances)", True),
    ("stage_boundaries_sum", "stage boundaries (stage finished → next started, re-plan included), Σ", True),
    ("epoch_median", "training per epoch (trial seconds − setup) / epochs, median", False),
    ("training_sum", "training, Σ over trials (instance-seconds)", False),
    ("release_to_gone_median", "release → instance terminated (billed, not in JCT), median", False),
    ("release_to_gone_sum", "release → instance terminated, Σ", False),
    ("billed_sum", "billed instance-seconds, Σ (the cost / price)", False),
    ("teardown", "last stage finished → run finished (after the JCT)", False),
]


# -- the legs --------------------------------------------------------------------------------------------------


def plan_as_run_does(spec_path: Path, out: Path):
    """The plan ``rubberband run SPEC`` makes (no --plan, no --deadline, default --head / --results-grace),
    written to ``out`` for every leg to take with ``--plan``."""
    from rubberband.inputs import load_job_inputs
    from rubberband.plan import write_plan
    from rubberband.planning import PlanningOptions, plan_from_inputs

    inputs = load_job_inputs(spec_path)
    plan = plan_from_inputs(inputs, options=PlanningOptions(head="instance", head_grace_s=RESULTS_GRACE_S))
    write_plan(plan, out)
    return inputs, plan


def leftovers(run_dir: Path) -> list[int]:
    """Live processes whose command line names ``run_dir`` (Ray's node processes of that run do)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if str(run_dir) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def cli_run(spec_path: Path, plan_path: Path, run_dir: Path, *extra: str) -> tuple[dict | None, float, int, str]:
    """``rubberband run SPEC --plan PLAN --run-dir DIR --yes --overrun none [extra]``: (result, wall s, exit code,
    stderr tail); the run's output is kept beside its directory (``DIR.log``)."""
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(plan_path),
            "--run-dir",
            str(run_dir),
            "--yes",
            "--overrun",
            "none",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - began
    (run_dir.parent / f"{run_dir.name}.log").write_text(done.stdout + done.stderr)
    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return result, wall, done.returncode, f"exit {done.returncode}: {done.stderr.strip()[-400:]}"


def real_runs(spec_path: Path, plan_path: Path, k: int, base: Path) -> list[dict]:
    runs = []
    for i in range(k):
        run_dir = base / f"real-{i}"
        load_before = os.getloadavg()[0]
        result, wall, _, tail = cli_run(spec_path, plan_path, run_dir)
        load_after = os.getloadavg()[0]
        left = leftovers(run_dir)
        if left:
            print(
                f"WARNING real run {i}: processes of {run_dir} still alive after the CLI returned: {left}",
                file=sys.stderr,
            )
        if result is None:
            print(f"real run {i}: no result.json ({tail})", file=sys.stderr)
            continue
        runs.append(
            {"result": result, "overheads": overheads(run_dir, result), "wall": wall, "load": (load_before, load_after)}
        )
        print(
            f"... real run {i}: JCT {result['actual']['jct_s']:.1f} s, {result['outcome']}, command {wall:.0f} s, "
            f"load average {load_before:.1f} → {load_after:.1f}",
            file=sys.stderr,
        )
    return runs


# -- printing ------------------------------------------------------------------------------------------------------


def _f(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def report(plan, sim: dict, cli: dict | None, real: list[dict]) -> None:
    p = plan.predicted
    jcts = [r["actual"]["jct_s"] for r in sim["results"]]
    costs = [r["actual"]["cost_usd"] for r in sim["results"]]
    sim_jct, sim_cost, hit = statistics.median(jcts), statistics.fmean(costs), sim["run_meet"]
    rj = [r["result"]["actual"].get("jct_from_start_s", r["result"]["actual"]["jct_s"]) for r in real]  # as simulated
    rc = [r["result"]["actual"]["cost_usd"] for r in real]
    met = [bool(r["result"]["met_deadline"]) for r in real]
    stages = " → ".join(
        f"{s.trials}×{s.epochs}ep on {s.instances}×{s.instance_type}/w{s.workers_per_trial}" for s in plan.stages
    )
    print(f"\nplan: deadline {plan.deadline_s:.0f} s; {stages}")
    print(
        f"\n| | predicted (plan) | sim ({sim['seeds']} seeds) | real ({len(real)} runs) | real / sim | "
        f"real / predicted |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| JCT s | p50 {p.jct_s.p50:.1f} (p10–p90 {sim['pred_p10']:.1f}–{sim['pred_p90']:.1f}) | median "
        f"{sim_jct:.1f} (p10–p90 {sim['run_p10']:.1f}–{sim['run_p90']:.1f}) | "
        f"{', '.join(f'{j:.1f}' for j in rj)} | "
        f"{', '.join(f'{j / sim_jct:.3f}' for j in rj)} | {', '.join(f'{j / p.jct_s.p50:.3f}' for j in rj)} |"
    )
    print(
        f"| cost $ | mean {p.cost_usd.mean:.5f} | mean {sim_cost:.5f} | {', '.join(f'{c:.5f}' for c in rc)} | "
        f"{', '.join(f'{c / sim_cost:.3f}' for c in rc)} | {', '.join(f'{c / p.cost_usd.mean:.3f}' for c in rc)} |"
    )
    print(
        f"| P(meet {plan.deadline_s:.0f} s) | {p.p_meet_deadline:.3f} | hit rate {hit:.2f} | "
        f"{sum(met)}/{len(met)} met | | |"
    )
    print(f"| outcomes | | {sim['outcomes']} | {[r['result']['outcome'] for r in real]} | | |")
    if cli is not None:
        same = sim["results"][cli["seed"]]["actual"] if cli["seed"] < len(sim["results"]) else None
        actual = cli["result"]["actual"]
        print(
            f"\nCLI `rubberband run --cloud sim` (spec seed {cli['seed']}): JCT {actual['jct_s']:.2f} s, cost"
            f" ${actual['cost_usd']:.5f}, {cli['wall']:.1f} s for the command"
            + (
                f" (in-process seed {cli['seed']}: JCT {same['jct_s']:.2f} s, cost ${same['cost_usd']:.5f})"
                if same
                else ""
            )
        )
    print(
        "\n| stage (from the previous one's end; stage 0 from the run's start) | predicted s | sim median s | real s |"
    )
    print("|---|---|---|---|")
    for g, stage in enumerate(plan.stages):
        simd = [o["stages"].get(g) for o in sim["inspected"]]
        simd = [d for d in simd if d is not None]
        print(
            f"| {g} ({stage.trials}×{stage.epochs}ep) | {_f(stage.predicted_duration_s, 1)} | "
            f"{_f(statistics.median(simd) if simd else math.nan, 1)} | "
            f"{', '.join(_f(r['overheads']['stages'].get(g), 1) for r in real)} |"
        )
    print("\nOverheads the journals record (s; sim: median over the seeds, what the performance model plays):\n")
    print(f"| | sim | {' | '.join(f'real {i}' for i in range(len(real)))} | real − sim (mean) | % of real JCT (mean) |")
    print(f"|---|---|{'---|' * len(real)}---|---|")
    for key, label, in_jct in OVERHEAD_ROWS:
        simv = statistics.median([o[key] for o in sim["inspected"]])
        vals = [r["overheads"][key] for r in real]
        delta = statistics.fmean(vals) - simv if vals else math.nan
        share = statistics.fmean(v / j for v, j in zip(vals, rj)) if in_jct and vals else math.nan
        print(
            f"| {label} | {_f(simv, 3)} | {' | '.join(_f(v, 3) for v in vals)} | {_f(delta, 3)} | "
            f"{'' if math.isnan(share) else f'{share:.1%}'} |"
        )
    if real:
        gap = statistics.fmean(rj) - sim_jct
        before = statistics.fmean(r["overheads"]["to_first_trial"] for r in real) - statistics.median(
            o["to_first_trial"] for o in sim["inspected"]
        )
        loads = ", ".join(f"{a:.1f}→{b:.1f}" for a, b in (r["load"] for r in real))
        print(
            f"\nreal − sim JCT (mean of the real runs − sim median): {gap:+.2f} s = {gap / sim_jct:+.1%}; "
            f"of which before the first trial's training begins {before:+.2f} s, after it {gap - before:+.2f} s. "
            f"Load average over the real runs (before→after): {loads}; {os.cpu_count()} cores."
        )
        billed = statistics.fmean(r["overheads"]["billed_sum"] for r in real) - statistics.median(
            o["billed_sum"] for o in sim["inspected"]
        )
        gone = statistics.fmean(r["overheads"]["release_to_gone_sum"] for r in real) - statistics.median(
            o["release_to_gone_sum"] for o in sim["inspected"]
        )
        print(
            f"real − sim cost (mean of the real runs − sim mean): {statistics.fmean(rc) - sim_cost:+.5f} $ = "
            f"{(statistics.fmean(rc) - sim_cost) / sim_cost:+.1%}; billed instance-seconds real − sim median "
            f"{billed:+.1f} s, of which release → terminated {gone:+.1f} s; the instance kept to the end was the "
            f"first one requested (billed longest) in {sum(r['overheads']['kept_first'] for r in real)}/{len(real)} "
            f"real runs, {sum(o['kept_first'] for o in sim['inspected'])}/{len(sim['inspected'])} simulated ones."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=int, default=2, help="real local runs (K)")
    parser.add_argument("--seeds", type=int, default=50, help="simulated runs (--cloud sim), ≥ 50 for the table")
    parser.add_argument("--spec", type=Path, default=LOCAL, help="a spec on the local cloud")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="keep the plan, runs and logs here (default: a temporary folder, removed at the end)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    base = (args.out or Path(tempfile.mkdtemp(prefix="bench-sim-vs-local-"))).absolute()
    base.mkdir(parents=True, exist_ok=True)
    spec_path = args.spec.absolute()
    try:
        plan_path = base / "plan.json"
        inputs, plan = plan_as_run_does(spec_path, plan_path)
        if {s.cloud for s in plan.stages} != {"local"}:
            parser.error(f"{args.spec} plans for {plan.stages[0].cloud}; this bench runs the local backend")
        print(f"... planned; simulating {args.seeds} seeds", file=sys.stderr)
        from rubberband.executor.run import Settings

        sim = simulate(
            Planned("local", inputs, plan), args.seeds, base, inspect=overheads, settings=Settings(overrun_s=math.inf)
        )
        result, wall, _, tail = cli_run(spec_path, plan_path, base / "cli-sim", "--cloud", "sim")
        cli = None if result is None else {"result": result, "wall": wall, "seed": inputs.spec.seed}
        if result is None:
            print(f"CLI --cloud sim run: no result.json ({tail})", file=sys.stderr)
        print(f"... simulated (median wall {sim['wall_median']:.2f} s per run); {args.real} real runs", file=sys.stderr)
        real = real_runs(spec_path, plan_path, args.real, base)
        report(plan, sim, cli, real)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"\nplan, runs and logs in {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
