"""The ASHA baseline beside the planner's search (planner/beside.py, rubberband/forked.py).

The forked child is exercised for real in a fresh interpreter (the test runner's own threads make the CLI's
guard refuse to fork here, as it should): a result from another process, the child's exception raised in the
parent, a cancelled child gone by its pid, and a child that dies without a result run again in the parent. The
CLI's end-to-end tests (``rubberband plan`` in a subprocess: test_readme_commands.py, test_bad_input_e2e.py) fork
it as users' commands do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import rubberband.forked as forked
from rubberband.errors import InfeasibleError
from rubberband.inputs import load_job_inputs
from rubberband.planner import PlanOptions, plan_job
from rubberband.planner.beside import Deferred

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_python(code: str) -> dict:
    """``code`` in a fresh single-threaded interpreter; it prints one JSON object."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="forks on Linux, >= 2 CPUs")
def test_work_runs_in_a_forked_child_and_its_result_or_error_comes_back():
    got = run_python(
        """
        import json, os, time
        from rubberband.forked import ForkedWork, beside_in_child, can_fork

        parent = os.getpid()
        ok = beside_in_child(lambda: os.getpid())
        kind = type(ok).__name__
        child_pid = ok.result()

        def fails():
            raise KeyError("from the child")
        try:
            beside_in_child(fails).result()
            error = None
        except KeyError as exc:
            error = str(exc)

        # a child that dies without a result: the work runs again here
        dies = beside_in_child(lambda: os._exit(3) if os.getpid() != parent else "ran here")
        again = dies.result()

        slow = beside_in_child(lambda: time.sleep(60))
        pid = slow.pid
        slow.cancel()
        try:
            os.kill(pid, 0)
            gone = False
        except ProcessLookupError:
            gone = True
        print(json.dumps({"can_fork": can_fork(), "kind": kind, "parent": parent, "child": child_pid,
                          "error": error, "again": again, "gone": gone}))
        """
    )
    assert got["can_fork"] and got["kind"] == "ForkedWork"
    assert got["child"] != got["parent"]
    assert got["error"] == "'from the child'"
    assert got["again"] == "ran here"
    assert got["gone"]


def test_with_other_threads_running_the_work_is_deferred_to_this_process(monkeypatch):
    monkeypatch.setattr(forked.threading, "active_count", lambda: 2)
    assert not forked.can_fork()
    ran = []
    pending = forked.beside_in_child(lambda: ran.append(os.getpid()) or "done")
    assert isinstance(pending, Deferred) and ran == []  # nothing runs until asked
    assert pending.result() == "done" and ran == [os.getpid()]
    pending.cancel()


class Recording:
    """A :data:`~rubberband.planner.beside.Beside` that runs the work when asked, and records what happened."""

    def __init__(self) -> None:
        self.started = self.asked = self.cancelled = 0

    def __call__(self, work):
        self.started += 1
        outer = self

        class Pending:
            def result(self):
                outer.asked += 1
                return work()

            def cancel(self):
                outer.cancelled += 1

        return Pending()


def test_the_planner_hands_the_asha_baseline_to_its_beside_and_plans_the_same():
    inputs = load_job_inputs(EXAMPLES / "quickstart.yaml")
    beside = Recording()
    alone = plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(samples=200))
    along = plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(samples=200, beside=beside))
    assert (beside.started, beside.asked) == (1, 1)
    assert along.asha is not None and along.asha == alone.asha
    assert along.stages == alone.stages
    # no baseline asked for: nothing is started
    quiet = Recording()
    plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(samples=200, asha=False, beside=quiet))
    assert quiet.started == 0


def test_a_search_that_fails_cancels_the_baseline_beside_it():
    inputs = load_job_inputs(EXAMPLES / "quickstart.yaml")
    beside = Recording()
    with pytest.raises(InfeasibleError):
        plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(deadline_s=1.0, samples=200, beside=beside))
    assert (beside.started, beside.asked, beside.cancelled) == (1, 0, 1)


def test_region_twins_are_planned_once_and_spot_keeps_every_region():
    from rubberband.planner.offerings import region_twins_merged

    catalog = load_job_inputs(EXAMPLES / "quickstart.yaml").catalog
    east, west = catalog.find("g5.xlarge", region="us-east-1"), catalog.find("g5.xlarge", region="us-west-2")
    assert region_twins_merged([east, west]) == [east]
    dearer = replace(west, price_hr=west.price_hr * 1.1)
    assert region_twins_merged([east, dearer]) == [east, dearer]
