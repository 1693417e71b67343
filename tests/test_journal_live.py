"""The controller's one source of truth: its loop reads the Journal's live state and never re-reads the file, and
what the sink actor (another writer) appends reaches that state. No Ray: the trial runtime and the backend are
stand-ins (tests/executor_helpers.py); the e2e tests run the real thing (tests/test_executor_e2e.py)."""

from __future__ import annotations

import concurrent.futures
import time

from executor_helpers import FakeRuntime, finished_outcome, journaled_controller, make_plan, write_job

from rubberband.executor import journal as J
from rubberband.spec import load_spec


def test_the_controller_loop_reads_its_live_state_and_never_the_file(tmp_path, monkeypatch):
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 1)])
    controller, _ = journaled_controller(tmp_path, spec, plan, deadline_s=600.0, runtime=FakeRuntime())
    controller.search = controller._restore_search()
    controller._last_liveness = time.monotonic() + 3600  # the stand-in backend would call every instance lost
    sink = J.JournalSink(str(controller.journal.path))  # the sink actor's body: another writer of the file

    def wait_some():
        concurrent.futures.wait([e.future for e in controller.pool.values() if e.future is not None], timeout=5)
        if not controller.running:
            return []
        ref = next(iter(controller.running))
        run = controller.running.pop(ref)
        loss = int(run.trial_id.rsplit("t", 1)[1]) / 10
        for epoch in range(run.start_epoch, run.end_epoch):  # what rank 0 sends while it trains
            sink.record(J.Epoch(trial_id=run.trial_id, epoch=epoch, metrics={"loss": loss}, seconds=1.0))
        run.handle.outcome = finished_outcome(run.trial_id, run.start_epoch, run.end_epoch, loss)
        return [run]

    def no_reread(run_dir):
        raise AssertionError("the controller re-read the journal")

    monkeypatch.setattr(controller, "_wait_some", wait_some)
    monkeypatch.setattr(J, "read_state", no_reread)
    best, metric = controller._run_stages()
    monkeypatch.undo()
    controller._collect_terminations(wait=True)
    controller._terminator.shutdown(wait=True)
    controller._provisioner.shutdown(wait=True)
    assert (best, metric) == ("b0-t000", 0.0)
    assert controller.state is controller.journal.state  # one object, kept current by the journal
    assert controller.state == J.read_state(controller.run_dir)  # ... equal to the fold of the file
    assert controller.state.completed_stages() == [0, 1]
    trial = controller.state.trials["b0-t000"]
    assert trial.epochs[2] == {"loss": 0.0} and trial.finished_stages[1] == 0.0  # the sink's lines and the fold's
