"""Re-planning a parallel-bracket run mid-run: how long one bracket's stage boundary takes to plan.

    python bench/bench_parallel_replan.py [--repeat 3]

Hyperband R=81 and R=243, η=3, on the quickstart profile and types (1 worker per trial), planned with
parallel brackets at 1.2× the shortest feasible JCT. Then, at the predicted moment the longest bracket
(bracket 0) ends its first stage, every bracket's remainder is re-planned as the executor does
(``parallel_remainder``: the stages not started yet, each bracket from when its running stage ends or
its offset comes; ``plan_stages(brackets="parallel", offsets=...)``) against the deadline left, and
with 5 % less time left (a run behind plan: the re-plan buys speed). Prints the planning wall and CPU
time per boundary and the remainder's cost and P(meet) before and after (no assertions). The executor's
loop waits for the re-plan at every bracket's boundary, so it should take about a second.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.brackets import BracketSetup, ParallelSimulator, bracket_ranges, parallel_remainder
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import hyperband_brackets
from rubberband.planner.search import Goal, PlanSpace
from rubberband.planner.simulator import RunningState, SimSettings
from rubberband.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
TYPES = ("p3.2xlarge", "g4dn.xlarge", "g5.xlarge")
CONFIDENCE = 0.95


def remainder_at_first_boundary(stages, out):
    """Bracket 0's boundary after its first stage (median times): the remainder, each of its brackets' running
    instances (its current stage's, which its next stage keeps on the same type) and the time it comes."""
    ranges = bracket_ranges(stages)
    medians = [float(np.median(d)) for d in out.result.stage_durations]
    now = out.offsets[0] + medians[0]
    parts, states = [], {}

    def running(g):
        c = out.configs[g]
        return RunningState(c.instance_type.key, c.instances)

    for b, (lo, hi) in enumerate(ranges):
        if b == 0:
            parts.append((list(range(1, hi)), 0.0))
            states[1] = running(0)
            continue
        t = out.offsets[b]
        if t >= now:  # not started yet: all of it, from its offset
            parts.append((list(range(lo, hi)), t - now))
            states[lo] = RunningState("", 0)
            continue
        for g in range(lo, hi):  # the stage it runs now: its rest first
            if t + medians[g] > now:
                parts.append((list(range(g + 1, hi)), t + medians[g] - now))
                states[g + 1] = running(g)
                break
            t += medians[g]
        else:
            parts.append(([], 0.0))
    rest = parallel_remainder(parts, 0)
    return rest, [states[i] for i in rest.positions if i in states], now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = fit_performance_model(load_profile(ROOT / "examples/profiles/resnet50_cifar10_v100.json"))
    catalog = load_catalog(["aws"])
    types = [catalog.find(n) for n in TYPES]
    print(
        "== re-planning a parallel Hyperband run at bracket 0's first boundary (quickstart profile and types, "
        f"p{CONFIDENCE * 100:.0f}, 1000 samples)"
    )
    for big_r in (81, 243):
        hb = [s for b in hyperband_brackets(3, 1, big_r) for s in b]
        try:
            plan_stages(
                PlanSpace(hb, types, model, 1),
                Goal(1.0, CONFIDENCE),
                SimSettings(),
                SearchOptions(brackets=BracketSetup()),
            )
            raise RuntimeError("a 1-second deadline was feasible")
        except InfeasibleError as exc:
            deadline = exc.shortest_jct_s * 1.2
        out = plan_stages(
            PlanSpace(hb, types, model, 1),
            Goal(deadline, CONFIDENCE),
            SimSettings(),
            SearchOptions(brackets=BracketSetup()),
        )
        rest, states, now = remainder_at_first_boundary(hb, out)
        stages = [hb[i] for i in rest.positions]
        configs = [out.configs[i] for i in rest.positions]
        current = ParallelSimulator(
            stages, model, SimSettings(start_state=states[0]), BracketSetup(offsets=rest.offsets_s, states=states)
        ).simulate(configs)
        print(
            f"R={big_r}: plan {len(hb)} stages, deadline {deadline / 60:.0f} min; at {now / 60:.1f} min the "
            f"remainder is {len(stages)} stages of {len(rest.offsets_s)} brackets (offsets "
            f"{[round(o) for o in rest.offsets_s]} s)"
        )
        for label, left in (("on plan", deadline - now), ("behind: 5% less time", 0.95 * (deadline - now))):
            walls, cpus, res = [], [], None
            for _ in range(args.repeat):
                wall, cpu = time.perf_counter(), time.process_time()
                try:
                    res = plan_stages(
                        PlanSpace(stages, types, model, 1),
                        Goal(left, CONFIDENCE),
                        SimSettings(start_state=states[0]),
                        SearchOptions(brackets=BracketSetup(offsets=rest.offsets_s, states=states)),
                    )
                except InfeasibleError as exc:
                    res = exc
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            after = (
                "infeasible (shortest " + f"{res.shortest_jct_s / 60:.1f} min)"
                if isinstance(res, InfeasibleError)
                else f"${res.result.cost_mean:.2f}, P(meet) {res.result.p_meet(left):.2f}"
            )
            print(
                f"  {label} ({left / 60:.1f} min left): current remainder ${current.cost_mean:.2f}, P(meet) "
                f"{current.p_meet(left):.2f}; re-plan {after}; planning wall best {min(walls):.2f} s, "
                f"CPU best {min(cpus):.2f} s"
            )


if __name__ == "__main__":
    main()
