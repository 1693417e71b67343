"""Parallel vs sequential Hyperband brackets, planned and run for real on the local backend.

    python bench/bench_brackets.py [--max-epochs 9] [--deadline 100s] [--out DIR]

The quickstart's synthetic workload and measured profile (``examples/quickstart_local.yaml``) as a
Hyperband job (η=3, R = ``--max-epochs``), planned by the real planner twice at the same deadline —
``brackets: parallel`` and ``brackets: sequential`` — and each plan run by the executor on real local
Ray nodes (a lane per bracket, hand-overs between brackets). Prints, per
mode: the plan's predicted JCT (p50) and mean cost, the actual JCT and cost, the relative errors,
and how many instances were handed between brackets (planned in the representative sample, and done).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import yaml

from rubberband.catalog import load_catalog
from rubberband.cloud.local.provider import LocalProvider
from rubberband.executor import journal as J
from rubberband.executor.run import Executor, Job, Settings, Target
from rubberband.executor.runtime import TrialRuntime
from rubberband.inputs import load_job_inputs
from rubberband.planner import PlanOptions, plan_job
from rubberband.units import parse_duration

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart_local.yaml"


def hyperband_spec(directory: Path, max_epochs: int) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": max_epochs}
    data["profile"] = str((QUICKSTART.parent / data["profile"]).resolve())
    data["name"] = "hyperband-local"
    (directory / "synthetic.py").write_text((QUICKSTART.parent / "synthetic.py").read_text())
    path = directory / "hyperband_local.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-epochs", type=int, default=9)
    parser.add_argument("--deadline", default="100s")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=["parallel", "sequential"], default=None)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    base = args.out or Path(tempfile.mkdtemp(prefix="rb-bench-brackets-"))
    base.mkdir(parents=True, exist_ok=True)
    inputs = load_job_inputs(hyperband_spec(base, args.max_epochs))
    deadline_s = parse_duration(args.deadline)
    print(f"runs under {base}; Hyperband R={args.max_epochs}, η=3, deadline {deadline_s:.0f}s")
    rows = []
    for mode in [args.only] if args.only else ["parallel", "sequential"]:
        plan = plan_job(
            inputs.spec,
            inputs.profile,
            inputs.catalog,
            PlanOptions(deadline_s=deadline_s, samples=1000, seed=0, brackets=mode, asha=False),
        )
        run_dir = base / f"run-{mode}"
        executor = Executor(
            Job(inputs.spec, plan, load_catalog(["local"])),
            Target(run_dir.name, run_dir, LocalProvider(run_dir), TrialRuntime.load()),
            Settings(deadline_s=3 * plan.deadline_s),
        )
        actual = executor.run().result["actual"]
        events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
        done = sum(1 for e in events if e["type"] == J.DECISION and e.get("kind") == "handoff")
        row = (
            mode,
            plan.brackets,
            plan.predicted.jct_s.p50,
            actual["jct_s"],
            plan.predicted.cost_usd.mean,
            actual["cost_usd"],
            len(plan.handoffs),
            done,
        )
        rows.append(row)
        print(
            f"{mode}: plan says {plan.brackets}; JCT {actual['jct_s']:.1f}s (pred {row[2]:.1f}s), cost "
            f"${actual['cost_usd']:.5f} (pred ${row[4]:.5f}), hand-overs {done} (planned {row[6]})",
            flush=True,
        )
    print()
    print(
        f"{'mode':<11}{'plan':<11}{'JCT pred':>9}{'JCT act':>9}{'err':>7}{'$ pred':>10}{'$ act':>10}{'err':>7}"
        f"{'handoffs plan/done':>20}"
    )
    for mode, brackets, jp, ja, cp, ca, hp, hd in rows:
        print(
            f"{mode:<11}{brackets:<11}{jp:>8.1f}s{ja:>8.1f}s{abs(ja - jp) / ja:>7.1%}{cp:>10.5f}{ca:>10.5f}"
            f"{abs(ca - cp) / ca:>7.1%}{f'{hp}/{hd}':>20}"
        )


if __name__ == "__main__":
    main()
