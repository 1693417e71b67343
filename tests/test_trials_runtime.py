"""TrialRun on a real local Ray cluster: DDP over gloo, checkpoints across world sizes, errors, cleanup."""

from __future__ import annotations

import dataclasses

from ray_helpers import busy_resources, local_ray_cluster, wait_until_idle  # noqa: F401  (import first)

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from rubberband.errors import ExecutionError, TrainingError
from rubberband.executor.checkpoints import latest_epoch, load_latest
from rubberband.executor.pool import WorkerPool
from rubberband.executor.trials import TrialRun, TrialSpec

CODE = str(Path(__file__).parent / "trial_code")
# One worker: the module's one Ray cluster. Exclusive: see tests/test_trials_gpu.py (workers destroyed before they
# started, in full 4-worker CI runs only; cause not known yet).
pytestmark = [pytest.mark.xdist_group("trials_runtime_cluster"), pytest.mark.exclusive]


def _spec(
    tmp_path: Path,
    placement: tuple[str, ...],
    epochs: tuple[int, int] = (0, 1),
    *,
    entry: str = "tiny_train:train",
    trial_id: str = "b0-t000",
    **config,
) -> TrialSpec:
    """A trial of ``entry`` over ``placement`` from epoch ``epochs[0]`` to ``epochs[1]`` (``config``: its config)."""
    return TrialSpec(
        trial_id=trial_id,
        config=config,
        entry_point=entry,
        code_dir=CODE,
        start_epoch=epochs[0],
        end_epoch=epochs[1],
        placement=placement,
        checkpoint_dir=str(tmp_path / "ckpt" / trial_id),
        timeout_s=60,
    )


def _params(prefix: Path, rank: int) -> dict:
    return torch.load(f"{prefix}.rank{rank}", weights_only=True)


def test_two_gloo_workers_train_in_lockstep(local_ray_cluster, tmp_path):
    a = local_ray_cluster.resource("a")
    spec = _spec(tmp_path, (a, a), (0, 2), params_out=str(tmp_path / "p"))
    run = TrialRun.start(spec)
    outcome = run.result(timeout_s=120)

    p0, p1 = _params(tmp_path / "p", 0), _params(tmp_path / "p", 1)
    assert all(torch.equal(p0[k], p1[k]) for k in p0)  # ranks started from different seeds: DDP synced them
    assert [r.epoch for r in outcome.reports] == [0, 1]
    assert outcome.reports[1].metrics["loss"] < outcome.reports[0].metrics["loss"]  # it learns
    assert outcome.reports[0].metrics["world_size"] == 2.0
    # 64 samples / 2 ranks / batch 4 = 8 iterations per epoch, every one timed on rank 0.
    assert len(outcome.iteration_latencies_s) == 16 and all(x > 0 for x in outcome.iteration_latencies_s)
    assert outcome.checkpoint_epoch == 1 and latest_epoch(spec.checkpoint_dir) == 1
    assert 0 < outcome.setup_s < outcome.finished_at - outcome.started_at
    run.stop()
    run.stop()  # idempotent
    assert wait_until_idle() == {}


def test_checkpoint_at_two_workers_resumes_at_one_and_three(local_ray_cluster, tmp_path):
    """Three runs with fresh worker processes (2, 1, then 3 workers over two instances): ~20 s on 2 cores."""
    a, b = local_ray_cluster.resource("a"), local_ray_cluster.resource("b")
    first = TrialRun.start(_spec(tmp_path, (a, a))).result(timeout_s=120)
    assert first.checkpoint_epoch == 0 and first.reports[0].metrics["resumed"] == 0.0
    saved = load_latest(tmp_path / "ckpt" / "b0-t000")
    assert saved is not None and saved.epoch == 0 and set(saved.state) == {"model", "opt"}

    one = TrialRun.start(_spec(tmp_path, (b,), (1, 2))).result(timeout_s=120)
    assert [r.epoch for r in one.reports] == [1]
    assert one.reports[0].metrics == pytest.approx(
        {"loss": one.reports[0].metrics["loss"], "world_size": 1.0, "resumed": 1.0}
    )
    assert one.checkpoint_epoch == 1

    # Three workers over two instances (PACK placement group), resuming from the 1-worker checkpoint.
    three = TrialRun.start(_spec(tmp_path, (a, a, b), (2, 3), params_out=str(tmp_path / "q")))
    out3 = three.result(timeout_s=120)
    assert out3.reports[0].metrics["world_size"] == 3.0 and out3.reports[0].metrics["resumed"] == 1.0
    assert out3.checkpoint_epoch == 2
    q = [_params(tmp_path / "q", r) for r in range(3)]
    assert all(torch.equal(q[0][k], q[r][k]) for r in (1, 2) for k in q[0])
    # Training continued from the checkpoint: the loss keeps falling across the resizes.
    assert first.reports[0].metrics["loss"] > out3.reports[0].metrics["loss"]
    assert wait_until_idle() == {}


def test_raising_train_gives_one_line_training_error(local_ray_cluster, tmp_path):
    a = local_ray_cluster.resource("a")
    run = TrialRun.start(_spec(tmp_path, (a, a), entry="tiny_train:train_raises", trial_id="b0-t007", bad_rank=1))
    began = time.monotonic()
    with pytest.raises(TrainingError) as info:
        run.result(timeout_s=120)
    message = str(info.value)
    assert "\n" not in message
    assert "b0-t007" in message and "ValueError" in message and "learning rate exploded" in message
    assert "rank 1" in message  # the root cause, not rank 0's broken allreduce
    assert time.monotonic() - began < 30  # rank 0 does not wait for the collective timeout
    with pytest.raises(TrainingError):
        run.result()  # the same error again
    run.stop()
    # Ray counts the removed node's slot until its health check marks it dead (~12 s): check the rest.
    busy = wait_until_idle(timeout_s=3)
    assert "rb-node-a" not in busy and not any(k.startswith("pg:") for k in busy)


def test_entry_point_that_does_not_import(local_ray_cluster, tmp_path):
    a = local_ray_cluster.resource("a")
    for entry, expected in (
        ("broken_import:train", "fancy_dataset"),
        ("no_such_module:train", "no_such_module"),
        ("tiny_train:missing", "has no function 'missing'"),
    ):
        with pytest.raises(TrainingError) as info:
            TrialRun.start(_spec(tmp_path, (a,), entry=entry, trial_id="b1-t002")).result(timeout_s=120)
        assert "b1-t002" in str(info.value) and "cannot import" in str(info.value) and expected in str(info.value)
    assert wait_until_idle() == {}


def test_event_sink_max_iterations_and_stop(local_ray_cluster, tmp_path):
    import ray

    @ray.remote(num_cpus=0)
    class Sink:
        def __init__(self):
            self.events = []

        def record(self, event):
            self.events.append(event)

        def get(self):
            return self.events

    sink = Sink.remote()
    a = local_ray_cluster.resource("a")
    spec = TrialSpec(
        trial_id="p-1",
        config={},
        entry_point="tiny_train:train",
        code_dir=CODE,
        start_epoch=0,
        end_epoch=2,
        placement=(a,),
        checkpoint_dir=str(tmp_path / "c"),
        max_iterations=3,
        timeout_s=60,
    )
    outcome = TrialRun.start(spec, event_sink=sink).result(timeout_s=120)
    assert len(outcome.iteration_latencies_s) == 6  # 3 per epoch call
    events = ray.get(sink.get.remote(), timeout=30)
    # typed journal events, built (and so validated) on the worker
    assert [(e.type, e.epoch) for e in events] == [("epoch", 0), ("checkpoint", 0), ("epoch", 1), ("checkpoint", 1)]
    assert events[1].path.endswith("epoch-0.pt") and events[0].trial_id == "p-1"
    ray.kill(sink)

    # A spot stage's interval (checkpoint every 2 epochs): the workers save after epoch 1 and the last (2) only.
    sparse = Sink.remote()
    spec = dataclasses.replace(
        spec, trial_id="p-2", end_epoch=3, checkpoint_dir=str(tmp_path / "c2"), checkpoint_every=2
    )
    outcome = TrialRun.start(spec, event_sink=sparse).result(timeout_s=120)
    events = ray.get(sparse.get.remote(), timeout=30)
    assert [(e.type, e.epoch) for e in events if e.type == "checkpoint"] == [("checkpoint", 1), ("checkpoint", 2)]
    assert outcome.checkpoint_epoch == 2 and latest_epoch(spec.checkpoint_dir) == 2
    ray.kill(sparse)

    # A long-running trial stopped from the driver leaves nothing behind.
    run = TrialRun.start(_spec(tmp_path, (a, a), entry="tiny_train:train_sleeps", trial_id="b0-t009"))
    with pytest.raises(TimeoutError):
        run.result(timeout_s=2)
    run.stop()
    # Ray counts the removed node's slot until its health check marks it dead (~12 s): check the rest.
    busy = wait_until_idle(timeout_s=3)
    assert "rb-node-a" not in busy and not any(k.startswith("pg:") for k in busy)


def test_unplaceable_trial_raises_and_cleans_up(local_ray_cluster, tmp_path):
    spec = TrialSpec(
        trial_id="b0-t010",
        config={},
        entry_point="tiny_train:train",
        code_dir=CODE,
        start_epoch=0,
        end_epoch=1,
        placement=("rb-node-nowhere",),
        checkpoint_dir=str(tmp_path / "c"),
        timeout_s=1.5,
    )
    with pytest.raises(ExecutionError, match="rb-node-nowhere"):
        TrialRun.start(spec).result(timeout_s=30)
    with WorkerPool() as pool, pytest.raises(ExecutionError, match="no instance offers rb-node-nowhere"):
        TrialRun.start(spec, pool=pool).result(timeout_s=30)
    assert wait_until_idle() == {}


def test_pool_reuses_warm_workers_across_a_resize(local_ray_cluster, tmp_path):
    a = local_ray_cluster.resource("a")
    with WorkerPool() as pool:
        pool.warm(a, 2, timeout_s=60)
        assert pool.idle() == {a: 2}
        big = TrialRun.start(_spec(tmp_path, (a, a)), pool=pool).result(timeout_s=120)
        assert big.warm_workers == (True, True) and pool.idle() == {a: 2}
        began = time.monotonic()
        small = TrialRun.start(_spec(tmp_path, (a,), (1, 2)), pool=pool).result(timeout_s=120)
        resize_s = time.monotonic() - began
        assert small.warm_workers == (True,) and small.reports[0].metrics["resumed"] == 1.0
        assert small.setup_s < 1.5 and resize_s < 5  # loose bounds: a shared 2-core CI box (bench measures it)
        # A failed run's workers are not given back.
        with pytest.raises(TrainingError):
            TrialRun.start(_spec(tmp_path, (a,), entry="tiny_train:train_raises", trial_id="x"), pool=pool).result(
                timeout_s=120
            )
        assert pool.idle() == {a: 1}
        pool.warm(a, 2, wait=False)  # start one more in the background
        assert pool.idle() == {a: 2}
        pool.shrink(a, keep=0)
        assert pool.idle() == {}
    assert wait_until_idle() == {}


def test_a_one_worker_trial_that_does_not_use_torch_never_imports_it(local_ray_cluster, tmp_path):
    """A job of one-worker CPU trials (scikit-learn, XGBoost, a sleep) pays nothing for torch: its workers start
    without it, no process group is made, and torch is imported only when the training asks for ``ctx.device``."""
    a = local_ray_cluster.resource("a")
    with WorkerPool(warm_torch=False) as pool:
        free = TrialRun.start(_spec(tmp_path, (a,), entry="torch_free:train"), pool=pool).result(timeout_s=120)
        assert free.reports[0].metrics == {"torch_loaded": 0.0, "grouped": 0.0}
        asked = TrialRun.start(
            _spec(tmp_path, (a,), entry="torch_free:train", trial_id="b0-t001", ask_device=1), pool=pool
        ).result(timeout_s=120)
        assert asked.reports[0].metrics["torch_loaded"] == 1.0
    assert wait_until_idle() == {}


def test_digits_example_learns_on_two_workers(local_ray_cluster, tmp_path):
    a = local_ray_cluster.resource("a")
    examples = Path(__file__).resolve().parents[1] / "examples"
    spec = TrialSpec(
        trial_id="digits-0",
        config={"lr": 0.05, "momentum": 0.9, "hidden": 64, "batch_size": 32},
        entry_point="digits:train",
        code_dir=str(examples),
        start_epoch=0,
        end_epoch=2,
        placement=(a, a),
        checkpoint_dir=str(tmp_path / "c"),
        timeout_s=120,
    )
    outcome = TrialRun.start(spec).result(timeout_s=240)
    assert [r.epoch for r in outcome.reports] == [0, 1]
    assert outcome.reports[-1].metrics["val_acc"] > 0.6  # chance is 0.1
    # 1437 training samples, sharded over 2 ranks, 32 per batch: 23 iterations per epoch on rank 0.
    assert outcome.pass_lengths == (23, 23) and outcome.batch_size_seen == 32
    assert len(outcome.iteration_latencies_s) == 46


def test_losing_an_instance_mid_trial_fails_fast(local_ray_cluster, tmp_path):
    """A node dies under a running 2-node trial: TrainingError within seconds, survivors cleaned up."""
    a = local_ray_cluster.resource("a")
    local_ray_cluster.add_instance("c", 1)
    run = TrialRun.start(
        _spec(
            tmp_path,
            (a, local_ray_cluster.resource("c")),
            entry="tiny_train:train_allreduce",
            trial_id="b0-t011",
            pid_dir=str(tmp_path),
        )
    )
    pid_file = tmp_path / "rank1.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists():  # rank 1 is up and iterating
        assert time.monotonic() < deadline, "rank 1 never started"
        time.sleep(0.2)
    with pytest.raises(TimeoutError):
        run.result(timeout_s=1)  # still running
    began = time.monotonic()
    # The instance goes away: its worker process first (as when a VM dies), then its Ray node.
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    local_ray_cluster.remove_instance("c")
    with pytest.raises(TrainingError) as info:
        run.result(timeout_s=60)
    assert time.monotonic() - began < 12  # the surviving rank's allreduce fails; no wait for Ray's health check
    assert "b0-t011" in str(info.value) and ("rb-node-c" in str(info.value) or "died" in str(info.value))
    run.stop()
    # Ray counts the removed node's slot until its health check marks it dead (~12 s): check the rest.
    busy = wait_until_idle(timeout_s=3)
    assert "rb-node-a" not in busy and not any(k.startswith("pg:") for k in busy)
