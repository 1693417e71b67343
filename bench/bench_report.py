"""Report benchmark: seconds to generate the quickstart report (target < 10 s).

    python bench/bench_report.py [--samples N]

Plans ``examples/quickstart.yaml`` with the real planner (as ``rubberband plan`` does), then
times ``write_report`` end to end with the default re-planner (cost-vs-deadline sweep and cloud
comparison re-plan the job ~11 times) and without re-planning (charts and HTML/Markdown only).
Prints the figures and the ratio to the target; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rubberband.inputs import load_job_inputs
from rubberband.planning import PlanningOptions, plan_from_inputs
from rubberband.report import write_report

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="Monte Carlo samples of the plan (CLI default)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    inputs = load_job_inputs(str(ROOT / "examples" / "quickstart.yaml"))
    plan = plan_from_inputs(
        inputs, deadline_s=None, confidence=None, cloud=None, options=PlanningOptions(samples=args.samples)
    )
    plan_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        html = write_report(plan, Path(tmp) / "full")
        full_s = time.perf_counter() - t0
        size = html.stat().st_size
        t0 = time.perf_counter()
        write_report(plan, Path(tmp) / "bare", replan=False)
        bare_s = time.perf_counter() - t0
    print(f"plan (quickstart, {args.samples} samples): {plan_s:.2f} s")
    print(f"report with re-planning:    {full_s:.2f} s  ({full_s / TARGET_S:.2f} of the {TARGET_S:.0f} s target)")
    print(f"report without re-planning: {bare_s:.2f} s  (charts + HTML + Markdown)")
    print(f"re-planning share:          {(full_s - bare_s) / full_s:.0%}")
    print(f"report.html size:           {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
