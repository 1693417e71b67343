"""bench/bench_planner_gap.py's generator and gap computation on a handful of cases (no timings asserted)."""

from __future__ import annotations

import pytest
from bench_loader import bench_module


@pytest.fixture(scope="module")
def bench():
    with bench_module("bench_planner_gap") as module:
        yield module


def test_the_generator_is_seeded_and_covers_the_workload_kinds(bench):
    drawn = bench.workloads(40, seed=3)
    assert [w.label for w in drawn] == [w.label for w in bench.workloads(40, seed=3)]
    assert {w.brackets for w in drawn} == {"sequential", "parallel"}
    assert any(w.label.split()[1] == "SHA" for w in drawn) and any(w.label.split()[1] == "HB" for w in drawn)
    assert {len(w.types) for w in drawn} == {1, 2, 3, 4}
    assert all(1.05 <= w.factor <= 3.0 for w in drawn)


def test_a_few_cases_measure_a_gap_no_better_than_the_exact_optimum(bench):
    gaps = [bench.measure(w) for w in bench.workloads(4, seed=1)]
    known = [g for g in gaps if g.known]
    assert known
    for g in known:
        # the exact optimum is the cheapest plan meeting the deadline; the bounds are below it
        assert g.ratio >= 1 - 1e-9 and g.descent_ratio >= 1 - 1e-9
        assert g.deadline_bound <= g.exact * (1 + 1e-9)
    lines = bench.table(gaps)
    assert lines[0].startswith("cases 4:") and any(line.startswith("plan / exact") for line in lines)


@pytest.mark.parametrize("case", [153, 81, 14])
def test_sequential_hyperband_cases_the_planner_missed_are_now_within_1_percent(bench, case):
    """Drawn cases (seed 0) the planner left 45 %, 23 % and 1.4 % above the exact optimum: the first two because
    a later bracket's screen booted the instances its first stage adds (the full simulation prefetches them), the
    third because no move offered a stage its neighbour's very configuration."""
    w = bench.workloads(case + 1, seed=0)[case]
    assert w.brackets == "sequential" and "HB" in w.label
    g = bench.measure(w)
    assert g.known and 1 - 1e-9 <= g.ratio <= 1.01, (g.ratio, w.label)
