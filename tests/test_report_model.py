"""ReportData and charts from a realistic plan: numbers equal the plan's, every chart is a real PNG."""

from __future__ import annotations

import pytest

from report_helpers import FakeReplanner, make_plan
from rubberband.report import charts
from rubberband.report.model import build_report_data
from rubberband.report.source import PlanSource


def test_summary_numbers_come_from_the_plan():
    plan = make_plan(deadline_s=900, level=2)
    data = build_report_data(PlanSource(plan), replan=None)
    s = data.summary
    assert s.jct_p50_s == plan.predicted.jct_s.p50 and s.jct_p95_s == plan.predicted.jct_s.p95
    assert s.cost_mean_usd == plan.predicted.cost_usd.mean
    static = plan.baselines["static"].predicted.cost_usd.mean
    assert s.savings_usd == pytest.approx(static - plan.predicted.cost_usd.mean)
    assert [r.trials for r in data.stages] == [st.trials for st in plan.stages]
    assert "pareto" in data.notes and data.pareto is None


def test_a_stage_replanned_mid_run_shows_its_own_median_and_no_p95_of_the_stage_it_replaced():
    """A run's plan after a re-plan holds the new stages (their median) beside the first plan's distributions: the
    stage table showed "p50 10m 24s, p95 6m 26s" for a re-planned stage (a --cloud sim Hyperband run)."""
    plan = make_plan(deadline_s=900, level=2)
    first = plan.predicted.stage_duration_s[1]
    replanned = plan.stages[1].model_copy(update={"predicted_duration_s": 2.5 * first.p50, "instances": 1})
    run_plan = plan.model_copy(update={"stages": [plan.stages[0], replanned, *plan.stages[2:]]})
    rows = build_report_data(PlanSource(run_plan), replan=None).stages
    assert rows[1].duration_s == pytest.approx(2.5 * first.p50) and rows[1].duration_p95_s is None
    assert rows[0].duration_p95_s == plan.predicted.stage_duration_s[0].p95  # as planned: its own distribution


def test_replanned_sections_and_charts_are_drawn():
    plan = make_plan(deadline_s=900, level=2)
    data = build_report_data(PlanSource(plan), replan=FakeReplanner())
    assert data.pareto is not None and len(data.pareto.points) >= 2
    assert data.clouds is not None and any(row.current for row in data.clouds)
    drawn = charts.draw_all(data).all()
    assert {c.name for c in drawn} == {"gantt_plan", "gantt_static", "distributions", "costs", "pareto"}
    for chart in drawn:
        assert chart.png.startswith(b"\x89PNG") and len(chart.png) > 5000


def test_dollar_axes_keep_tiny_local_costs_apart():
    from rubberband.report.charts import UsdAxis, usd_decimals

    assert usd_decimals([0, 0.0002, 0.0004]) == 4  # a local run's cents would all read "$0.00"
    assert usd_decimals([0, 0.00025, 0.0005]) == 5 and usd_decimals([0, 0.5, 1.0]) == 2
    assert usd_decimals([0, 100, 200]) == 0
    axis = UsdAxis()
    axis.set_locs([0.0, 0.0002, 0.0004])
    assert [axis(v) for v in (0.0, 0.0002, 0.0004)] == ["$0.0000", "$0.0002", "$0.0004"]
