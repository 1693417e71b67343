"""The Ray Tune adapter: an unchanged Ray Tune function trainable runs as a rubberband training function.

In-process tests call the adapted function with a small in-memory TrainContext (the adapter's only
boundary with rubberband); the end-to-end test runs examples/raytune.yaml through the real CLI on
local Ray nodes, with the real trial runtime.
"""

from __future__ import annotations

import json
import importlib
import sys
import textwrap
import time

import pytest

from rubberband.raytune import STATE_KEY, adapt, is_tune_trainable
from rubberband.training import TrainContext

tune = pytest.importorskip("ray.tune")


class MemoryContext(TrainContext):
    """A one-worker TrainContext keeping reports and checkpoints in memory (the real one: executor/context.py)."""

    def __init__(
        self,
        start: int,
        end: int,
        *,
        saved: dict | None = None,
        max_iterations: int | None = None,
        rank_of: tuple[int, int] = (0, 1),
    ) -> None:
        """Epochs ``start`` to ``end``, as rank ``rank_of[0]`` of ``rank_of[1]`` workers."""
        self.trial_id, self.start_epoch, self.end_epoch = "b0-t000", start, end
        (self.rank, self.world_size), self.local_rank, self.device, self.process_group = rank_of, 0, "cpu", None
        self.saved = saved
        self.max_iterations = max_iterations
        self.reports: list[tuple[int, dict]] = []
        self.latencies: list[float] = []
        self.passes = 0

    def batches(self, iterable):
        self.passes += 1
        start = time.perf_counter()
        for count, item in enumerate(iterable, 1):
            yield item
            now = time.perf_counter()
            self.latencies.append(now - start)
            start = now
            if self.max_iterations is not None and count >= self.max_iterations:
                return

    def report(self, epoch, /, **metrics):
        self.reports.append((epoch, metrics))

    def save_checkpoint(self, state):
        self.saved = state

    def load_checkpoint(self):
        return self.saved


def _module(tmp_path, name: str, body: str):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(name)
        return sys.modules[name]
    finally:
        sys.path.remove(str(tmp_path))


@pytest.fixture
def example():
    from conftest import examples_on_path

    with examples_on_path():
        yield importlib.import_module("raytune_trainable")


CONFIG = {"lr": 0.01, "best_lr": 0.01, "epoch_s": 0.05, "max_epochs": 100}


def test_one_argument_functions_are_trainables_and_others_pass_through(example):
    def ours(config, ctx):
        return None

    assert is_tune_trainable(example.train_fn) and not is_tune_trainable(ours)
    assert adapt(ours) is ours
    assert adapt(example.train_fn).ray_tune_trainable is example.train_fn
    assert not is_tune_trainable(lambda config, extra=1: None)  # two positional parameters
    with pytest.raises(TypeError, match="function"):
        adapt(tune.Trainable)


def test_reports_become_epochs_checkpoints_carry_over_and_the_rung_stops_it(example):
    train = adapt(example.train_fn)
    first = MemoryContext(0, 1)
    began = time.perf_counter()
    train(dict(CONFIG), first)  # a trainable that would run 100 epochs is stopped after epoch 0
    assert time.perf_counter() - began < 20 * CONFIG["epoch_s"] + 5
    assert [e for e, _ in first.reports] == [0] and first.reports[0][1]["epoch"] == 0.0
    assert json.loads(first.saved[STATE_KEY]["state.json"]) == {"epoch": 0}
    assert len(first.latencies) == 1 and first.latencies[0] >= CONFIG["epoch_s"]  # one timed iteration per epoch

    second = MemoryContext(1, 4, saved=first.saved)  # the next rung, from the checkpoint
    train(dict(CONFIG), second)
    assert [e for e, _ in second.reports] == [1, 2, 3]
    assert [m["epoch"] for _, m in second.reports] == [1.0, 2.0, 3.0]  # the trainable resumed where it left off
    assert json.loads(second.saved[STATE_KEY]["state.json"]) == {"epoch": 3}
    assert second.reports[-1][1]["score"] > first.reports[0][1]["score"]
    # the Ray session functions are themselves again afterwards
    assert tune.report.__module__.startswith("ray.") and tune.get_checkpoint.__module__.startswith("ray.")


def test_speed_spread_is_per_configuration_and_off_by_default(example):
    assert example.speed_factor({"lr": 0.01}) == 1.0
    spread = {lr: example.speed_factor({"lr": lr, "speed_sigma": 0.4}) for lr in (0.001, 0.01, 0.1, 0.3)}
    assert spread == {lr: example.speed_factor({"lr": lr, "speed_sigma": 0.4}) for lr in spread}  # stable
    assert len(set(spread.values())) == 4 and max(spread.values()) / min(spread.values()) > 1.1
    ctx = MemoryContext(0, 1)
    slow = max(spread, key=spread.get)
    adapt(example.train_fn)({**CONFIG, "lr": slow, "speed_sigma": 0.4}, ctx)
    assert ctx.latencies[0] >= CONFIG["epoch_s"] * spread[slow]


def test_each_epoch_is_a_pass_of_the_real_context_so_the_profiler_times_whole_epochs(example, tmp_path):
    """On the real WorkerContext every report ends one pass of ``ctx.batches``: the profiler's whole-epoch
    times (its measurement of several configurations' speeds) exist for a Ray Tune trainable too."""
    from executor_helpers import worker_context

    from rubberband.profiler.runner import epoch_times

    ctx = worker_context(tmp_path, end_epoch=4)
    adapt(example.train_fn)({**CONFIG, "speed_sigma": 0.4}, ctx)
    assert [r.epoch for r in ctx.reports] == [0, 1, 2, 3] and ctx.pass_lengths == [1, 1, 1, 1]
    expected = CONFIG["epoch_s"] * example.speed_factor({**CONFIG, "speed_sigma": 0.4})
    assert len(ctx.iteration_latencies_s) == 4 and min(ctx.iteration_latencies_s) >= expected
    assert len(epoch_times(ctx.pass_times)) == 2 and min(epoch_times(ctx.pass_times)) >= expected


def test_the_recorded_replay_written_for_ray_tune_reports_the_same_curve():
    """examples/recorded.py's ``train_fn`` (the Ray Tune user's form of the replay, bench_vs_raytune's Ray Tune
    side) reports what rubberband's ``train`` does, epoch for epoch, and resumes from its checkpoint."""
    from conftest import examples_on_path

    with examples_on_path():
        recorded = importlib.import_module("recorded")
    table = recorded.load_table("data/nasbench201_cifar10_slice.json")
    arch = min(table, key=lambda a: table[a]["train_time_s"])
    config = {"arch": arch, "max_epochs": 3, "time_scale": 6000.0}
    train = adapt(recorded.train_fn)
    first = MemoryContext(0, 1)
    train(dict(config), first)
    second = MemoryContext(1, 3, saved=first.saved)
    train(dict(config), second)
    curve = [recorded.accuracy(table[arch]["val_acc"], e, 3) for e in range(3)]
    assert [m["val_acc"] for _, m in first.reports + second.reports] == pytest.approx(curve)
    assert [e for e, _ in second.reports] == [1, 2]
    assert min(first.latencies + second.latencies) >= recorded.epoch_seconds(table[arch], 3, 6000.0)


@pytest.mark.e2e  # real training
def test_the_digits_cnn_written_for_ray_tune_learns_and_resumes_from_its_checkpoint():
    """examples/digits.py's ``train_fn`` (bench_vs_raytune's Ray Tune side of the torch workload): real
    training, its torch checkpoint carried through the adapter, and the run resumed from it trains on
    from the saved weights (the same accuracies as an uninterrupted run)."""
    from conftest import examples_on_path

    with examples_on_path():
        digits = importlib.import_module("digits")
    config = {"lr": 0.05, "momentum": 0.9, "channels": 8, "hidden": 16, "max_epochs": 3}
    train = adapt(digits.train_fn)
    first = MemoryContext(0, 1)
    train(dict(config), first)
    second = MemoryContext(1, 3, saved=first.saved)
    train(dict(config), second)
    whole = MemoryContext(0, 3)
    train(dict(config), whole)
    resumed = [m["val_acc"] for _, m in first.reports + second.reports]
    assert resumed == pytest.approx([m["val_acc"] for _, m in whole.reports])
    assert [e for e, _ in second.reports] == [1, 2] and resumed[-1] > 0.5  # ten classes: chance is 0.1


def test_profiling_stops_it_after_the_iterations_it_needs(example):
    ctx = MemoryContext(0, 50, max_iterations=2)
    adapt(example.train_fn)(dict(CONFIG), ctx)
    assert [e for e, _ in ctx.reports] == [0, 1] and len(ctx.latencies) == 2


def test_other_ranks_only_join_the_checkpoint_load(example):
    ctx = MemoryContext(0, 3, rank_of=(1, 2))
    adapt(example.train_fn)(dict(CONFIG), ctx)
    assert ctx.reports == []


def test_names_imported_from_ray_and_ray_train_report_work(tmp_path):
    module = _module(
        tmp_path,
        "tune_style_b",
        """
        import os, tempfile
        from ray.tune import report, get_checkpoint, get_context, Checkpoint

        def trainable(config):
            ckpt = get_checkpoint()
            start = 0
            if ckpt is not None:
                with ckpt.as_directory() as path:
                    start = int(open(os.path.join(path, "n")).read()) + 1
            for i in range(start, 1000):
                try:
                    with tempfile.TemporaryDirectory() as d:
                        open(os.path.join(d, "n"), "w").write(str(i))
                        report({"loss": 1.0 / (i + 1), "name": get_context().get_trial_id()},
                               checkpoint=Checkpoint.from_directory(d))
                except Exception:  # a trainable swallowing errors must still be stopped
                    pass
        """,
    )
    ctx = MemoryContext(2, 4, saved={STATE_KEY: {"n": b"1"}})
    adapt(module.trainable)(dict(CONFIG), ctx)
    assert ctx.reports == [(2, {"loss": pytest.approx(1 / 3)}), (3, {"loss": pytest.approx(1 / 4)})]
    assert module.report.__module__.startswith("ray.")  # restored in the module too

    pytest.importorskip("ray.train")
    legacy = _module(
        tmp_path,
        "train_style",
        """
        import ray.train

        def trainable(config):
            for i in range(100):
                ray.train.report({"acc": i})
        """,
    )
    ctx = MemoryContext(0, 2)
    adapt(legacy.trainable)(dict(CONFIG), ctx)
    assert ctx.reports == [(0, {"acc": 0.0}), (1, {"acc": 1.0})] and ctx.saved is None


@pytest.mark.e2e
def test_an_unchanged_ray_tune_trainable_runs_end_to_end(tmp_path):
    """examples/raytune.yaml through the real CLI on local Ray nodes: 9 trials → 3 → 1 (9 epochs)."""
    import subprocess

    from conftest import EXAMPLES
    from executor_helpers import cli_env, make_plan, run_pids

    from rubberband.executor import journal as J
    from rubberband.plan import write_plan
    from rubberband.spec import load_spec

    spec = load_spec(EXAMPLES / "raytune.yaml")
    plan = make_plan(
        spec, [("local.cpu2", 1, 1), ("local.cpu1", 1, 1), ("local.cpu1", 1, 1)], durations=[5.0, 4.0, 4.0]
    )
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(EXAMPLES / "raytune.yaml"),
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
    state = J.read_state(run_dir)
    configs = {t: s.config["lr"] for t, s in state.trials.items()}
    closest = sorted(configs, key=lambda t: abs(__import__("math").log10(configs[t] / 0.01)))
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["best"]["trial_id"] == closest[0]
    best = state.trials[closest[0]]
    assert sorted(best.epochs) == list(range(9))  # every epoch reported once, in order, across three rungs
    assert [best.epochs[e]["epoch"] for e in range(9)] == [float(e) for e in range(9)]  # resumed, not restarted
    started = [
        e
        for e in J.iter_events(run_dir / J.JOURNAL_NAME)
        if e["type"] == J.TRIAL_STARTED and e["trial_id"] == closest[0]
    ]
    assert [(e["start_epoch"], e["end_epoch"]) for e in started] == [(0, 1), (1, 3), (3, 9)]
