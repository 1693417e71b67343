"""The figures README.md quotes come from commands, and are checked against what those commands print now.

Every ``<!-- output of: COMMAND -->`` block is COMMAND's output (run here, in this process, 120 columns wide), equal
line by line but for the planner's own run time (the plans are seeded: nothing else differs between runs); a block
marked ``(exit N)`` quotes a command that exits N, stderr included (an infeasible plan's one line). The main job's
prose (trials per stage, deadline, instances, predicted saving over the best static plan) is what
``rubberband plan examples/quickstart_local.yaml --json`` plans, and the intro's Hyperband figures are the shortest
JCTs the planner names for examples/hyperband.yaml and examples/hyperband_sequential.yaml. A failure shows the diff.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex

import pytest
from readme_figures import MainJobFigures, hyperband_prose, normalised, quoted_outputs, shortest_jct

from conftest import REPO

pytestmark = pytest.mark.e2e  # whole CLI commands (in this process: they start nothing)
WIDTH = "120"  # the terminal width the quoted outputs were printed at


def _rubberband(cli_here, command: str, exit_code: int = 0) -> str:
    """What ``command`` prints: its stdout, and its stderr too where it exits non-zero (an error is the output)."""
    argv = shlex.split(command)
    assert argv[0] == "rubberband", f"a quoted output must be of a rubberband command, not {command!r}"
    done = cli_here(*argv[1:], cwd=REPO, env={**os.environ, "COLUMNS": WIDTH})
    assert done.returncode == exit_code, done.stderr[-3000:]
    return done.stdout if exit_code == 0 else done.stdout + done.stderr


def test_the_readme_quotes_the_main_job_plan_the_cloud_plan_and_hyperbands_brackets():
    assert [q.command for q in quoted_outputs()] == [
        "rubberband plan examples/quickstart_local.yaml",
        "rubberband plan examples/quickstart.yaml",
        "rubberband plan examples/hyperband.yaml --deadline 1m",
        "rubberband plan examples/hyperband_sequential.yaml --deadline 1m",
    ]


@pytest.mark.parametrize("quoted", quoted_outputs(), ids=lambda q: q.command)
def test_a_quoted_output_is_what_its_command_prints(cli_here, quoted):
    printed = _rubberband(cli_here, quoted.command, quoted.exit_code)
    want, got = normalised(quoted.output), normalised(printed)
    diff = "\n".join(
        difflib.unified_diff(want.splitlines(), got.splitlines(), "README.md", quoted.command, lineterm="")
    )
    assert got == want, f"README.md quotes an output {quoted.command!r} no longer prints (COLUMNS={WIDTH}):\n{diff}"
    print(f"{quoted.command}: {len(want.splitlines())} lines as quoted")


def test_the_main_job_prose_is_what_its_plan_says(cli_here):
    readme = MainJobFigures.from_readme()
    plan = MainJobFigures.from_plan(
        json.loads(_rubberband(cli_here, "rubberband plan examples/quickstart_local.yaml --json"))
    )
    print(f"README: {readme}\nplan:   {plan}")
    assert readme == plan


def test_the_hyperband_prose_is_what_the_planner_says(cli_here):
    said = tuple(
        shortest_jct(_rubberband(cli_here, f"rubberband plan examples/{spec}.yaml --deadline 1m", exit_code=3))
        for spec in ("hyperband", "hyperband_sequential")
    )
    print(
        f"README: brackets side by side {hyperband_prose()[0]}, one after another {hyperband_prose()[1]}; planner: {said}"
    )
    assert hyperband_prose() == said
