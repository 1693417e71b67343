"""The README's main job (examples/quickstart_local.yaml) shows the point: its plan is elastic, and a
run ends by setting its actual cost and JCT beside the best static plan's (predicted), with the ratio.

The real run of the quickstart is measured by ``bench/bench_executor.py`` (beside a real static run of
the same job); the run's printing is tested here on its result.json content.
"""

from __future__ import annotations

import pytest
from conftest import REPO
from executor_helpers import make_plan, write_job

from rubberband.execution import print_summary
from rubberband.executor import journal as J
from rubberband.executor.result import Ending, build_result
from rubberband.inputs import load_job_inputs
from rubberband.plan import Alternative
from rubberband.planner import PlanOptions, plan_job
from rubberband.planner.schedule import stages_for
from rubberband.spec import load_spec


def test_the_quickstart_is_wide_first_and_its_plan_is_elastic_and_cheaper_than_static():
    inputs = load_job_inputs(REPO / "examples" / "quickstart_local.yaml")
    sched = inputs.spec.scheduler
    stages = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    assert stages[0].trials >= 27 and stages[-1].trials == 1  # a wide first stage, one survivor
    plan = plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(samples=300, seed=0))
    counts = [s.instances for s in plan.stages]
    assert max(counts) > 1 and counts[-1] == 1  # grows for the wide stages, ends on one instance
    static = plan.baselines["static"]
    assert static.predicted.cost_usd.mean > 1.15 * plan.predicted.cost_usd.mean
    assert plan.predicted.jct_s.p50 < 90  # about a minute on 2 cores


def _static_alternative(plan, cost_usd: float, jct_s: float) -> Alternative:
    stages = [
        s.model_copy(update={"instance_type": "local.cpu2", "instances": 3, "workers_per_trial": 2})
        for s in plan.stages
    ]
    predicted = plan.predicted.model_copy(
        update={
            "cost_usd": plan.predicted.cost_usd.model_copy(update={"mean": cost_usd}),
            "jct_s": plan.predicted.jct_s.model_copy(update={"p50": jct_s}),
        }
    )
    return Alternative(name="static", stages=stages, predicted=predicted)


def test_a_run_ends_with_its_cost_beside_the_best_static_plan(tmp_path, capsys):
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu1", 1, 1)], durations=[30.0, 20.0])
    plan = plan.model_copy(update={"baselines": {"static": _static_alternative(plan, 0.004, 67.0)}})
    run_dir = tmp_path / "run"
    journal = J.Journal(run_dir)
    journal.record(
        J.RunStarted(
            t=1000.0,
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=75.0,
        )
    )
    journal.record(
        J.InstanceRequested(t=1000.0, id="n1", instance_type="local.cpu2", cloud="local", price_hr=0.10, stage=0)
    )
    journal.record(J.StageStarted(t=1005.0, stage=0))
    journal.record(J.StageFinished(t=1035.0, stage=0))
    journal.record(J.StageStarted(t=1035.0, stage=1))
    journal.record(J.StageFinished(t=1072.0, stage=1))
    journal.record(J.InstanceTerminated(t=1072.0, id="n1"))
    result = build_result(
        J.read_state(run_dir),
        plan,
        spec,
        Ending("finished", None, 1073.0),
        run_dir,
    )
    cost = 72 * 0.10 / 3600
    assert result["actual"]["cost_usd"] == pytest.approx(cost)
    assert result["static"] == {
        "instance_type": "local.cpu2",
        "instances": 3,
        "workers_per_trial": 2,
        "predicted_cost_usd": 0.004,
        "predicted_jct_s": 67.0,
        "cost_ratio": pytest.approx(cost / 0.004),
    }
    print_summary("r1", "loss", result, run_dir / "result.json")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "vs best static plan (3 × local.cpu2, 2 workers/trial; predicted): JCT 1m 07s, cost $0.0040; "
        f"this run: JCT 1m 12s, cost $0.0020 = {cost / 0.004:.2f}× the static cost (saved $0.0020)"
    )

    no_static = plan.model_copy(update={"baselines": {}})
    assert (
        build_result(
            J.read_state(run_dir),
            no_static,
            spec,
            Ending("finished", None, 1073.0),
            run_dir,
        )["static"]
        is None
    )
