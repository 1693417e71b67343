"""Typed journal events: every model round-trips, versions load or are refused, a damaged line is named, and the
live writer's incrementally folded state equals the fold of the whole file (with another process appending)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rubberband.errors import RunDirError
from rubberband.executor import decision_events as D
from rubberband.executor import events as E
from rubberband.executor import journal as J

DOCS = Path(__file__).resolve().parents[1] / "docs" / "executor.md"

START = dict(
    run_id="r1",
    spec_sha256="abc",
    spec={"name": "job"},
    plan={"stages": [{"bracket": 0}]},
    cloud="local",
    deadline_s=600.0,
)

#: one event of every type, with every field its writers set
SAMPLES: list[E._Event] = [
    J.RunStarted(t=1.0, **START, trial_runtime="rubberband.executor.trials", pid=7, on_late="finish"),
    J.RunResumed(t=2.0, run_id="r1", attempt=2, pid=8, on_late="stop"),
    J.RunFinished(
        t=3.0,
        reason=None,
        best_trial="b0-t000",
        best_metric=0.5,
        rung={"stage": 1, "bracket": 0},
        outcome="met",
        jct_s=100.0,
        cost_usd=1.5,
    ),
    J.RunFailed(
        t=3.0, reason="boom", best_trial=None, best_metric=None, rung=None, outcome="failed", jct_s=1.0, cost_usd=0.0
    ),
    J.RunInterrupted(t=3.0, reason="SIGINT"),
    J.RunStopped(t=3.0, reason="deadline", outcome="stopped"),
    J.PlanChanged(t=4.0, stage=1, plan={"stages": [{"bracket": 0}, {"bracket": 0}]}),
    J.Prefetch(
        t=5.0,
        stage=1,
        count=2,
        instance_type="local.cpu2",
        estimated_remaining_s=3.0,
        lead_s=2.0,
        quantile=0.9,
    ),
    J.InstanceRequested(
        t=6.0,
        id="n1",
        instance_type="g4dn.2xlarge",
        cloud="aws",
        region="us-east-1",
        price_hr=0.75,
        spot=True,
        stage=0,
        zone="us-east-1a",
        requested_type="g4dn.xlarge",
    ),
    J.InstanceReady(t=7.0, id="n1", startup_s=1.0),
    J.InstanceLost(
        t=8.0, id="n1", reason="spot-interruption", instance_type="g4dn.2xlarge", stage=0, trials=["b0-t000"], losses=1
    ),
    J.InstanceTerminated(t=8.0, id="n1", reason="lost"),
    J.HeadInstance(
        t=1.5, id="i-head", instance_type="m6i.large", cloud="aws", price_hr=0.096, launched_at=0.5, grace_s=600.0
    ),
    J.StageStarted(
        t=9.0,
        stage=0,
        bracket=0,
        stage_in_bracket=0,
        trials=9,
        to_run=9,
        epochs=1,
        instance_type="local.cpu2",
        instances=2,
        workers_per_trial=1,
        predicted_duration_s=20.0,
        offset_s=0.0,
    ),
    J.StageFinished(
        t=10.0,
        stage=0,
        bracket=0,
        metrics={"b0-t000": 0.5, "b0-t001": None},
        promoted=["b0-t000"],
        ranking=["b0-t000", "b0-t001"],
    ),
    J.TrialCreated(t=1.0, trial_id="b0-t000", bracket=0, index=0, config={"lr": 0.01, "opt": "adam"}),
    J.TrialStarted(
        t=9.5,
        trial_id="b0-t000",
        stage=0,
        start_epoch=0,
        end_epoch=1,
        workers=2,
        instances=["n1", "n2"],
        placement=["n1", "n2"],
        from_checkpoint=None,
    ),
    J.Epoch(t=9.6, trial_id="b0-t000", epoch=0, metrics={"loss": 0.5}, seconds=0.1),
    J.Checkpoint(t=9.7, trial_id="b0-t000", epoch=0, path="/x/epoch-0.pt"),
    J.TrialStopped(
        t=9.8,
        trial_id="b0-t000",
        stage=0,
        reason="instance_lost",
        metric=None,
        error="lost",
        start_epoch=0,
        end_epoch=1,
        seconds=0.3,
        setup_s=None,
        checkpoint_epoch=0,
        lost=["n1"],
        note="x",
        devices=["cpu", "cpu"],
        gpu_ids=[[0], [1]],
    ),
    J.TrialPromoted(t=10.0, trial_id="b0-t000", from_stage=0, to_stage=1, metric=0.5, rank=0),
]


#: one decision of each kind, with the fields the executor writes
DECISION_SAMPLES: list[E._Event] = [
    J.HeadStarted(t=1.0, address="127.0.0.1:6379", pid=42),
    J.OrphanHeadStopped(t=1.0),
    J.Down(t=1.0, terminated=2),
    J.Keep(t=1.0, id="n1", stage=1),
    J.Release(t=1.0, id="n1", stage=0, reason="idle: stage 0 needs it no more"),
    J.Handoff(
        t=1.0,
        id="n1",
        instance_type="local.cpu2",
        from_stage=0,
        to_stage=3,
        from_bracket=0,
        to_bracket=1,
        request="req4",
        request_outcome="cancelled",
    ),
    J.Replace(t=1.0, id="n1", stage=0, token="req5", instance_type="local.cpu2", reason="lost", spot=True),
    J.Failover(
        t=1.0,
        id="n2",
        stage=0,
        requested="g5.xlarge",
        obtained="g4dn.xlarge",
        requested_key="aws:us-east-1:g5.xlarge",
        obtained_key="aws:us-east-1:g4dn.xlarge",
        substituted=True,
        zone="us-east-1a",
        requested_price_hr=1.0,
        obtained_price_hr=0.5,
        attempts=["g5.xlarge@us-east-1a: capacity"],
        reason="g5.xlarge unavailable in every zone; failover took g4dn.xlarge",
    ),
    J.AshaPhase(t=1.0, phase=1, instances=2, alive=4),
    J.SpotDecision(
        t=1.0,
        stage=0,
        for_stage=0,
        trigger="preemption",
        id="n1",
        previous="spot",
        market="on_demand",
        confidence=0.9,
        quantile=0.5,
        time_left_s=100.0,
        work_left_s=90.0,
        restart_s=20.0,
        slack_s=-10.0,
        margin_s=0.0,
        reason="slack short",
    ),
    J.NoticeTaken(t=1.0, id="n1", stage=0, cloud="aws", action="terminate", notice_time="T", trials=["b0-t000"]),
    J.NoticeWatcherFailed(t=1.0, id="n1", started=False, error="no node"),
    J.DeadlinePassed(t=1.0, stage=2, elapsed_s=80.0, deadline_s=75.0, overrun_s=None, note="late"),
    J.Replan(
        t=1.0,
        stage=1,
        elapsed_s=30.0,
        predicted_remaining_s=40.0,
        slowdown=1.1,
        at_risk=False,
        action="continue",
        accepted=False,
        reason="current plan is as cheap and on time",
        trigger="failover",
        unavailable=["aws:us-east-1:g5.xlarge"],
        substitutions={"g5.xlarge": "g4dn.xlarge"},
        stages=[1, 2],
        offsets_s=[0.0],
    ),
]
SAMPLES = SAMPLES + DECISION_SAMPLES


def test_every_event_type_has_a_sample_and_the_docs_name_each_one():
    assert {type(e).model_fields["type"].default for e in SAMPLES} == set(E.MODELS) | {"decision"}
    documented: set[str] = set()
    for row in re.findall(r"^\| (`[a-z_]+`(?: / `[a-z_]+`)*) \|", DOCS.read_text(), flags=re.M):
        documented |= set(re.findall(r"`([a-z_]+)`", row))
    assert documented == set(E.MODELS) | {"decision"}


def test_every_decision_kind_has_a_sample_and_the_docs_name_each_one():
    assert {e.kind for e in SAMPLES if isinstance(e, D._Decision)} == set(D.DECISIONS)
    (row,) = re.findall(r"^\| `decision` \|(.*)\|$", DOCS.read_text(), flags=re.M)
    assert set(D.DECISIONS) <= set(re.findall(r"`([a-z_]+)`", row))


def test_a_decision_of_a_kind_this_code_does_not_know_is_skipped_and_unknown_fields_dropped():
    assert E.parse_event({"type": "decision", "kind": "from_the_future", "t": 1.0}) is None
    keep = E.parse_event({"type": "decision", "kind": "keep", "t": 1.0, "id": "n1", "stage": 0, "newer": 1})
    assert keep == J.Keep(t=1.0, id="n1", stage=0)
    with pytest.raises(ValidationError, match="stage"):
        E.parse_event({"type": "decision", "kind": "keep", "t": 1.0, "id": "n1", "stage": "first"})


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_event_round_trips_through_its_journal_line(event, tmp_path):
    line = J.encode_line(E.to_json_dict(event))
    raw = json.loads(line)
    assert raw["type"] == type(event).model_fields["type"].default and raw["t"] == event.t
    assert E.parse_event(raw) == event
    assert E.EVENT_ADAPTER.validate_python(raw) == event
    # written by the journal, read back alike
    J.append_event(tmp_path / "j.jsonl", event)
    assert [E.parse_event(r) for r in J.iter_events(tmp_path / "j.jsonl")] == [event]


def test_the_line_holds_what_the_writer_set_under_the_old_field_names():
    """The JSON is the untyped journal's: fields the writer set (None included), optional ones left out."""
    line = E.to_json_dict(J.TrialStopped(t=1.0, trial_id="a", stage=0, reason="failed", metric=None))
    assert line == {"type": "trial_stopped", "t": 1.0, "trial_id": "a", "stage": 0, "reason": "failed", "metric": None}
    only_when = E.to_json_dict(
        J.InstanceRequested(id="n", instance_type="x", price_hr=1.0, requested_type=None, zone=None)
    )
    assert "requested_type" not in only_when and only_when["zone"] is None


def test_writers_get_a_validation_error_for_a_wrong_or_unknown_field(tmp_path):
    with pytest.raises(ValidationError, match="bogus"):
        J.TrialStarted(trial_id="a", stage=0, start_epoch=0, end_epoch=1, bogus=1)
    with pytest.raises(ValidationError, match="price_hr"):
        J.InstanceRequested(id="n", instance_type="x", price_hr="cheap")
    journal = J.Journal(tmp_path)
    with pytest.raises(TypeError, match="typed event"):
        journal.record({"type": "epoch", "trial_id": "a", "epoch": 0})  # type: ignore[arg-type]
    assert not journal.path.exists() or journal.path.read_bytes() == b""


def test_the_writer_stamps_the_version_and_the_time_from_its_clock(tmp_path):
    journal = J.Journal(tmp_path, clock=SimpleNamespace(time=lambda: 1234.5))
    written = journal.record(J.RunStarted(**START))
    assert isinstance(written, J.RunStarted) and written.t == 1234.5
    (line,) = J.iter_events(journal.path)
    assert line["journal_version"] == E.JOURNAL_VERSION == 2 and line["t"] == 1234.5
    journal.record(J.Keep(id="n1", stage=0))
    assert journal.state.decisions == [{"type": "decision", "t": 1234.5, "kind": "keep", "id": "n1", "stage": 0}]


# -- versions --------------------------------------------------------------------------------------------------

V1_JOURNAL = [  # as the untyped writer (journal version 1) wrote them: no journal_version, fields as dicts had them
    {
        "type": "run_started",
        "run_id": "r1",
        "spec_sha256": "abc",
        "spec": {"name": "job"},
        "plan": {"stages": [{"bracket": 0}, {"bracket": 0}]},
        "cloud": "local",
        "deadline_s": 600.0,
        "trial_runtime": "rubberband.executor.trials",
        "pid": 7,
        "on_late": "finish",
        "t": 1000.0,
    },
    {"type": "trial_created", "trial_id": "b0-t000", "bracket": 0, "index": 0, "config": {"lr": 0.1}, "t": 1000.1},
    {
        "type": "instance_requested",
        "t": 1001.0,
        "id": "n1",
        "instance_type": "local.cpu2",
        "cloud": "local",
        "region": None,
        "price_hr": 0.1,
        "spot": False,
        "stage": 0,
        "zone": None,
    },
    {"type": "instance_ready", "t": 1005.0, "id": "n1", "startup_s": 4.0},
    {
        "type": "stage_started",
        "stage": 0,
        "bracket": 0,
        "stage_in_bracket": 0,
        "trials": 1,
        "to_run": 1,
        "epochs": 1,
        "instance_type": "local.cpu2",
        "instances": 1,
        "workers_per_trial": 1,
        "predicted_duration_s": 20.0,
        "t": 1005.0,
    },
    {
        "type": "trial_started",
        "trial_id": "b0-t000",
        "stage": 0,
        "start_epoch": 0,
        "end_epoch": 1,
        "workers": 1,
        "instances": ["n1"],
        "placement": ["n1"],
        "from_checkpoint": None,
        "t": 1005.5,
    },
    {"type": "epoch", "trial_id": "b0-t000", "epoch": 0, "metrics": {"loss": 0.25}, "seconds": 1.0, "t": 1006.0},
    {"type": "checkpoint", "trial_id": "b0-t000", "epoch": 0, "path": "/c/epoch-0.pt", "t": 1006.1},
    {
        "type": "trial_stopped",
        "trial_id": "b0-t000",
        "stage": 0,
        "reason": "finished",
        "metric": 0.25,
        "error": None,
        "start_epoch": 0,
        "end_epoch": 1,
        "seconds": 1.2,
        "setup_s": 0.1,
        "checkpoint_epoch": 0,
        "devices": ["cpu"],
        "t": 1006.2,
    },
    {
        "type": "stage_finished",
        "stage": 0,
        "bracket": 0,
        "metrics": {"b0-t000": 0.25},
        "promoted": ["b0-t000"],
        "ranking": ["b0-t000"],
        "t": 1006.3,
    },
    {"type": "decision", "kind": "release", "id": "n1", "stage": 0, "reason": "idle", "t": 1006.4},
    {"type": "instance_terminated", "t": 1007.0, "id": "n1", "reason": "idle: stage 0 needs it no more"},
    {
        "type": "run_finished",
        "t": 1008.0,
        "reason": None,
        "best_trial": "b0-t000",
        "best_metric": 0.25,
        "rung": {"stage": 0},
        "outcome": "met",
        "jct_s": 8.0,
        "cost_usd": 0.01,
    },
]


def _write_raw(run_dir: Path, events: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / J.JOURNAL_NAME
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_a_version_1_journal_loads_as_before(tmp_path):
    _write_raw(tmp_path, V1_JOURNAL)
    state = J.read_state(tmp_path)
    assert state.finished and state.result["best_trial"] == "b0-t000"
    trial = state.trials["b0-t000"]
    assert trial.finished_stages == {0: 0.25} and trial.checkpoint_path == "/c/epoch-0.pt"
    assert trial.epochs == {0: {"loss": 0.25}} and trial.epoch_runs == {0: 1}
    life = state.instances["n1"]
    assert (life.requested_at, life.ready_at, life.terminated_at, life.cloud) == (1001.0, 1005.0, 1007.0, "local")
    assert state.completed_stages() == [0] and state.stages[0].predicted_duration_s == 20.0
    assert [d["kind"] for d in state.decisions] == ["release"]
    assert state == J.fold(V1_JOURNAL)


@pytest.mark.parametrize("written", [E.JOURNAL_VERSION + 1, str(E.JOURNAL_VERSION + 1)])
def test_a_journal_from_a_newer_rubberband_is_refused_in_one_line(tmp_path, written):
    path = _write_raw(
        tmp_path, [{**V1_JOURNAL[0], "journal_version": written, "a_field_of_the_future": 1}, *V1_JOURNAL[1:]]
    )
    with pytest.raises(RunDirError) as caught:
        J.read_state(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and f"{path}:1" in message
    assert f"version {E.JOURNAL_VERSION + 1}" in message and "upgrade rubberband" in message


def test_unknown_event_types_and_fields_of_a_newer_minor_version_are_skipped(tmp_path):
    events = [
        {**V1_JOURNAL[0], "journal_version": E.JOURNAL_VERSION},
        *V1_JOURNAL[1:3],
        {"type": "a_future_event", "t": 1002.0, "whatever": [1]},
        {**V1_JOURNAL[3], "a_future_field": {"x": 1}},
    ]
    _write_raw(tmp_path, events)
    state = J.read_state(tmp_path)
    assert state.instances["n1"].ready_at == 1005.0


# -- damage ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, field, value",
    [(3, "price_hr", {"usd": 1}), (6, "start_epoch", "first"), (2, "config", None), (7, "epoch", None)],
)
def test_a_damaged_line_is_named_with_its_field(tmp_path, line, field, value):
    events = [dict(e) for e in V1_JOURNAL]
    if value is None and field == "epoch":
        del events[line - 1][field]
    else:
        events[line - 1][field] = value
    path = _write_raw(tmp_path, events)
    before = path.read_bytes()
    with pytest.raises(RunDirError) as caught:
        J.read_state(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: the journal's {events[line - 1]['type']!r} event is damaged")
    assert f"field {field!r}" in message
    assert "repair or delete that line (keep a copy), then resume" in message
    assert f"`rubberband down {tmp_path}` ends the run's instances" in message
    assert path.read_bytes() == before


def test_run_started_without_its_time_is_damage(tmp_path):
    path = _write_raw(tmp_path, [{k: v for k, v in V1_JOURNAL[0].items() if k != "t"}])
    with pytest.raises(
        RunDirError, match=re.escape(f"{path}:1: the journal's 'run_started' event is damaged (field 't'")
    ):
        J.read_state(tmp_path)


def test_torn_lines_are_skipped_and_a_journal_without_a_start_is_no_run(tmp_path):
    path = _write_raw(tmp_path, V1_JOURNAL)
    with open(path, "ab") as handle:
        handle.write(b'{"type": "epoch", "trial_id": "b0-t0')
    assert J.read_state(tmp_path) == J.fold(V1_JOURNAL)
    _write_raw(tmp_path, V1_JOURNAL[1:])
    with pytest.raises(RunDirError, match="has no journal of a run"):
        J.read_state(tmp_path)


def test_a_damaged_line_appended_by_another_writer_surfaces_at_state_not_at_record(tmp_path):
    journal = J.Journal(tmp_path)
    journal.record(J.RunStarted(**START))
    assert journal.state.run_id == "r1"
    J.append_event(journal.path, {"type": "epoch", "trial_id": "a", "epoch": "x"})  # not through the model
    journal.record(J.InstanceTerminated(id="n1", reason="teardown"))  # teardown's records never fail on it
    with pytest.raises(RunDirError, match=r":2: the journal's 'epoch' event is damaged \(field 'epoch'"):
        journal.state  # noqa: B018


def test_the_sink_validates_what_workers_send(tmp_path):
    path = tmp_path / J.JOURNAL_NAME
    sink = J.JournalSink(str(path))
    with pytest.raises(ValidationError, match="epoch"):
        sink.record({"type": "epoch", "trial_id": "a"})
    assert not path.exists()
    sink.record(J.Checkpoint(trial_id="a", epoch=1, path="/p", t=3.0))
    sink.record({"type": "epoch", "trial_id": "a", "epoch": 1, "t": 4.0})
    assert [e["type"] for e in J.iter_events(path)] == ["checkpoint", "epoch"]


# -- the live fold -----------------------------------------------------------------------------------------------

TRIALS, INSTANCES = ["t0", "t1", "t2"], ["n0", "n1"]
times = st.floats(0.0, 1e6, allow_nan=False)
metric = st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False))


def _events() -> st.SearchStrategy:
    trial, inst, stage, epoch = (
        st.sampled_from(TRIALS),
        st.sampled_from(INSTANCES),
        st.integers(0, 3),
        st.integers(0, 4),
    )
    return st.one_of(
        st.builds(
            J.TrialCreated,
            t=times,
            trial_id=trial,
            bracket=st.integers(0, 1),
            index=st.integers(0, 9),
            config=st.fixed_dictionaries({"lr": st.floats(0.001, 1.0)}),
        ),
        st.builds(
            J.Epoch,
            t=times,
            trial_id=trial,
            epoch=epoch,
            metrics=st.fixed_dictionaries({"loss": st.floats(0, 10)}),
            seconds=times,
        ),
        st.builds(J.Checkpoint, t=times, trial_id=trial, epoch=epoch, path=st.just("/p")),
        st.builds(
            J.TrialStopped,
            t=times,
            trial_id=trial,
            stage=stage,
            reason=st.sampled_from(["finished", "failed", "instance_lost"]),
            metric=metric,
            checkpoint_epoch=st.one_of(st.none(), epoch),
        ),
        st.builds(
            J.InstanceRequested,
            t=times,
            id=inst,
            instance_type=st.just("local.cpu2"),
            price_hr=st.floats(0, 10),
            spot=st.booleans(),
            stage=stage,
        ),
        st.builds(J.InstanceReady, t=times, id=inst, startup_s=times),
        st.builds(J.InstanceLost, t=times, id=inst, reason=st.sampled_from(["lost", "spot-interruption", None])),
        st.builds(J.InstanceTerminated, t=times, id=inst, reason=st.sampled_from(["lost", "teardown"])),
        st.builds(
            J.HeadInstance,
            t=times,
            id=st.just("h"),
            instance_type=st.just("m6i.large"),
            price_hr=st.just(0.1),
            launched_at=st.one_of(st.none(), times),
        ),
        st.builds(J.StageStarted, t=times, stage=stage, predicted_duration_s=st.one_of(st.none(), times)),
        st.builds(
            J.StageFinished,
            t=times,
            stage=stage,
            metrics=st.dictionaries(trial, metric, max_size=3),
            promoted=st.lists(trial, max_size=2),
        ),
        st.builds(J.Handoff, t=times, id=inst, to_stage=stage),
        st.builds(J.PlanChanged, t=times, stage=stage, plan=st.just({"stages": [{"bracket": 1}]})),
        st.builds(J.RunResumed, t=times, attempt=st.integers(2, 5)),
        st.sampled_from(
            [
                J.RunFinished(t=5.0, best_trial="t0"),
                J.RunFailed(t=6.0, reason="x"),
                J.RunInterrupted(t=7.0, error="y"),
                J.RunStopped(t=8.0),
            ]
        ),
    )


# each step: (who writes: the executor's Journal or the sink (another process), the event,
#             whether the sink's line lands in two writes with a look at the state in between, look at the state)
steps = st.lists(
    st.tuples(
        st.sampled_from(["journal", "sink"]), st.one_of(_events(), st.just("unknown")), st.booleans(), st.booleans()
    ),
    max_size=40,
)


@settings(max_examples=int(os.environ.get("RUBBERBAND_FUZZ_EXAMPLES", "60")), deadline=None, database=None)
@given(steps=steps, started_by=st.sampled_from(["journal", "sink"]), look_first=st.booleans())
def test_the_live_state_equals_the_fold_of_the_whole_file(tmp_path_factory, steps, started_by, look_first):
    """Events appended by the executor's journal and by the sink (another process, here another writer of the
    same file), in any order, some lines landing in two writes while the state is read in between: the
    journal's incrementally folded state is the fold of the whole file, and the fold of the events."""
    run_dir = tmp_path_factory.mktemp("run")
    journal = J.Journal(run_dir)
    first = J.RunStarted(t=1.0, **START)
    if started_by == "journal":
        journal.record(first)
    else:
        J.append_event(journal.path, first)
    written: list = [first]
    if look_first:  # else the first look folds everything so far at once
        assert journal.state.run_id == "r1"
    for writer, event, split, look in steps:
        if event == "unknown":
            event = {"type": "from_the_future", "t": 9.0, "x": 1}
        if writer == "journal" and not isinstance(event, dict):
            journal.record(event)
        elif not split and not isinstance(event, dict):
            J.JournalSink(str(journal.path)).record(event)  # the sink actor's body, as the actor runs it
        else:  # another process's write, perhaps seen half-written
            line = J.encode_line(E.to_json_dict(event) if not isinstance(event, dict) else event)
            cut = len(line) // 2 if split else len(line)
            with open(journal.path, "ab") as handle:
                handle.write(line[:cut])
            if split:
                if look:
                    journal.state  # noqa: B018  (the half line waits)
                with open(journal.path, "ab") as handle:
                    handle.write(line[cut:])
        written.append(event)
        if look:
            assert journal.state == J.read_state(run_dir)
    live = journal.state
    assert live == J.read_state(run_dir) == J.fold(written)
    assert live is journal.state  # one object, kept current in place
