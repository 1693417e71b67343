"""Planner benchmarks: planning time, gap to the exact optimum, savings over static, work bound.

    python bench/bench_planner.py [--quick]

Prints figures and ratios (no assertions). Targets (issue 32): SHA n=81 η=3 with 3 instance types and
1000 samples plans in ≤ 0.3 s; SHA n=729 (1-243 epochs) in ≤ 2 s (planning grows with stages × candidate
shapes, not trials); Hyperband R=81 η=3 in ≤ 5 s; plan cost / exact optimum ≤ 1.01 on small cases
(bench_planner_gap.py: the distribution over 200 drawn workloads); best static / plan ≥ 2 at 1.2× the
shortest feasible JCT on the quickstart, never < 1. Hyperband with parallel brackets (``--hyperband``
runs only that part): shortest feasible JCT near the longest bracket's instead of the sum; R=243 η=3
plans in ≤ 1 s on 2 cores, and in ≤ 2 s from the command line (``rubberband plan`` in a fresh process); elastic
SHA versus ASHA simulated on a fixed cluster at equal deadlines.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.bounds import Accounting, deadline_bound, work_bound
from rubberband.planner.brackets import BracketSetup
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import hyperband_brackets, sha_stages
from rubberband.planner.search import Goal, PlanSpace
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_TYPES = ("p3.2xlarge", "g4dn.xlarge", "g5.xlarge")


@dataclass(frozen=True)
class Problem:
    """What the planner is asked to plan, but for the deadline and confidence: the stages, the model, the instance
    types, the workers per trial at most, the samples and how the brackets run."""

    stages: list
    model: Any
    types: list
    max_workers: int = 1
    samples: int = 1000
    brackets: str = "sequential"

    def plan(self, deadline_s: float, confidence: float):
        return plan_stages(
            PlanSpace(self.stages, self.types, self.model, self.max_workers),
            Goal(deadline_s, confidence),
            SimSettings(samples=self.samples),
            SearchOptions(brackets=BracketSetup() if self.brackets == "parallel" else None),
        )


def shortest_jct(problem: Problem, *, confidence: float) -> float:
    try:
        problem.plan(1.0, confidence)
    except InfeasibleError as exc:
        return exc.shortest_jct_s
    raise RuntimeError("a 1-second deadline was feasible")


def timed(problem: Problem, deadline: float, *, confidence: float = 0.95, repeat: int = 3):
    times, cpu, out = [], [], None
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        out = problem.plan(deadline, confidence)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return min(times), statistics.median(times), min(cpu), out


def bench_hyperband(model, types, repeat: int) -> None:
    """Parallel versus sequential brackets, planning time, and the longest bracket alone (as SHA)."""
    print(
        "\n== Hyperband eta=3: sequential vs parallel brackets (quickstart profile and types, 1 worker/trial, "
        "p95, 1000 samples)"
    )
    for big_r in (81, 243):
        brackets = hyperband_brackets(3, 1, big_r)
        hb = [s for b in brackets for s in b]
        j_seq = shortest_jct(Problem(hb, model, types), confidence=0.95)
        started = time.process_time()
        j_par = shortest_jct(Problem(hb, model, types, brackets="parallel"), confidence=0.95)
        cpu_short = time.process_time() - started
        longest = max(shortest_jct(Problem(b, model, types), confidence=0.95) for b in brackets)
        print(
            f"R={big_r} ({len(brackets)} brackets, {len(hb)} stages): shortest feasible JCT sequential "
            f"{j_seq / 60:.0f} min, parallel {j_par / 60:.0f} min (CPU {cpu_short:.2f} s), longest bracket alone "
            f"{longest / 60:.0f} min; parallel/longest {j_par / longest:.2f}, sequential/parallel "
            f"{j_seq / j_par:.2f}x"
        )
        for factor in (1.2, 2.0):
            best, med, cpu, par = timed(Problem(hb, model, types, brackets="parallel"), j_par * factor, repeat=repeat)
            seq_cost = "infeasible"
            if j_seq <= j_par * factor:
                seq_cost = (
                    f"${plan_stages(PlanSpace(hb, types, model, 1), Goal(j_par * factor, 0.95)).result.cost_mean:.2f}"
                )
            static = f"${par.static[1].cost_mean:.2f}" if par.static else "none"
            print(
                f"  deadline {factor}x parallel shortest ({j_par * factor / 60:.0f} min): parallel ${par.result.cost_mean:.2f} "
                f"(offsets {[round(o) for o in par.offsets]} s, {len(par.handoffs)} hand-overs), sequential "
                f"{seq_cost}, static (sequential brackets) {static}; planning wall best {best:.2f} s, median "
                f"{med:.2f} s, CPU {cpu:.2f} s (target <= 1 s for R=243), {par.candidates_evaluated} candidates"
            )


def exact_parallel(problem: Problem, deadline: float, confidence: float):
    """The cheapest parallel-bracket plan with every bracket starting at once, by enumeration.

    Each bracket's stage configurations are enumerated (the planner's efficient options) and kept
    when that bracket alone meets the deadline; combinations are visited in order of a cost lower
    bound (the brackets' costs without hand-overs, less their whole start-up and termination
    bills, the most hand-overs can save) and the search stops when it reaches the best.
    """
    import itertools

    from rubberband.planner.brackets import ParallelSimulator

    stages, model, samples = problem.stages, problem.model, problem.samples
    space = PlanSpace(stages, problem.types, model, 1)
    sim = ParallelSimulator(stages, model, SimSettings(samples=samples, seed=0))
    per_bracket = []
    for b, (lo, hi) in enumerate(sim.ranges):
        kept = []
        for combo in itertools.product(*[space.options(i) for i in range(lo, hi)]):
            res = sim.subs[b].simulate(combo)
            if res.meets(deadline, confidence):
                # a hand-over saves at most the receiving instance's start-up bill and the giver's tail
                tails = sum(
                    c.instances * sim.main.termination_s(c.instance_type) * c.instance_type.price_hr / 3600
                    for c in combo
                )
                kept.append((res.cost_mean, res.cost_mean - res.breakdown["startup"].mean() - tails, combo))
        per_bracket.append(kept)
    combos = sorted(itertools.product(*per_bracket), key=lambda c: sum(x[1] for x in c))
    best, best_cost, visited = None, float("inf"), 0
    for combo in combos:
        if sum(x[1] for x in combo) >= best_cost:
            break
        plan = tuple(c for x in combo for c in x[2])
        res = sim.simulate(plan)
        visited += 1
        if res.meets(deadline, confidence) and res.cost_mean < best_cost:
            best, best_cost = plan, res.cost_mean
    return best, best_cost, visited, len(combos)


def bench_exact_hyperband(model, catalog) -> None:
    print(
        "\n== parallel-bracket plan / exact optimum at zero offsets (small Hyperband, p3.2xlarge + g4dn.xlarge, "
        "1 worker/trial, 300 samples)"
    )
    small_types = [catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge")]
    for eta, big_r in ((3, 9), (2, 4)):
        hb = [s for b in hyperband_brackets(eta, 1, big_r) for s in b]
        j = shortest_jct(Problem(hb, model, small_types, samples=300, brackets="parallel"), confidence=0.9)
        for factor in (1.2, 1.5, 2.0):
            out = plan_stages(
                PlanSpace(hb, small_types, model, 1),
                Goal(j * factor, 0.9),
                SimSettings(samples=300),
                SearchOptions(brackets=BracketSetup()),
            )
            started = time.process_time()
            _, exact, visited, total = exact_parallel(Problem(hb, model, small_types, samples=300), j * factor, 0.9)
            print(
                f"Hyperband R={big_r} eta={eta} deadline {factor}x: plan ${out.result.cost_mean:.3f} (offsets "
                f"{[round(o) for o in out.offsets]}) exact ${exact:.3f} ratio {out.result.cost_mean / exact:.3f} "
                f"({visited} of {total} combinations simulated, {time.process_time() - started:.1f} s)"
            )


def bench_asha(model, types, catalog) -> None:
    """Elastic SHA versus ASHA simulated on the cheapest fixed cluster meeting the same deadline."""
    from rubberband.planner.asha import AshaSchedule, AshaSimulator, asha_baseline

    print("\n== elastic plan vs ASHA on a fixed cluster (same profile, trials, eta, epochs; p95, 1000 / 200 samples)")
    cases = [
        ("SHA n=81 R=27", sha_stages(81, 3, 1, 27), 81, 27, "sequential"),
        ("Hyperband R=81", [s for b in hyperband_brackets(3, 1, 81) for s in b], None, 81, "parallel"),
    ]
    for name, stages, trials, big_r, brackets in cases:
        j = shortest_jct(Problem(stages, model, types, brackets=brackets), confidence=0.95)
        n = trials or sum(s.trials for s in stages if s.index == 0)
        sim = AshaSimulator(model, AshaSchedule(trials=n, eta=3, min_epochs=1, max_epochs=big_r))
        for factor in (1.2, 2.0):
            out = plan_stages(
                PlanSpace(stages, types, model, 1),
                Goal(j * factor, 0.95),
                SimSettings(),
                SearchOptions(brackets=BracketSetup() if brackets == "parallel" else None),
            )
            started = time.process_time()
            found = asha_baseline(sim, types, 1, j * factor, 0.95)
            cpu = time.process_time() - started
            res, meets = found
            c = res.cluster
            print(
                f"{name} ({n} trials), deadline {factor}x shortest ({j * factor / 60:.0f} min): elastic "
                f"${out.result.cost_mean:.2f}; ASHA {c.instances} x {c.instance_type.name} ${res.cost_mean:.2f}, "
                f"JCT p95 {res.jct_quantile(0.95) / 60:.0f} min{'' if meets else ' (misses the deadline)'}; "
                f"ASHA/elastic {res.cost_mean / out.result.cost_mean:.2f}x (ASHA search CPU {cpu:.2f} s)"
            )


def bench_cli(repeat: int) -> None:
    """``rubberband plan`` as a user runs it (a fresh process: imports, loading, planning, the ASHA baseline beside
    the search in a forked child, output): examples/hyperband.yaml at R=243 with a deadline of 1.2x and 2x its
    shortest feasible JCT (parallel brackets, the billed head instance, both regions of each type)."""
    print("\n== rubberband plan from the command line (Hyperband R=243 eta=3, examples/hyperband.yaml's job)")
    spec = yaml.safe_load((ROOT / "examples/hyperband.yaml").read_text())
    spec["scheduler"]["max_epochs"] = 243
    # as a user's Python runs it: bytecode cached after the first run (an environment that forbids writing it,
    # as some sandboxes do with PYTHONDONTWRITEBYTECODE, compiles every module of the package on every run)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    spec["profile"] = str(ROOT / "examples/profiles/resnet50_cifar10_v100.json")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hyperband243.yaml"
        path.write_text(yaml.safe_dump(spec))
        probe = subprocess.run(
            [sys.executable, "-m", "rubberband", "plan", str(path), "--deadline", "1"],
            capture_output=True,
            text=True,
            env=env,
        )
        match = re.search(r"shortest feasible JCT is [^(]*\((\d+) s at", probe.stderr)
        if match is None:
            print(f"  could not read the shortest feasible JCT: {probe.stderr.strip()}")
            return
        shortest_s = float(match.group(1))
        for factor in (1.2, 2.0):
            walls = []
            for _ in range(max(repeat, 3)):
                started = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "rubberband",
                        "plan",
                        str(path),
                        "--deadline",
                        str(round(shortest_s * factor)),
                    ],
                    check=True,
                    capture_output=True,
                    env=env,
                )
                walls.append(time.perf_counter() - started)
            print(
                f"  deadline {factor}x shortest ({shortest_s * factor / 60:.0f} min): wall best {min(walls):.2f} s, "
                f"median {statistics.median(walls):.2f} s (target <= 2 s on 2 cores)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and cases")
    parser.add_argument("--hyperband", action="store_true", help="only the Hyperband and ASHA figures")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    model = fit_performance_model(load_profile(ROOT / "examples/profiles/resnet50_cifar10_v100.json"))
    catalog = load_catalog(["aws"])
    types = [catalog.find(n) for n in QUICKSTART_TYPES]

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs inflate wall times)")
    if args.hyperband:
        bench_hyperband(model, types, repeat)
        bench_cli(repeat)
        bench_exact_hyperband(model, catalog)
        bench_asha(model, types, catalog)
        return
    print("== planning time (1000 samples, 3 instance types: " + ", ".join(QUICKSTART_TYPES) + ")")
    sha = sha_stages(81, 3, 1, 27)
    j_sha = shortest_jct(Problem(sha, model, types), confidence=0.95)
    for factor in (1.2, 2.0):
        best, med, cpu, out = timed(Problem(sha, model, types), j_sha * factor, repeat=repeat)
        print(
            f"SHA n=81 eta=3 r=1 R=27, deadline {factor}x shortest: wall best {best:.2f} s, median {med:.2f} s, "
            f"CPU {cpu:.2f} s (target <= 0.3 s), {out.candidates_evaluated} candidates"
        )
    big = sha_stages(729, 3, 1, 243)
    j_big = shortest_jct(Problem(big, model, types), confidence=0.95)
    for factor in (1.2, 2.0):
        best, med, cpu, out = timed(Problem(big, model, types), j_big * factor, repeat=repeat)
        print(
            f"SHA n=729 eta=3 r=1 R=243, deadline {factor}x shortest: wall best {best:.2f} s, median {med:.2f} s, "
            f"CPU {cpu:.2f} s (target <= 2 s), {out.candidates_evaluated} candidates"
        )
    hb = [s for b in hyperband_brackets(3, 1, 81) for s in b]
    j_hb = shortest_jct(Problem(hb, model, types), confidence=0.95)
    best, med, cpu, out = timed(Problem(hb, model, types), j_hb * 1.5, repeat=repeat)
    print(
        f"Hyperband R=81 eta=3 ({len(hb)} stages), deadline 1.5x shortest: wall best {best:.2f} s, median "
        f"{med:.2f} s, CPU {cpu:.2f} s (target <= 5 s), {out.candidates_evaluated} candidates"
    )

    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs

    mixed = load_job_inputs(ROOT / "examples/mixed.yaml")
    started, cpu0 = time.perf_counter(), time.process_time()
    plan = plan_from_inputs(mixed)
    print(
        f"examples/mixed.yaml (Hyperband R=27 eta=3, aws + gcp catalogs): wall "
        f"{time.perf_counter() - started:.2f} s, CPU {time.process_time() - cpu0:.2f} s, "
        f"{plan.planner.candidates_evaluated} candidates"
    )

    print("\n== plan cost / exact optimum (small cases, 3 types, <= 2 workers/trial, 300 samples)")
    small_types = [catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge", "p3.8xlarge")]
    ratios = []
    cases = [(9, 3, 9), (12, 3, 16), (27, 3, 9), (18, 3, 6), (8, 2, 8)] if not args.quick else [(9, 3, 9), (27, 3, 9)]
    for n, eta, big_r in cases:
        stages = sha_stages(n, eta, 1, big_r)
        j = shortest_jct(Problem(stages, model, small_types, max_workers=2, samples=300), confidence=0.9)
        for factor in (1.2, 1.5, 2.0):
            out = plan_stages(
                PlanSpace(stages, small_types, model, 2),
                Goal(j * factor, 0.9),
                SimSettings(samples=300),
                SearchOptions(include_exact=True),
            )
            ratio = out.result.cost_mean / out.exact[1].cost_mean
            ratios.append(ratio)
            print(
                f"SHA n={n} eta={eta} R={big_r} deadline {factor}x: plan ${out.result.cost_mean:.3f} exact "
                f"${out.exact[1].cost_mean:.3f} ratio {ratio:.3f} (exact: {out.exact_note})"
            )
    print(
        f"cases {len(ratios)}: mean ratio {statistics.mean(ratios):.3f}, max {max(ratios):.3f} (target <= 1.01); "
        f"within 1.01: {sum(r <= 1.01 for r in ratios)}/{len(ratios)}"
    )

    print(
        "\n== best static / plan, plan / work lower bound and plan / deadline-aware bound (quickstart: SHA n=81, "
        "3 types, 1 worker/trial; planner/bounds.py)"
    )
    space = PlanSpace(sha, types, model, 1)
    bound = work_bound(space)
    f_min = Simulator(sha, model, SimSettings(samples=1000)).min_factor()
    for factor in (1.2, 1.5, 2.0):
        deadline = j_sha * factor
        out = plan_stages(PlanSpace(sha, types, model, 1), Goal(deadline, 0.95), SimSettings(samples=1000))
        static = out.static[1].cost_mean if out.static else float("nan")
        rigorous = deadline_bound(space, deadline, Accounting(f_min))
        median = deadline_bound(space, deadline, Accounting(expected=True))
        print(
            f"deadline {factor}x shortest ({deadline:.0f} s): plan ${out.result.cost_mean:.2f}, static "
            f"${static:.2f}, static/plan {static / out.result.cost_mean:.2f}x, plan/work bound "
            f"{out.result.cost_mean / bound:.2f} (bound ${bound:.2f}), plan/deadline-aware bound "
            f"{out.result.cost_mean / rigorous:.2f} (${rigorous:.2f}; of the expected cost "
            f"{out.result.cost_mean / median:.2f}, ${median:.2f})"
        )

    bench_hyperband(model, types, repeat)
    bench_cli(repeat)
    bench_exact_hyperband(model, catalog)
    bench_asha(model, types, catalog)


if __name__ == "__main__":
    main()
