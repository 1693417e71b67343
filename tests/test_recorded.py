"""The recorded-benchmark workload (examples/recorded.py) replays NAS-Bench-201's recorded times and
accuracies from the shipped slice (examples/data/nasbench201_cifar10_slice.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import EXAMPLES

from rubberband.spec import load_spec

sys.path.insert(0, str(EXAMPLES))
import recorded  # noqa: E402

sys.path.remove(str(EXAMPLES))

TABLE = json.loads((EXAMPLES / "data" / "nasbench201_cifar10_slice.json").read_text())["rows"]
BEST = max(TABLE, key=lambda a: TABLE[a]["val_acc"])


def test_the_replayed_curve_ends_at_the_recorded_accuracy_and_keeps_the_recorded_order():
    R = 9
    for row in TABLE.values():
        curve = [recorded.accuracy(row["val_acc"], e, R) for e in range(R)]
        assert curve[-1] == pytest.approx(row["val_acc"])
        assert all(a <= b for a, b in zip(curve, curve[1:]))
    finals = sorted(TABLE.values(), key=lambda r: r["val_acc"])
    for e in range(R):  # at every epoch (every rung) the ranking is the recorded one
        at_e = [recorded.accuracy(r["val_acc"], e, R) for r in finals]
        assert at_e == sorted(at_e)


def test_recorded_time_is_scaled_and_speeds_really_differ():
    row = TABLE[BEST]
    assert recorded.epoch_seconds(row, 9, 60.0) == pytest.approx(row["train_time_s"] / 9 / 60)
    times = [r["train_time_s"] for r in TABLE.values()]
    assert max(times) > 2.5 * min(times)


def test_the_example_lists_every_architecture_of_the_slice_once():
    spec = load_spec(EXAMPLES / "nasbench201.yaml")
    archs = [t["arch"] for t in spec.trials]
    assert sorted(archs) == sorted(TABLE) and spec.scheduler.trials == len(TABLE)
    assert spec.config["max_epochs"] == spec.scheduler.max_epochs
    assert BEST == "311021"  # the recorded best, named in the example's comment


@pytest.mark.e2e
def test_a_replay_run_finds_the_recorded_best(tmp_path):
    """The real CLI on local Ray nodes: 9 architectures of the slice (the best among them), 9 → 3, R=3."""
    from executor_helpers import cli_env, make_plan, run_pids

    from rubberband.plan import write_plan

    spec_data = __import__("yaml").safe_load((EXAMPLES / "nasbench201.yaml").read_text())
    archs = sorted(TABLE, key=lambda a: TABLE[a]["train_time_s"])[:8] + [BEST]
    spec_data.update(trials=[{"arch": a} for a in archs], deadline="5m", profile=None)
    spec_data["config"].update(
        table=str(EXAMPLES / "data" / "nasbench201_cifar10_slice.json"), max_epochs=3, time_scale=1200
    )
    spec_data["scheduler"] = {"kind": "sha", "eta": 3, "min_epochs": 1, "max_epochs": 3}
    (tmp_path / "recorded.py").write_text((EXAMPLES / "recorded.py").read_text())
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(json.dumps(spec_data))
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 1)], durations=[8.0, 6.0])
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(tmp_path / "plan.json"),
            "--cloud",
            "local",
            "--run-dir",
            str(run_dir),
            "--yes",
            "--overrun",
            "none",
        ],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    assert run_pids(run_dir) == []
    result = json.loads((run_dir / "result.json").read_text())
    assert result["best"]["config"]["arch"] == BEST
    assert result["best"]["metric"] == pytest.approx(TABLE[BEST]["val_acc"])
