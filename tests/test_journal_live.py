"""The executor's one source of truth: its loop reads the Journal's live state and never re-reads the file, and
what the trial workers' sink (another writer) appends reaches that state. No Ray: the real executor runs on
virtual time (tests/sim_helpers.py), whose trials append their epochs and checkpoints through a sink of their
own; the e2e tests run the real thing (tests/test_executor_e2e.py)."""

from __future__ import annotations

from executor_helpers import make_plan, write_job
from sim_helpers import SimCase

from rubberband.executor import journal as J
from rubberband.spec import load_spec


def test_the_loop_reads_its_live_state_and_never_the_file(tmp_path, monkeypatch):
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu2", 1, 1)])
    case = SimCase(spec, plan)
    run_dir = tmp_path / "run"
    executor = case.executor(run_dir, case.world())  # its journal (and that journal's fold) exist from here on

    reads: list[tuple[int, int]] = []  # (offset before, offset after) of each fold of the file
    advance = J.StateFold.advance

    def counted(fold, **options):
        before = fold.offset
        state = advance(fold, **options)
        reads.append((before, fold.offset))
        return state

    def no_reread(*args, **kwargs):
        raise AssertionError("the executor re-read the journal")

    class NoNewFold(J.StateFold):
        def __init__(self, *args, **kwargs):
            no_reread()

    monkeypatch.setattr(J.StateFold, "advance", counted)
    monkeypatch.setattr(J, "StateFold", NoNewFold)
    monkeypatch.setattr(J, "read_state", no_reread)
    monkeypatch.setattr(J, "iter_events", no_reread)
    result = executor.run()
    monkeypatch.undo()
    assert result.status == "finished" and reads
    # one fold, advanced over what was appended since it last looked: each read starts where the last ended
    assert reads[0][0] == 0 and all(start == end for (_, end), (start, _) in zip(reads, reads[1:]))
    live = executor.services.journal.state
    assert reads[-1][1] == (run_dir / J.JOURNAL_NAME).stat().st_size
    assert live == J.read_state(run_dir)  # ... equal to the fold of the file
    assert live.completed_stages() == [0, 1]
    best = live.trials[result.best_trial]
    # the sink's lines (epochs, checkpoints) and the fold's own (the stage's result) in one state
    assert best.epochs[2] == {"loss": result.best_metric} and best.finished_stages[1] == result.best_metric
    assert best.checkpoint_epoch == 2
