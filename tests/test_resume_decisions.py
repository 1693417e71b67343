"""A resumed executor takes up every decision the killed one had taken (virtual time, public seams only).

The run's decision state — spot or on-demand, fall-backs, failover's substitutes, the types re-planned around,
losses, noticed and replaced instances, prefetched stages, the deadline passed — is the fold of its journal
(``executor/runstate.py``). Each scenario below is run once unkilled, then killed (``kill -9``: nothing more
reaches the journal or the cloud, :class:`~sim_helpers.KillingJournal`) between every pair of consecutive
decision kinds it takes, and resumed in the same simulated world (its instances still running, as a real
cloud's would be). The resumed run must (1) find exactly the unkilled run's decision state at that point,
(2) take no decision that state rules out — buy spot after the run moved to on-demand, fail over again to a
type failover already replaced, re-plan around a type again, journal the deadline's passing twice, decide a
prefetch again (though a prefetched stage's instances, gone with the orphans, are requested again before it
starts), replace an instance twice, number losses afresh — and (3) end as the unkilled run ends, with the same
best trial.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from executor_helpers import make_plan, write_hyperband_job, write_job
from sim_helpers import KillingJournal, Killed, SimCase, cpu_model

from rubberband.catalog import Catalog, load_catalog
from rubberband.executor import journal as J
from rubberband.executor.run import Settings
from rubberband.executor.simulated import SimScript
from rubberband.spec import load_spec


def _catalog() -> Catalog:
    """The local catalog plus a second 2-worker CPU type, what failover can take when local.cpu2 is sold out."""
    local = load_catalog(["local"])
    cpu2 = local.find("local.cpu2", cloud="local")
    alt = dataclasses.replace(cpu2, name="local.cpu2b", price_hr=0.12, spot_price_hr=0.05)
    return Catalog(types=local.types + (alt,), dates=dict(local.dates))


def _brackets(tmp_path: Path, *, deadline_s: float, script: SimScript) -> SimCase:
    """Hyperband (two brackets side by side, the second 5 s late) on spot local.cpu2, 5 s epochs."""
    _, spec = write_hyperband_job(tmp_path, epoch_s=5.0)
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 2, 1), ("local.cpu2", 1, 1)], durations=[15, 20, 20])
    plan = plan.model_copy(
        update={
            "stages": [s.model_copy(update={"spot": True}) for s in plan.stages],
            "brackets": "parallel",
            "bracket_offsets_s": [0.0, 5.0],
            "deadline_s": deadline_s,
        }
    )
    return SimCase(
        spec,
        plan,
        catalog=_catalog(),
        model=cpu_model(epoch_s=5.0, startup_s=3.0),
        script=script,
        settings=Settings(overrun_s=math.inf),
    )


def _sha(tmp_path: Path) -> SimCase:
    """SHA over 9 trials whose middle stage needs a second instance (requested ahead), with a lost one."""
    spec = load_spec(write_job(tmp_path / "job", trials=9, eta=3, min_epochs=1, max_epochs=9, epoch_s=2.0))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 2, 1), ("local.cpu2", 1, 1)], durations=[12, 12, 12])
    return SimCase(spec, plan, model=cpu_model(epoch_s=2.0, startup_s=3.0), script=SimScript(losses={2: 2.0}))


def _recovering(tmp_path: Path) -> SimCase:
    """SHA on spot whose plan is pessimistic (30 s a stage, 10 s in fact): the slack is short at the start, so
    the run moves to on-demand, and grows back as the stages end early. Once moved, the run stays on-demand
    (the spot policy's ``return_factor``), so the next stage's instances requested ahead are on-demand too."""
    spec = load_spec(write_job(tmp_path / "job", trials=9, eta=3, min_epochs=1, max_epochs=9, epoch_s=2.0))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 2, 1), ("local.cpu2", 1, 1)], durations=[30, 30, 30])
    plan = plan.model_copy(
        update={"stages": [s.model_copy(update={"spot": True}) for s in plan.stages], "deadline_s": 90.0}
    )
    return SimCase(spec, plan, model=cpu_model(epoch_s=2.0, startup_s=3.0), settings=Settings(overrun_s=math.inf))


SCENARIOS = {
    # failover (substitutes, a re-plan around the sold-out type), a hand-over, a notice, a loss, replacements
    "brackets": lambda p: _brackets(
        p, deadline_s=60.0, script=SimScript(notices={2: 4.0}, losses={1: 12.0}, sold_out=frozenset({"local.cpu2"}))
    ),
    # the deadline passes and the spot policy moves the run to on-demand
    "late": lambda p: _brackets(p, deadline_s=26.0, script=SimScript(sold_out=frozenset({"local.cpu2"}))),
    # prefetch, carry-over and release, a lost on-demand node and its replacement
    "sha": _sha,
    # on-demand for good once moved there, though the slack grows back
    "recovering": _recovering,
}


def _decisions(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == J.DECISION]


def _kill_points(decisions: list[dict]) -> list[int]:
    """One kill after the first decision of each pair of consecutive decision kinds (and after the first one)."""
    seen: set[tuple[str, str]] = set()
    points = [1]
    for k in range(1, len(decisions)):
        pair = (decisions[k - 1]["kind"], decisions[k]["kind"])
        if pair not in seen:
            seen.add(pair)
            points.append(k)
    return sorted(set(points))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_run_killed_between_any_two_decisions_resumes_with_the_same_decisions(tmp_path, scenario):
    case = SCENARIOS[scenario](tmp_path / "job")
    whole = case.run(tmp_path / "whole")
    assert whole.error is None and whole.result is not None and whole.result.status == "finished"
    events = whole.events
    decisions = _decisions(events)
    kinds = {d["kind"] for d in decisions}
    assert len(kinds) >= 6, kinds  # the scenario takes decisions of many kinds
    for k in _kill_points(decisions):
        run_dir = tmp_path / f"killed-{k}"
        sim = case.world()
        killed = case.run(run_dir, sim=sim, journal=KillingJournal(run_dir, after=k, clock=sim.clock))
        assert isinstance(killed.error, Killed), (k, killed.error)
        before = J.read_state(run_dir)
        # (1) the state the resumed executor starts from is the unkilled run's at that point
        upto = events.index(decisions[k - 1]) + 1
        assert before.choices == J.fold(events[:upto]).choices, k
        resumed = case.run(run_dir, sim=sim, resume=True)
        assert resumed.error is None and resumed.result is not None, (k, resumed.error)
        written = resumed.events
        after = written[next(i for i, e in enumerate(written) if e["type"] == J.RUN_RESUMED) :]
        _assert_takes_up(before.choices, after, case, k)
        _assert_prefetched_again(before, after, k)
        # (3) it ends as the unkilled run does
        assert resumed.result.status == "finished" and resumed.result.best_trial == whole.result.best_trial, k


def _assert_prefetched_again(before: J.RunState, after: list[dict], k: int) -> None:
    """A stage whose instances were requested ahead (they went with the orphans) has them requested again while
    the stage before still runs, not only at its start."""
    for g in before.choices.prefetched - set(before.stages):
        unfinished = [t for t in before.trials.values() if g - 1 not in t.finished_stages and g - 1 in before.stages]
        if not unfinished:  # the stage before had nothing left to run: the next one starts at once anyway
            continue
        started = [e["t"] for e in after if e["type"] == J.STAGE_STARTED and e["stage"] == g]
        asked = [e["t"] for e in after if e["type"] == J.INSTANCE_REQUESTED and e["stage"] == g]
        assert started and asked and min(asked) < min(started), (k, g)


def _assert_takes_up(choices: J.DecisionState, after: list[dict], case: SimCase, k: int) -> None:
    """(2) nothing after the resume contradicts a decision taken before the kill."""
    spot_stages = {i for i, s in enumerate(case.plan.stages) if s.spot}
    if not choices.on_spot:  # moved to on-demand for good
        assert all(e["market"] == "on_demand" for e in after if e.get("kind") == "spot"), k
        assert not [e for e in after if e["type"] == J.INSTANCE_REQUESTED and e["spot"]], k
    for planned, obtained in choices.substitutes.items():  # requested as what failover obtained: no failover again
        name = planned.rsplit(":", 1)[-1]
        assert not [e for e in after if e.get("kind") == "failover" and e.get("requested") == name], (k, planned)
        requested = {
            e["instance_type"] for e in after if e["type"] == J.INSTANCE_REQUESTED and e["stage"] in spot_stages
        }
        assert name not in requested, (k, requested)
    for e in after:
        if e.get("kind") == "replan" and e.get("trigger") == "failover":
            assert not set(e["unavailable"]) <= choices.replanned_around, (k, e)
        if e.get("kind") == "deadline_passed":
            assert not choices.deadline_passed, k
        if e.get("kind") == "prefetch":
            assert e["stage"] not in choices.prefetched, (k, e)
        if e.get("kind") == "replace" and e.get("id") is not None:
            assert e["id"] not in choices.replaced, (k, e)
        if e.get("kind") == "notice":
            assert e["id"] not in choices.noticed, (k, e)
    lost = [e for e in after if e["type"] == J.INSTANCE_LOST]
    if lost:  # losses are counted over the run, not afresh
        assert lost[0]["losses"] == choices.losses + 1, (k, lost[0])
