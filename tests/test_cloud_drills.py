"""Fault drills (tests/drills.py; the whole matrix is bench/bench_drills.py): the CLI, the executor, the head machine
or the watchdog killed at one call of each phase of a run, or 5 % of API calls failing; after each drill and a
`down --all-orphans`, nothing rubberband created is left, and the user's look-alike resources and a live run are
spared (routers counted: the GCP workers' Cloud NAT and subnetwork; identities: the GCP head role's run bindings). moto server and the GCE fake; no Ray. (No drill has found a leak past `down`; these keep it so.)"""

from __future__ import annotations

import logging

import pytest
from cloud_helpers import moto_env, moto_server  # noqa: F401  (fixtures)
from gce_fake import gce_fake  # noqa: F401  (fixture)

import drills

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _check(world, outcomes: list) -> None:
    for o in outcomes:
        assert sum(o.after.values()) == 0, (o.name, o.roles, dict(o.after))
        assert o.survivors_ok, (o.name, o.roles)


@pytest.fixture
def aws_world(moto_env, tmp_path, monkeypatch):
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    return drills.make_world("aws", tmp_path, patch=monkeypatch.setattr)


@pytest.fixture
def gcp_world(gce_fake, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    return drills.make_world("gcp", tmp_path, fake=gce_fake, patch=monkeypatch.setattr)


def test_gcp_every_role_killed_at_every_step_leaves_nothing_after_down(gcp_world):
    """Every call of every phase (the GCE fake answers at once: about 80 drills in a few seconds)."""
    calls = drills.census(gcp_world)
    kills = drills.kill_points(calls, per_phase=1000)
    assert {(k.role, k.phase) for k in kills} == set(drills.PHASES)
    outcomes = [drills.run_drill(gcp_world, kill=kill) for kill in kills]
    assert any(sum(o.before.values()) for o in outcomes), "some kill leaves resources that only the sweep ends"
    assert any(o.before["routers"] for o in outcomes), "some kill leaves the workers' Cloud NAT to the sweep"
    assert any(o.before["identities"] for o in outcomes), "some kill leaves the head role's run binding to the sweep"
    _check(gcp_world, outcomes)


def test_gcp_random_api_errors_leave_nothing_after_down(gcp_world):
    outcomes = [drills.run_drill(gcp_world, error_rate=0.05, seed=seed) for seed in range(5)]
    assert sum(o.injected for o in outcomes) > 0
    _check(gcp_world, outcomes)


def test_aws_roles_killed_mid_phase_leave_nothing_after_down(aws_world):
    """One kill in the middle of each phase that leaves something to the sweep (moto: ~5 s a drill; the bench runs
    every phase)."""
    calls = drills.census(aws_world)
    phases = [("cli", "start"), ("head", "stage-1"), ("cli", "teardown"), ("watchdog", "teardown")]
    kills = [
        drills.Kill(role, phase, calls[("executor" if role == "head" else role, phase)] // 2) for role, phase in phases
    ]
    outcomes = [drills.run_drill(aws_world, kill=kill) for kill in kills]
    _check(aws_world, outcomes)


def test_aws_random_api_errors_leave_nothing_after_down(aws_world):
    outcomes = [drills.run_drill(aws_world, error_rate=0.05, seed=seed) for seed in range(2)]
    assert sum(o.injected for o in outcomes) > 0
    _check(aws_world, outcomes)
