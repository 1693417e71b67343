"""Journal benchmark: what typed events and the live fold cost, against the untyped journal they replaced.

    python bench/bench_journal.py [--trials N] [--old PATH_TO_OLD_JOURNAL_PY]

Writes the journal a Hyperband-sized run would write (``--trials`` trials, each created, started, three epochs,
three checkpoints, stopped; instances, stages and decisions around them), then prints:

* full fold — ``read_state`` of that journal from disk (resume, report, ``down``): typed (pydantic validation
  per line) vs the untyped fold (``--old``: the previous ``executor/journal.py``, e.g. from
  ``git show 3af8fc1:executor/journal.py``), seconds and events per second;
* live state — what the executor pays per event: appending it (``record``, fsync'd) with the live fold on
  vs off, and the re-read of the whole file that ``read_state`` cost the executor before, at the journal's
  final size.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rubberband.executor import journal as J

START = dict(
    run_id="r1",
    spec_sha256="abc",
    spec={"name": "bench", "metric": {"name": "loss", "mode": "min"}},
    plan={"stages": [{"bracket": 0, "epochs": 3}]},
    cloud="local",
    deadline_s=3600.0,
)


def events(trials: int) -> list:
    out: list = [J.RunStarted(t=0.0, **START)]
    t = 1.0
    for i in range(0, trials, 9):
        out.append(
            J.InstanceRequested(
                t=t, id=f"n{i}", instance_type="local.cpu2", cloud="local", price_hr=0.1, spot=False, stage=0
            )
        )
        out.append(J.InstanceReady(t=t + 1, id=f"n{i}", startup_s=1.0))
    out.append(
        J.StageStarted(
            t=t,
            stage=0,
            bracket=0,
            stage_in_bracket=0,
            trials=trials,
            to_run=trials,
            epochs=3,
            instance_type="local.cpu2",
            instances=trials // 9 + 1,
            workers_per_trial=1,
            predicted_duration_s=100.0,
        )
    )
    for i in range(trials):
        tid = f"b0-t{i:04d}"
        out.append(J.TrialCreated(t=t, trial_id=tid, bracket=0, index=i, config={"lr": 0.01 * i, "opt": "adam"}))
        out.append(
            J.TrialStarted(
                t=t,
                trial_id=tid,
                stage=0,
                start_epoch=0,
                end_epoch=3,
                workers=1,
                instances=[f"n{i - i % 9}"],
                placement=[f"n{i - i % 9}"],
                from_checkpoint=None,
            )
        )
        for epoch in range(3):
            t += 0.01
            out.append(J.Epoch(t=t, trial_id=tid, epoch=epoch, metrics={"loss": 1.0 / (epoch + 1 + i)}, seconds=1.0))
            out.append(J.Checkpoint(t=t, trial_id=tid, epoch=epoch, path=f"/c/{tid}/epoch-{epoch}.pt"))
        out.append(
            J.TrialStopped(
                t=t,
                trial_id=tid,
                stage=0,
                reason="finished",
                metric=0.5,
                error=None,
                start_epoch=0,
                end_epoch=3,
                seconds=3.0,
                setup_s=0.1,
                checkpoint_epoch=2,
            )
        )
        out.append(J.Keep(t=t, id=f"n{i - i % 9}", stage=0))
    out.append(
        J.StageFinished(
            t=t, stage=0, bracket=0, metrics={f"b0-t{i:04d}": 0.5 for i in range(trials)}, promoted=[], ranking=[]
        )
    )
    out.append(J.RunFinished(t=t, best_trial="b0-t0000", best_metric=0.5, outcome="met", jct_s=t, cost_usd=1.0))
    return out


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=729)
    parser.add_argument("--old", type=Path, help="the previous executor/journal.py, to compare the full fold")
    args = parser.parse_args()
    evs = events(args.trials)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        journal = J.Journal(run_dir)
        began = time.perf_counter()
        for event in evs:
            journal.record(event)
        append_off = (time.perf_counter() - began) / len(evs)
        size = journal.path.stat().st_size
        typed = best_of(lambda: J.read_state(run_dir))
        assert J.read_state(run_dir) == J.fold(evs)
        print(f"journal: {len(evs)} events, {size / 1e6:.2f} MB ({args.trials} trials)")
        print(f"full fold, typed (read_state):   {typed:.3f} s  ({len(evs) / typed:,.0f} events/s)")
        if args.old is not None:
            spec = importlib.util.spec_from_file_location("old_journal", args.old)
            assert spec is not None and spec.loader is not None
            old = importlib.util.module_from_spec(spec)
            sys.modules["old_journal"] = old  # dataclasses look their module up
            spec.loader.exec_module(old)
            untyped = best_of(lambda: old.read_state(run_dir))
            print(
                f"full fold, untyped (old):        {untyped:.3f} s  ({len(evs) / untyped:,.0f} events/s); "
                f"typed/untyped {typed / untyped:.2f}x"
            )

        live_dir = Path(tmp) / "live"
        live = J.Journal(live_dir)
        live.record(evs[0])
        live.state  # noqa: B018  (from here on every record folds what it appended)
        began = time.perf_counter()
        for event in evs[1:]:
            live.record(event)
        append_on = (time.perf_counter() - began) / (len(evs) - 1)
        assert live.state == J.read_state(live_dir)
        per_event = statistics.median([best_of(lambda: live.state, 1) for _ in range(5)])
        print(f"record, live fold off:           {append_off * 1e6:.0f} µs/event (append + fsync)")
        print(
            f"record, live fold on:            {append_on * 1e6:.0f} µs/event (the fold of one line: "
            f"~{typed / len(evs) * 1e6:.0f} µs, within the fsync's noise)"
        )
        print(f"journal.state, nothing new:      {per_event * 1e6:.0f} µs")
        print(
            f"read_state at the final size:    {typed * 1e3:.0f} ms (what each of the executor's ~10 "
            f"re-reads per stage cost before)"
        )


if __name__ == "__main__":
    main()
