"""bench/bench_suite.py's accounting: which kind each process of a suite run is, and the figures it prints."""

from __future__ import annotations

import pytest
from bench_loader import bench_module


@pytest.fixture(scope="module")
def bench():
    with bench_module("bench_suite") as module:
        yield module


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        ("ray::DashboardAgent", "Ray dashboard agent (per node)"),
        (
            "/v/bin/python -u /v/lib/python3.11/site-packages/ray/dashboard/agent.py --node-ip-address=127.0.0.1",
            "Ray dashboard agent (per node)",
        ),
        ("ray::TrialWorker.run", "trial workers (Ray + torch + DDP)"),
        ("ray::IDLE", "other Ray workers (tasks, idle, never used)"),
        # a worker before its title names the raylet's socket: a worker, not the raylet
        (
            "/v/bin/python /v/ray/_private/workers/default_worker.py --raylet-name=/tmp/x/raylet",
            "other Ray workers (tasks, idle, never used)",
        ),
        ("/v/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/x", "raylet (per node)"),
        ("/v/bin/python3 -m ray.scripts.scripts start --block --address=127.0.0.1:1", "`ray start --block` (per node)"),
        ("/v/bin/python -m rubberband plan examples/quickstart.yaml", "CLI processes"),
        ("/v/bin/python tests/cli_harness.py --test-boot local run spec.yaml", "CLI processes"),
        ("/v/bin/python -m pytest -q", "pytest (controller and workers, moto and the GCE fake in them)"),
        ("sleep 5", "other"),
    ],
)
def test_each_process_is_counted_as_what_it_is(bench, cmdline, kind):
    assert bench.kind_of(cmdline) == kind


def test_the_report_compares_the_cpu_used_with_what_the_target_allows(bench):
    sampler = bench.Sampler(root=1)
    ticks = bench.TICKS
    sampler.processes = {
        (10, 1): bench.Seen(cpu_ticks=120 * ticks, kind="trial workers (Ray + torch + DDP)"),
        (11, 2): bench.Seen(cpu_ticks=60 * ticks, kind="CLI processes"),
    }
    text = bench.report(sampler, wall_s=600.0, cores=2, target_min=8.0, summary="3 passed in 600.00s")
    assert "CPU 3.0 CPU-min = 15% of what the cores offered" in text
    assert "at most 16.0 CPU-min on 2 cores; this run needed 0.19x that" in text
    first, second = [line for line in text.splitlines() if "CPU-min" not in line and "%" in line][:2]
    assert first.startswith("trial workers") and "66.7%" in first and second.startswith("CLI processes")


def test_each_process_goes_to_the_test_its_environment_names(bench):
    environ = b"HOME=/root\0PYTEST_CURRENT_TEST=tests/test_x.py::test_y[a (b)] (call)\0PATH=/bin\0"
    assert bench.test_of(environ) == "tests/test_x.py::test_y[a (b)]"
    assert bench.test_of(b"HOME=/root\0") == ""


def test_the_costliest_tests_are_listed_with_the_nodes_and_workers_they_started(bench):
    ticks = bench.TICKS
    sampler = bench.Sampler(root=1)
    sampler.processes = {
        (10, 1): bench.Seen(cpu_ticks=3 * ticks, kind=bench.WORKER_KIND, test="t::costly"),
        (11, 1): bench.Seen(cpu_ticks=2 * ticks, kind=bench.NODE_KIND, test="t::costly"),
        (12, 1): bench.Seen(cpu_ticks=1 * ticks, kind=bench.NODE_KIND, test="t::cheap"),
        (13, 1): bench.Seen(cpu_ticks=9 * ticks, kind="pytest (controller and workers, moto and the GCE fake in them)"),
    }
    rows = bench.by_test(sampler, top=1)
    assert rows[1].split() == ["t::costly", "5.0", "1", "1"]
    assert len(rows) == 3 and "2 tests started processes; they used 0.1 CPU-min" in rows[2]
    assert bench.by_test(bench.Sampler(root=1), top=5) == ["(no process named its test)"]
