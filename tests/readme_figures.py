"""The figures README.md quotes, read from its text, so tests can hold them against the commands that make them.

Two kinds: command output quoted verbatim (a ```text block after ``<!-- output of: COMMAND -->``), and the main
job's figures in its prose (trials per stage, deadline, instances, predicted saving), which must be what the main
job's plan says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conftest import REPO

README = (REPO / "README.md").read_text()
#: A quoted command output: the command in an HTML comment (with ``(exit N)`` where it exits N, quoting what it
#: writes to stderr too), then the text block that is its output.
OUTPUT_BLOCK = re.compile(
    r"<!-- output of: (?P<command>.+?)(?: \(exit (?P<exit>\d+)\))? -->\n```text\n(?P<output>.*?)```", re.S
)
#: The planner's own run time, the one figure of ``rubberband plan`` that differs between runs of the same seed.
PLANNING_TIME = re.compile(r"Planned in \d+(\.\d+)? s")
#: The intro's Hyperband figure: the shortest JCT with brackets side by side, and one after another.
HYPERBAND = re.compile(
    r"can promise (?P<parallel>\d+h \d+m) at p95 .*? rather than (?P<sequential>\d+h \d+m) one bracket"
)
#: What ``rubberband plan --deadline`` says of a deadline no plan meets.
SHORTEST = re.compile(r"the shortest feasible JCT is (?P<jct>\d+h \d+m) ")
MAIN_JOB = re.compile(
    r"(?P<trials>\d+) trials cut to (?P<cut>[\d, and]+?) by an? (?P<deadline>\d+)-second deadline, so the plan runs "
    r"the wide stages on (?P<wide>\d+) instances and the last one on (?P<last>\d+), .*?"
    r"\(predicted (?P<ratio>\d+\.\d+)× cheaper\)"
)


@dataclass(frozen=True)
class QuotedOutput:
    command: str
    exit_code: int
    output: str


def quoted_outputs() -> list[QuotedOutput]:
    """Every quoted output block, in README order."""
    return [QuotedOutput(m["command"], int(m["exit"] or 0), m["output"]) for m in OUTPUT_BLOCK.finditer(README)]


def normalised(output: str) -> str:
    """Output as compared: trailing spaces and blank edge lines dropped (rich pads its tables), the planning time
    masked."""
    text = "\n".join(line.rstrip() for line in output.strip("\n").splitlines())
    return PLANNING_TIME.sub("Planned in … s", text)


@dataclass(frozen=True)
class MainJobFigures:
    """The main job as the README's prose describes it."""

    trials: tuple[int, ...]  # per stage
    deadline_s: float
    wide_instances: int  # every stage but the last
    last_instances: int
    static_ratio: str  # the best static plan's predicted cost / the plan's, as printed (2 decimals)

    @classmethod
    def from_readme(cls) -> "MainJobFigures":
        found = MAIN_JOB.search(" ".join(README.split()))
        assert found, "README.md no longer describes the main job as test_readme_figures expects (MAIN_JOB)"
        cut = tuple(int(n) for n in re.findall(r"\d+", found["cut"]))
        return cls(
            trials=(int(found["trials"]), *cut),
            deadline_s=float(found["deadline"]),
            wide_instances=int(found["wide"]),
            last_instances=int(found["last"]),
            static_ratio=found["ratio"],
        )

    @classmethod
    def from_plan(cls, plan: dict) -> "MainJobFigures":
        """The same figures from a plan JSON (``rubberband plan --json``, a run's plan.json)."""
        stages = plan["stages"]
        wide = {s["instances"] for s in stages[:-1]}
        assert len(wide) == 1, f"the wide stages run on different instance counts: {sorted(wide)}"
        static = plan["baselines"]["static"]["predicted"]["cost_usd"]["mean"]
        return cls(
            trials=tuple(s["trials"] for s in stages),
            deadline_s=float(plan["deadline_s"]),
            wide_instances=wide.pop(),
            last_instances=stages[-1]["instances"],
            static_ratio=f"{static / plan['predicted']['cost_usd']['mean']:.2f}",
        )


def hyperband_prose() -> tuple[str, str]:
    """The shortest JCTs the intro quotes for Hyperband's brackets side by side and one after another."""
    found = HYPERBAND.search(" ".join(README.split()))
    assert found, "README.md no longer quotes Hyperband's brackets as test_readme_figures expects (HYPERBAND)"
    return found["parallel"], found["sequential"]


def shortest_jct(message: str) -> str:
    """The shortest feasible JCT an infeasible ``rubberband plan`` names."""
    found = SHORTEST.search(message)
    assert found, f"not an infeasible plan's message: {message!r}"
    return found["jct"]
