"""The figures README.md quotes come from commands, and are checked against what those commands print now.

Every ``<!-- output of: COMMAND -->`` block is COMMAND's output (run here, in this process, 120 columns wide), equal
line by line but for the planner's own run time (the plans are seeded: nothing else differs between runs). The main
job's prose (trials per stage, deadline, instances, predicted saving over the best static plan) is what
``rubberband plan examples/quickstart_local.yaml --json`` plans. A failure shows the command's output to paste.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex

import pytest
from readme_figures import MainJobFigures, normalised, quoted_outputs

from conftest import REPO

pytestmark = pytest.mark.e2e  # whole CLI commands (in this process: they start nothing)
WIDTH = "120"  # the terminal width the quoted outputs were printed at


def _rubberband(cli_here, command: str) -> str:
    argv = shlex.split(command)
    assert argv[0] == "rubberband", f"a quoted output must be of a rubberband command, not {command!r}"
    done = cli_here(*argv[1:], cwd=REPO, env={**os.environ, "COLUMNS": WIDTH})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_readme_quotes_the_main_job_plan_and_the_cloud_plan():
    assert [command for command, _ in quoted_outputs()] == [
        "rubberband plan examples/quickstart_local.yaml",
        "rubberband plan examples/quickstart.yaml",
    ]


@pytest.mark.parametrize("command", [command for command, _ in quoted_outputs()])
def test_a_quoted_output_is_what_its_command_prints(cli_here, command):
    quoted = dict(quoted_outputs())[command]
    printed = _rubberband(cli_here, command)
    want, got = normalised(quoted), normalised(printed)
    diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "README.md", command, lineterm=""))
    assert got == want, f"README.md quotes an output {command!r} no longer prints (COLUMNS={WIDTH}):\n{diff}"
    print(f"{command}: {len(want.splitlines())} lines as quoted")


def test_the_main_job_prose_is_what_its_plan_says(cli_here):
    readme = MainJobFigures.from_readme()
    plan = MainJobFigures.from_plan(
        json.loads(_rubberband(cli_here, "rubberband plan examples/quickstart_local.yaml --json"))
    )
    print(f"README: {readme}\nplan:   {plan}")
    assert readme == plan
