"""Tracking (rubberband.executor.tracking): the spec's ``tracking`` field, and the journal follower's sinks on a
journal written here — TensorBoard event files for real, MLflow through a stand-in client that keeps every call
(the real server is tests/test_tracking_e2e.py's).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from tracking_helpers import FakeMlflow, tensorboard_scalars

from conftest import EXAMPLES
from test_bad_input import invoke
from test_sim_executor import _job as sim_job
from rubberband.errors import SpecError
from rubberband.executor import journal as J
from rubberband.executor import tracking as T
from rubberband.report.source import tracking_links
from rubberband.spec import load_spec, parse_spec

BASE = yaml.safe_load((EXAMPLES / "tabular.yaml").read_text())


def _spec(tracking):
    return parse_spec({**BASE, "tracking": tracking}, source="job.yaml", base_dir=EXAMPLES)


@pytest.mark.parametrize(
    ("tracking", "message"),
    [
        ({"mlflow": "not a uri"}, "spec field 'tracking.mlflow': 'not a uri' is not a tracking URI; write e.g."),
        ({"mlflow": "https://me:secret@mlflow.example"}, "carries a login, which would be written into the run's"),
        ({"mlflow_experiment": "x"}, "spec field 'tracking': mlflow_experiment needs a tracking URI"),
        ({"tensorboard": "maybe"}, "spec field 'tracking.tensorboard': must be true or false"),
        ({"wandb": "x"}, "spec field 'tracking.wandb': unknown field; remove it or check its spelling"),
        ("yes", "spec field 'tracking': must be a mapping of fields"),
    ],
)
def test_bad_tracking_is_one_line_naming_the_field_and_the_fix(tracking, message):
    with pytest.raises(SpecError) as caught:
        _spec(tracking)
    assert message in caught.value.message and "\n" not in caught.value.message


def test_tracking_is_off_by_default_and_leaves_the_spec_digest_alone():
    plain = load_spec(EXAMPLES / "tabular.yaml")
    assert not plain.tracking.enabled
    assert _spec({}).sha256() == plain.sha256()  # runs started before the field still resume
    assert _spec({"tensorboard": True}).sha256() != plain.sha256()


def test_a_missing_package_or_a_silent_server_fails_before_anything_starts(monkeypatch):
    real = T.importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(SpecError, match=r"'tracking.mlflow': needs mlflow, which is not installed; pip install"):
        T.check_tracking(_spec({"mlflow": "http://127.0.0.1:5000"}))
    monkeypatch.undo()
    with socket.socket() as probe:  # a port nobody listens on (bound, never listening, closed at once)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(SpecError, match=rf"no MLflow tracking server answers at http://127.0.0.1:{port} \("):
        T.check_tracking(_spec({"mlflow": f"http://127.0.0.1:{port}"}))


def _journal(run_dir, *, end: bool = True) -> J.Journal:
    """A two-trial run: t0 trains epochs 0-1 and is promoted, trains epoch 2 and wins; t1 is pruned after epoch 1."""
    journal = J.Journal(run_dir)
    journal.record(J.RunStarted(t=100.0, run_id="run-1", spec_sha256="x", spec={}, plan={}, deadline_s=60.0))
    for i, lr in enumerate((0.1, 0.01)):
        journal.record(J.TrialCreated(t=100.0, trial_id=f"t{i}", bracket=0, index=i, config={"lr": lr, "depth": 3}))
    for i in (0, 1):
        for epoch in (0, 1):
            journal.record(
                J.Epoch(
                    t=101.0 + epoch,
                    trial_id=f"t{i}",
                    epoch=epoch,
                    metrics={"acc": 0.5 + epoch / 10 - i / 5},
                    seconds=1.0,
                )
            )
        journal.record(J.TrialStopped(trial_id=f"t{i}", stage=0, reason="finished", metric=0.6 - i / 5))
    journal.record(J.TrialPromoted(trial_id="t0", from_stage=0, to_stage=1, metric=0.6))
    journal.record(J.Epoch(t=104.0, trial_id="t0", epoch=2, metrics={"acc": 0.9}, seconds=1.0))
    if end:
        journal.record(J.TrialStopped(trial_id="t0", stage=1, reason="finished", metric=0.9))
        journal.record(J.RunFinished(t=105.0, best_trial="t0", best_metric=0.9))
    return journal


def test_each_trial_is_a_tensorboard_run_and_an_mlflow_run(tmp_path):
    _journal(tmp_path)
    client = FakeMlflow()
    mlflow = T.MlflowSink(lambda: client, "http://mlflow.example:5000", "tabular-hgb", "run-1", None)
    tracking = T.Tracking(tmp_path, [T.TensorBoardSink(tmp_path), mlflow])
    tracking.close()  # one pass (never started): the whole journal

    t0 = tensorboard_scalars(tmp_path / "tensorboard" / "t0")
    assert t0["acc"] == [(0, 0.5), (1, pytest.approx(0.6)), (2, pytest.approx(0.9))]
    assert [step for step, _ in t0["rubberband/epoch_seconds"]] == [0, 1, 2]
    assert [step for step, _ in tensorboard_scalars(tmp_path / "tensorboard" / "t1")["acc"]] == [0, 1]

    runs = {r["tags"]["rubberband.trial_id"]: r for r in client.runs.values()}
    assert set(runs) == {"t0", "t1"} and client.experiments == {"tabular-hgb": "1"}
    assert runs["t0"]["params"] == {"depth": "3", "lr": "0.1"} and runs["t0"]["name"] == "run-1/t0"
    assert all(r["tags"]["rubberband.run_id"] == "run-1" for r in runs.values())
    assert [step for step, _ in runs["t0"]["metrics"]["acc"]] == [0, 1, 2]
    assert runs["t0"]["tags"]["rubberband.promoted_to_stage"] == "1" and runs["t0"]["tags"]["rubberband.best"] == "true"
    assert runs["t1"]["tags"]["rubberband.state"] == "finished" and "rubberband.best" not in runs["t1"]["tags"]
    assert {r["status"] for r in runs.values()} == {"FINISHED"}

    saved = json.loads((tmp_path / T.TRACKING_FILE).read_text())
    assert saved["journal_offset"] == (tmp_path / J.JOURNAL_NAME).stat().st_size
    assert saved["mlflow"]["experiment_url"] == "http://mlflow.example:5000/#/experiments/1"
    links = {link.tool: link for link in tracking_links(tmp_path)}
    assert links["TensorBoard"].where == f"tensorboard --logdir {(tmp_path / 'tensorboard').resolve()}"
    assert links["MLflow"].url == "http://mlflow.example:5000/#/experiments/1" and links["MLflow"].error is None


def test_a_resumed_run_continues_the_same_mlflow_runs(tmp_path):
    journal = _journal(tmp_path, end=False)
    journal.record(J.TrialStopped(trial_id="t0", stage=1, reason="interrupted"))
    journal.record(J.RunInterrupted(t=104.5))
    client = FakeMlflow()
    T.Tracking(tmp_path, [T.MlflowSink(lambda: client, "sqlite:///m.db", "job", "run-1", None)]).close()
    assert sorted(r["status"] for r in client.runs.values()) == ["FINISHED", "KILLED"]  # t1 pruned, t0 stopped

    journal.record(J.RunResumed(run_id="run-1", attempt=2))
    journal.record(J.Epoch(t=110.0, trial_id="t0", epoch=2, metrics={"acc": 0.91}, seconds=1.0))
    journal.record(J.TrialStopped(trial_id="t0", stage=1, reason="finished", metric=0.91))
    journal.record(J.RunFinished(t=111.0, best_trial="t0", best_metric=0.91))
    known = T.read_tracking(tmp_path)
    assert known is not None
    again = T.Tracking(
        tmp_path,
        [T.MlflowSink(lambda: client, "sqlite:///m.db", "job", "run-1", known["mlflow"])],
        offset=known["journal_offset"],
    )
    again.close()
    assert len(client.runs) == 2  # no new MLflow run for a trial an earlier executor logged
    t0 = next(r for r in client.runs.values() if r["tags"]["rubberband.trial_id"] == "t0")
    assert t0["metrics"]["acc"][-1] == (2, 0.91) and len(t0["metrics"]["acc"]) == 4  # only the new epoch added
    assert t0["status"] == "FINISHED"
    assert T.read_tracking(tmp_path)["mlflow"]["experiment_url"] is None  # a store, not a server: no page


def test_a_failing_tracker_is_turned_off_and_the_other_goes_on(tmp_path):
    _journal(tmp_path)
    client = FakeMlflow(fail_on="log_metric")
    tracking = T.Tracking(
        tmp_path, [T.MlflowSink(lambda: client, "http://h:1", "job", "run-1", None), T.TensorBoardSink(tmp_path)]
    )
    tracking.close()
    saved = json.loads((tmp_path / T.TRACKING_FILE).read_text())
    assert saved["mlflow"]["error"] == "ConnectionError: log_metric: the tracking server went away"
    assert saved["tensorboard"]["error"] is None
    assert len(tensorboard_scalars(tmp_path / "tensorboard" / "t0")["acc"]) == 3
    links = {link.tool: link for link in tracking_links(tmp_path)}
    assert links["MLflow"].error.startswith("ConnectionError")


def test_the_follower_takes_only_complete_lines(tmp_path):
    journal = _journal(tmp_path, end=False)
    seen: list[str] = []

    class Recorder:
        name = "recorder"

        def on(self, event):
            seen.append(event.type)

        def flush(self):
            pass

        def close(self):
            pass

        def describe(self):
            return {}

    tracking = T.Tracking(tmp_path, [Recorder()])
    assert tracking.advance() == len(seen) == 11
    with open(journal.path, "ab") as handle:
        handle.write(b'{"type":"epoch","trial_id":"t1","epo')  # a line the sink actor is still writing
    assert tracking.advance() == 0
    with open(journal.path, "ab") as handle:
        handle.write(b'ch":2,"metrics":{"acc":0.4},"t":106.0}\n')
    assert tracking.advance() == 1 and seen[-1] == "epoch"


def _sim_job(tmp_path, tracking) -> Path:
    """The cloud quickstart's job, 9 trials, with ``tracking``: `rubberband run --cloud sim` plays it in seconds."""
    scheduler = {
        **yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())["scheduler"],
        "trials": 9,
        "max_epochs": 9,
    }
    return sim_job(tmp_path, scheduler=scheduler, tracking=tracking)


def test_a_run_on_simulated_time_writes_tensorboard_files_for_every_trial(tmp_path):
    run_dir = tmp_path / "run"
    result = invoke("run", _sim_job(tmp_path, {"tensorboard": True}), "--cloud", "sim", "--yes", "--run-dir", run_dir)
    assert result.code == 0, result.err[-3000:]
    trials = {e["trial_id"] for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == "trial_created"}
    assert len(trials) == 9 and {p.name for p in (run_dir / "tensorboard").iterdir()} == trials
    assert all(tensorboard_scalars(run_dir / "tensorboard" / t)["val_acc"] for t in trials)
    assert json.loads((run_dir / T.TRACKING_FILE).read_text())["tensorboard"] == {
        "logdir": "tensorboard",
        "error": None,
    }


def test_a_run_whose_mlflow_server_does_not_answer_stops_before_planning(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = _sim_job(tmp_path, {"mlflow": f"http://127.0.0.1:{port}"})
    result = invoke("run", job, "--cloud", "sim", "--yes", "--run-dir", tmp_path / "run")
    assert result.refused().startswith(
        f"rubberband: error: spec field 'tracking.mlflow': no MLflow tracking server answers at http://127.0.0.1:{port}"
    )
    assert not (tmp_path / "run").exists()


def test_the_report_lists_each_tracker_with_its_link_or_command_and_its_error():
    from rubberband.report import html, markdown
    from rubberband.report.source import TrackingLink

    links = (
        TrackingLink("TensorBoard", "tensorboard --logdir /runs/r1/tensorboard"),
        TrackingLink(
            "MLflow", "http://h:5000/#/experiments/3", "http://h:5000/#/experiments/3", "ConnectionError: <gone>"
        ),
    )
    assert markdown.tracking_lines(links) == [
        "Trials logged to:",
        "",
        "- TensorBoard: `tensorboard --logdir /runs/r1/tensorboard`",
        "- MLflow: [http://h:5000/#/experiments/3](http://h:5000/#/experiments/3) (stopped logging: ConnectionError: <gone>)",
        "",
    ]
    page = html.tracking_section(links)
    assert '<a href="http://h:5000/#/experiments/3">' in page and "<code>tensorboard --logdir" in page
    assert "&lt;gone&gt;" in page and "<gone>" not in page
    assert markdown.tracking_lines(()) == [] and html.tracking_section(()) == ""
