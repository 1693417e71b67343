"""Who survives: the boundary re-plan's prediction of the last stage, and the plan's centre, when configurations
differ in speed (issue 30, item 1), on virtual time.

The real executor runs ``rubberband run --cloud sim`` on the sleepy workload (27 trials, η 3, 1 → 9 epochs) whose
profile holds ten configurations differing in speed (log σ 0.5) and whose scores go with their slowness at ρ
(0: independent; 0.9: the slow configurations are the good ones). The simulated world plays what the profile
says. For each seed it reads the journal: the last stage's duration against the last boundary's re-plan
prediction (the taken proposal's, else the current plan's under the re-fitted model), and the JCT against the
plan's p50. Two predictions side by side:

* ``survivors``: as shipped: the re-plan plays the measured survivors at their own speeds; the plan models who
  survives by the fitted rank correlation;
* ``population``: as before issue 30: the planner's simulator (the plan's and the re-plan's) draws every
  stage's trials from the population: no measured survivors, survivors a random sample.

Prints per workload and prediction the median and worst |predicted − actual| / actual of the last stage, the
median |JCT − plan p50| / plan p50 and the hit rate of the plan's deadline.

    python bench/bench_survivors.py --seeds 12
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from executor_helpers import write_job  # noqa: E402
from sim_helpers import boundary_prediction, write_spread_profile  # noqa: E402

from rubberband.cli import run as cli  # noqa: E402
from rubberband.executor import journal as J  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Figures:
    last_stage_errors: list[float]
    jct_errors: list[float]
    met: int
    runs: int


def _population(stack: contextlib.ExitStack) -> None:
    """The prediction before issue 30: the planner's simulator draws every stage's trials from the population (no
    measured survivors, no speed–quality order). The simulated world still plays the profile's correlation."""
    import rubberband.planner.simulator as simulator

    ranked = simulator.bracket_log_speeds
    stack.enter_context(
        mock.patch.object(simulator, "bracket_log_speeds", lambda v, z, q, known=None: ranked(v, z, None, None))
    )


def run_workload(rho: float, seeds: int, deadline: str, how: str, work: Path) -> Figures:
    spec = write_job(work / "job", trials=27, eta=3, min_epochs=1, max_epochs=9, epoch_s=1.0)
    data = json.loads(spec.read_text())
    data["profile"] = str(write_spread_profile(work / "profile.json", rho=rho))
    last_errors, jct_errors, met = [], [], 0
    with contextlib.ExitStack() as stack:
        if how == "population":
            _population(stack)
        for seed in range(seeds):
            data["seed"] = seed
            spec.write_text(json.dumps(data))
            run_dir = work / f"run-{how}-{rho}-{seed}"
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                code = cli(
                    ["run", str(spec), "--deadline", deadline, "--cloud", "sim", "--yes", "--run-dir", str(run_dir)]
                )
            if code not in (0, 4):
                raise SystemExit(f"run {run_dir} exited {code}")
            events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
            last = max(e["stage"] for e in events if e["type"] == J.STAGE_FINISHED)
            started = [e for e in events if e["type"] == J.STAGE_STARTED and e["stage"] == last][-1]
            finished = [e for e in events if e["type"] == J.STAGE_FINISHED and e["stage"] == last][-1]
            actual = finished["t"] - started["t"]
            last_errors.append(abs(boundary_prediction(events, last) - actual) / actual)
            result = json.loads((run_dir / "result.json").read_text())
            p50 = result["predicted"]["jct_s"]
            jct_errors.append(abs(result["actual"]["jct_s"] - p50) / p50)
            met += result["outcome"] == "met"
    return Figures(last_errors, jct_errors, met, seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--deadline", default="40s", help="the runs' deadline (the plan's p90 JCT is ~35 s)")
    args = parser.parse_args()
    print(
        f"{'workload':<26} {'prediction':<11} {'last stage |err| med':>21} {'max':>7} {'JCT |err| med':>14} {'met':>6}"
    )
    with tempfile.TemporaryDirectory(prefix="rb-survivors-") as tmp:
        for rho in (0.0, 0.9):
            for how in ("population", "survivors"):
                f = run_workload(rho, args.seeds, args.deadline, how, Path(tmp) / f"{how}-{rho}")
                print(
                    f"{f'speed spread σ 0.5, ρ {rho:.1f}':<26} {how:<11} "
                    f"{statistics.median(f.last_stage_errors):>21.1%} {max(f.last_stage_errors):>7.1%} "
                    f"{statistics.median(f.jct_errors):>14.1%} {f.met:>3}/{f.runs}"
                )


if __name__ == "__main__":
    main()
