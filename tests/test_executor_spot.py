"""Lost instances on the local backend: a worker node dies mid-stage, its trials restart from their checkpoints
on a replacement node, and the run ends as an uninterrupted one would (same best trial), leaving nothing.

The end-to-end test runs the real CLI with real Ray nodes (a one-stage job: 2 trials × 3 epochs on one
``local.cpu2``); the others drive the controller's loss handling and its cap with a stand-in backend, no Ray.

The end-to-end test is slow (~40 s on an idle 2-core machine, ~75 s under the shared CI load) for a reason it
cannot avoid: three Ray processes start one after another (the head, the node that dies, its replacement).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_helpers import cli_env, journaled_controller, lose_node_once_checkpointed, make_plan, run_pids, write_job

from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.controller import Controller, PoolInstance, trial_configs
from rubberband.executor.placement import make_slots
from rubberband.plan import write_plan
from rubberband.spec import load_spec


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


@pytest.mark.e2e
def test_lost_node_mid_stage_restarts_its_trials_from_checkpoints(tmp_path):
    # 2 s epochs: after the kill the dying node's workers must not finish the stage before Ray sees the loss
    spec_path = write_job(tmp_path / "job", trials=2, eta=3, min_epochs=3, max_epochs=3, epoch_s=2.0)
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1)], durations=[10.0])
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(tmp_path / "plan.json"),
            "--run-dir",
            str(run_dir),
            "--yes",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
    )
    victim, out, err = lose_node_once_checkpointed(proc, run_dir, timeout_s=120)  # once a trial has checkpointed
    assert proc.returncode == 0, err[-3000:]
    events = _events(run_dir)
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == victim and lost["reason"] == "lost"
    at = events.index(lost)
    # billed up to the loss: terminated (reason lost) at the loss time
    state = J.read_state(run_dir)
    life = state.instances[victim]
    assert life.reason == "lost" and life.lost == "lost" and life.terminated_at == pytest.approx(lost["t"])
    bill = {b.id: b for b in bill_run(state, now=time.time()).instances}
    assert bill[victim].lifetime_s == pytest.approx(lost["t"] - life.requested_at)
    # its trials stopped as instance_lost (not failed), then restarted from their checkpoints on a new instance
    stopped = [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "instance_lost"]
    affected = sorted(e["trial_id"] for e in stopped)  # those still running on the node when it died
    assert affected and set(lost["trials"]) <= set(affected) and all(e["lost"] == [victim] for e in stopped)
    assert not [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "failed"]
    replacement = [e["id"] for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED]
    assert len(replacement) == 1 and replacement[0] != victim
    assert any(e["type"] == J.DECISION and e.get("kind") == "replace" and e["id"] == victim for e in events)
    for trial_id in affected:
        before = max(e["epoch"] for e in events[:at] if e["type"] == J.CHECKPOINT and e["trial_id"] == trial_id)
        restarted = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED and e["trial_id"] == trial_id]
        if not restarted:
            # its last epoch was checkpointed (by the dying node's worker, which may outlive the kill by a moment,
            # so perhaps after the loss was journaled): finished from the journal, never trained twice
            (settled,) = [e for e in events[at:] if e["type"] == J.TRIAL_STOPPED and e["trial_id"] == trial_id]
            last = max(e["epoch"] for e in events if e["type"] == J.CHECKPOINT and e["trial_id"] == trial_id)
            assert settled["reason"] == "finished" and settled["metric"] is not None and last == 2, settled
            assert [e["epoch"] for e in events if e["type"] == J.EPOCH and e["trial_id"] == trial_id] == [0, 1, 2]
            continue
        (again,) = restarted
        assert again["instances"] == replacement
        assert again["from_checkpoint"] is not None and again["start_epoch"] == again["from_checkpoint"] + 1
        assert again["from_checkpoint"] >= before
    # the same best trial as an uninterrupted run (loss = quality / (epoch + 1): the lowest quality wins)
    best = min(trial_configs(spec, plan), key=lambda t: t[3]["quality"])[0]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"] == best
    assert summary["instances_lost"] == 1
    assert f"best trial {best}" in out
    assert run_pids(run_dir) == []


# -- the controller's loss handling without Ray ----------------------------------------------------------


def _controller(tmp_path, max_losses: int):
    spec = load_spec(write_job(tmp_path / "job", trials=2, eta=3, min_epochs=3, max_epochs=3))
    plan = make_plan(spec, [("local.cpu2", 1, 1)], durations=[10.0])
    return journaled_controller(tmp_path, spec, plan, deadline_s=600.0, max_instance_losses=max_losses)


def _ready(controller: Controller, ident: str) -> PoolInstance:
    itype = controller.catalog.find("local.cpu2", cloud="local")
    entry = PoolInstance(
        token=f"t-{ident}", itype=itype, spot=True, assigned_stage=0, id=ident, ready=True, requested_at=time.time() - 5
    )
    controller.pool[entry.token] = entry
    controller.journal.record(
        J.InstanceRequested(
            t=entry.requested_at, id=ident, instance_type=itype.name, cloud="local", price_hr=0.04, spot=True, stage=0
        )
    )
    return entry


def test_lost_instance_is_journaled_dropped_replaced_and_its_trials_requeued(tmp_path):
    controller, backend = _controller(tmp_path, max_losses=3)
    _ready(controller, "n1")
    slots = make_slots(["n1"], 2, 1)
    slots[0].trial_id = "b0-t000"
    pending: list[tuple[str, int]] = [("b0-t001", 0)]
    ckpt = controller.run_dir / "checkpoints" / "b0-t000"
    ckpt.mkdir(parents=True)
    (ckpt / "epoch-1.pt").write_bytes(b"x")
    (ckpt / "latest").write_text("epoch-1.pt\n")
    controller._handle_lost(0, {"n1": "spot-interruption"}, slots, pending, stopped=[("b0-t000", ("n1",))])
    controller._terminator.shutdown(wait=True)
    assert pending == [("b0-t000", 2), ("b0-t001", 0)]  # restarts after its checkpoint, first in line
    assert slots == []
    events = _events(controller.run_dir)
    (event,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert event["reason"] == "spot-interruption" and event["trials"] == ["b0-t000"]
    assert J.read_state(controller.run_dir).instances["n1"].lost == "spot-interruption"
    assert backend.terminated == ["n1"]
    (replacement,) = [p for p in controller.pool.values() if not p.released]
    assert replacement.future is not None and replacement.future.result()[0].id == "i-0"
    controller._provisioner.shutdown(wait=True)


def test_losses_beyond_the_cap_fail_the_run_with_a_clear_error_spot_interruptions_not_counted(tmp_path):
    controller, backend = _controller(tmp_path, max_losses=2)
    pending = [("b0-t000", 0)]
    for n in range(4):  # a spot plan expects interruptions: the spot policy and the deadline bound them
        _ready(controller, f"s{n}")
        controller._handle_lost(0, {f"s{n}": "spot-interruption"}, [], pending, stopped=[])
    for n in range(2):
        _ready(controller, f"n{n}")
        controller._handle_lost(0, {f"n{n}": "lost"}, [], pending, stopped=[])
    _ready(controller, "n2")
    with pytest.raises(
        ExecutionError, match="3 instances were lost during this run, not counting spot interruptions \\(limit 2\\)"
    ):
        controller._handle_lost(0, {"n2": "lost"}, [], pending, stopped=[])
    controller._terminator.shutdown(wait=True)
    controller._provisioner.shutdown(wait=True)
    assert len(backend.provisioned) == 6  # every loss replaced up to the cap, none beyond it
    assert J.read_state(controller.run_dir).instances["n2"].lost == "lost"


def test_spend_so_far_stops_at_each_instance_termination(tmp_path):
    controller, _ = _controller(tmp_path, max_losses=3)
    entry = _ready(controller, "n1")
    price = entry.itype.price(True) / 3600.0
    live = controller._spent()
    assert live == pytest.approx(5 * price, rel=0.05)
    entry.released, entry.terminated_at = True, entry.requested_at + 2.0
    time.sleep(0.2)
    assert controller._spent() == pytest.approx(2 * price)  # a released instance no longer adds up
    controller._terminator.shutdown(wait=True)


def test_settle_finishes_a_trial_whose_checkpoint_covers_the_stage(tmp_path):
    controller, _ = _controller(tmp_path, max_losses=3)
    stage = controller.plan.stages[0]
    for trial_id in ("b0-t000", "b0-t001"):
        ckpt = controller.run_dir / "checkpoints" / trial_id
        ckpt.mkdir(parents=True)
        (ckpt / "epoch-2.pt").write_bytes(b"x")
        (ckpt / "latest").write_text("epoch-2.pt\n")
    controller.journal.record(J.Epoch(trial_id="b0-t000", epoch=2, metrics={"loss": 0.25}))
    metrics: dict = {}
    assert controller._settle(0, stage, "b0-t000", 1, metrics) is None
    assert metrics == {"b0-t000": 0.25}  # reported and checkpointed: finished without running again
    assert controller._settle(0, stage, "b0-t001", 1, metrics) == 2  # never reported: its last epoch runs again
    assert controller._settle(0, stage, "b0-t001", 2, metrics) == 2  # and stays due for that, not settled again
    assert "b0-t001" not in metrics
    controller._terminator.shutdown(wait=True)
