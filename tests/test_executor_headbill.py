"""The run's head instance in the actual bill: journaled once by the executor (head mode), billed by the
one billing function from its launch until its results grace after the run's end, in result.json's total
and its own ``head_usd``, outside the stages; the report shows it beside the prediction's."""

from __future__ import annotations

import json

import pytest
from executor_helpers import make_plan, write_job

from rubberband.catalog import BILLING_RULES
from rubberband.cloud.backend import BilledHead, HeadHandle
from rubberband.cloud.head_run import OnHeadCloudBackend
from rubberband.cloud.provider import Instance
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.result import Ending, build_result, write_result
from rubberband.plan import CostBreakdown
from rubberband.report import write_report
from rubberband.report.model import build_report_data
from rubberband.report.source import RunSource
from rubberband.spec import load_spec


@pytest.fixture
def spec(tmp_path):
    return load_spec(write_job(tmp_path / "job"))


def _journal_with_head(run_dir, spec, plan, *, head: bool = True) -> None:
    journal = J.Journal(run_dir)
    journal.record(
        J.RunStarted(
            t=1000.0,
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="aws",
            deadline_s=3600.0,
        )
    )
    if head:  # launched 90 s before the executor started on it; grace 600 s
        journal.record(
            J.HeadInstance(
                t=1000.5,
                id="i-head",
                instance_type="m6i.large",
                cloud="aws",
                price_hr=0.096,
                launched_at=910.0,
                grace_s=600.0,
            )
        )
    journal.record(
        J.InstanceRequested(t=1001.0, id="w1", instance_type="p3.2xlarge", cloud="aws", price_hr=3.06, stage=0)
    )
    journal.record(J.StageStarted(t=1060.0, stage=0))
    journal.record(J.StageFinished(t=1500.0, stage=0))
    journal.record(J.StageStarted(t=1500.0, stage=1))
    journal.record(J.StageFinished(t=1800.0, stage=1))
    journal.record(J.InstanceTerminated(t=1801.0, id="w1"))


def test_a_journaled_head_is_billed_launch_to_end_plus_grace_outside_the_stages(tmp_path, spec):
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 2)])
    plan = plan.model_copy(
        update={"predicted": plan.predicted.model_copy(update={"cost_breakdown": CostBreakdown(head_usd=0.05)})}
    )  # what the planner predicted for the head
    with_head, without = tmp_path / "a", tmp_path / "b"
    _journal_with_head(with_head, spec, plan)
    _journal_with_head(without, spec, plan, head=False)
    state = J.read_state(with_head)
    assert state.head is not None and state.head.id == "i-head" and state.head.launched_at == 910.0
    assert "i-head" not in state.instances  # never terminated (or orphan-swept) as a worker
    bill, bare = bill_run(state, now=1802.0), bill_run(J.read_state(without), now=1802.0)
    lifetime = 1802.0 + 600.0 - 910.0
    rule = BILLING_RULES["aws"]
    assert bill.head.lifetime_s == pytest.approx(lifetime)
    assert bill.head_usd == pytest.approx(rule.billed_seconds(lifetime) * 0.096 / 3600)
    assert bill.total_usd == pytest.approx(bare.total_usd + bill.head_usd)
    assert bill.workers_usd == pytest.approx(bare.total_usd) and bill.by_stage == bare.by_stage

    result = build_result(
        state,
        plan,
        spec,
        Ending("finished", None, 1802.0),
        with_head,
    )
    assert result["actual"]["cost_usd"] == pytest.approx(bill.total_usd)
    assert result["actual"]["head_usd"] == pytest.approx(bill.head_usd) and result["predicted"]["head_usd"] == 0.05
    assert result["head"]["id"] == "i-head" and result["head"]["grace_s"] == 600.0
    assert sum(s["actual_cost_usd"] for s in result["stages"]) == pytest.approx(bill.workers_usd)
    write_result(result, with_head)
    json.loads((with_head / "result.json").read_text())

    # the report reads it back: total with the head, the head beside the prediction's
    source = RunSource.from_dir(with_head)
    assert source.outcome.head_usd == pytest.approx(bill.head_usd)
    assert source.outcome.cost_usd == pytest.approx(bill.total_usd)
    data = build_report_data(source, replan=None)
    assert data.actual.head_usd == pytest.approx(bill.head_usd) and data.actual.predicted_head_usd == 0.05
    assert [s.usd for s in data.costs.overhead if s.label == "head instance"] == [0.05]
    html = write_report(source, tmp_path / "report", replan=False).read_text()
    assert f'data-field="actual.head_usd" data-value="{bill.head_usd!r}"' in html
    assert "Head instance:" in (tmp_path / "report" / "report.md").read_text()


def test_the_head_backend_names_the_billed_head_and_a_local_head_bills_nothing(tmp_path):
    head = Instance(
        id="i-head",
        cloud="aws",
        instance_type="m6i.large",
        zone="us-east-1a",
        state="running",
        run_id="rb-r1",
        address="10.0.0.5",
        launched_at=123.0,
    )
    backend = OnHeadCloudBackend(
        cloud="aws", run_dir=tmp_path, regions=["us-east-1"], head_instance=head, head_grace_s=300.0
    )
    handle = backend.start_head("r1")
    assert handle.billed == BilledHead(
        id="i-head", instance_type="m6i.large", cloud="aws", price_hr=0.096, launched_at=123.0, grace_s=300.0
    )
    assert HeadHandle(address="127.0.0.1:1", id="x").billed is None
