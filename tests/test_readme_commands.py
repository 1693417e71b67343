"""The README's own commands, run exactly as it writes them (read from README.md, so the two cannot drift).

Each runs through bash in a temporary working directory holding a copy of ``examples/`` (what the
commands name), with this environment's ``bin`` first on PATH — the ``rubberband`` a user gets from
``pip install -e .``. The README's install steps and its test command are what ``.ci/run`` runs in a
fresh virtualenv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_figures import README, MainJobFigures

from conftest import REPO

pytestmark = pytest.mark.e2e


def readme_command(prefix: str) -> str:
    """The README's command (or the ``&&``-step of a command line) that starts with ``prefix``."""
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            for step in (s.strip() for s in line.split("&&")):
                if step.startswith(prefix):
                    return step.split("  #", 1)[0].strip()
    raise AssertionError(f"README.md has no command starting with {prefix!r}")


def run_as_user(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    shutil.copytree(REPO / "examples", cwd / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.exclusive  # alone on the machine: it must keep its deadline, and the profile was measured on idle cores
def test_the_main_job_runs_as_the_readme_says(tmp_path):
    """`rubberband run examples/quickstart_local.yaml --yes`: a real elastic run on local Ray nodes.

    It must do what the README says: meet its 80 s deadline (exit 0; 4, late, or 5, stopped at the deadline plus
    the overrun, fail this test), on the plan the README describes (trials per stage, deadline, instances, the
    predicted saving over the best static plan: readme_figures.MainJobFigures), ending with the comparison with
    the best static plan. The figures it compared are printed (shown with the failure, or with -s)."""
    command = readme_command("rubberband run examples/quickstart_local.yaml")
    assert command == "rubberband run examples/quickstart_local.yaml --yes"
    done = run_as_user(command, tmp_path, timeout=600)
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()] if (tmp_path / "runs").is_dir() else []
    assert len(runs) == 1, (done.stdout[-2000:], done.stderr[-3000:])
    run_dir = runs[0]
    readme = MainJobFigures.from_readme()
    ran = MainJobFigures.from_plan(json.loads((run_dir / "plan.json").read_text()))
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").is_file() else {}
    actual, static = result.get("actual") or {}, result.get("static") or {}
    print(
        f"README: {readme}\nrun's plan: {ran}\nrun: exit {done.returncode}, outcome {result.get('outcome')}, "
        f"JCT {_num(actual.get('jct_s'), '.1f')} s of a {readme.deadline_s:.0f} s deadline, cost "
        f"${_num(actual.get('cost_usd'), '.5f')} = {_num(static.get('cost_ratio'), '.2f')}x the best static plan's "
        f"predicted cost (the README: predicted {readme.static_ratio}x cheaper)"
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])  # the README says it meets its deadline
    assert ran == readme
    assert ": best trial" in done.stdout and "vs best static plan" in done.stdout


def _num(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def test_the_cloud_plan_shows_as_the_readme_says(tmp_path):
    """`rubberband plan examples/quickstart.yaml`: a cloud plan with no account."""
    command = readme_command("rubberband plan examples/quickstart.yaml")
    assert command == "rubberband plan examples/quickstart.yaml"
    done = run_as_user(command, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Plan for quickstart-resnet50" in done.stdout and "P(meet deadline)" in done.stdout
