"""One policy, two engines: on a deterministic workload the real executor's JCT is the simulator's.

A real local run (CLI, real Ray nodes, the real trial runtime) of a 4-trial SHA job whose epochs are
sleeps (no noise): stage 0 runs its 4 trials one after another on one ``local.cpu1``, stage 1 its 2 trials
on two, so the second instance is requested ahead while stage 0 runs — when, the shared
:class:`~rubberband.planner.policies.PrefetchPolicy` says (lead time: the start-up quantile of what the
run measured for that type). The simulator is then given a deterministic model made of what the run
measured (node start-up, the worker start of a new node, the task time) and must predict the run's JCT
within what it does not model: the executor's own per-stage overhead (dispatch and promotion gaps, one
wake each), measured in the journal, and the spread of the two real node start-ups. About 40 s.
"""

from __future__ import annotations

import json
import statistics

import pytest
from executor_helpers import cli_env, make_plan, write_job

from rubberband.catalog import load_catalog
from rubberband.executor import journal as J
from rubberband.executor.cluster import WAKE_SLICE_S as POLL_S  # the loop's longest wake latency on Ray
from rubberband.plan import write_plan
from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel
from rubberband.planner.policies import PrefetchPolicy
from rubberband.planner.schedule import stages_for
from rubberband.planner.simulator import Simulator, StageConfig
from rubberband.spec import load_spec

STAGES = [("local.cpu1", 1, 1), ("local.cpu1", 2, 1)]


def _measured_model(*, epoch_s: float, task_s: float, worker_start_s: float, startup_s: float) -> PerformanceModel:
    """A deterministic model: one iteration per epoch, fixed task start, fixed node start-up."""
    device = DeviceModel(
        alpha_grad=epoch_s,
        beta_grad=0.0,
        alpha_sync_node=0.0,
        beta_sync_node=0.0,
        alpha_sync_cross=0.0,
        beta_sync_cross=0.0,
        gamma=1.0,
    )
    return PerformanceModel(
        dataset_size=1,
        batch_size_per_worker=1,
        restart_overhead_s=task_s - epoch_s,
        checkpoint_size_gb=0.0,
        eval_time_s=0.0,
        reference_device="CPU",
        devices={"CPU": device},
        straggler_sigma=0.0,
        startup_by_cloud={"local": StartupModel((startup_s,), "measured")},
        termination_by_cloud={"local": StartupModel((1.0,), "test")},
        task_start_s=task_s - epoch_s,
        worker_start_s=worker_start_s,
    )


@pytest.mark.e2e
def test_the_real_jct_is_the_simulators_within_the_measured_overhead(tmp_path, cli):
    spec_path = write_job(tmp_path / "job", trials=4, eta=2, min_epochs=1, max_epochs=2, epoch_s=2.0)
    spec = load_spec(spec_path)
    guess_s = 2.05  # the plan's task time (a 2 s epoch plus the trial's start), before the run measures it
    plan = make_plan(spec, STAGES, durations=[4 * guess_s, guess_s])
    plan = plan.model_copy(update={"stages": [s.model_copy(update={"predicted_task_s": guess_s}) for s in plan.stages]})
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        str(spec_path),
        "--plan",
        str(tmp_path / "plan.json"),
        "--run-dir",
        str(run_dir),
        "--yes",
        env=cli_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    summary = json.loads((run_dir / "result.json").read_text())
    _compare(events, summary, spec, guess_s)


def _compare(events: list[dict], summary: dict, spec, guess_s: float) -> None:
    def of(event_type, **match):
        return [e for e in events if e["type"] == event_type and all(e.get(k) == v for k, v in match.items())]

    t0 = events[0]["t"]
    head_s = of(J.DECISION, kind="head_started")[0]["t"] - t0
    ready = {e["id"]: e for e in of(J.INSTANCE_READY)}
    first_id = of(J.INSTANCE_REQUESTED, stage=0)[0]["id"]
    second_id = of(J.INSTANCE_REQUESTED, stage=1)[0]["id"]
    stopped = {(e["trial_id"], e["stage"]): e for e in of(J.TRIAL_STOPPED, reason="finished")}
    started = {(e["trial_id"], e["stage"]): e for e in of(J.TRIAL_STARTED)}
    stage0 = sorted((started[k]["t"], stopped[k]["seconds"]) for k in stopped if k[1] == 0)
    task_s = statistics.median(s for _, s in stage0[1:])  # later trials find warm workers
    stage1 = [stopped[k]["seconds"] for k in stopped if k[1] == 1 and started[k]["instances"] == [first_id]]
    epoch_s = statistics.median(e["seconds"] for e in of(J.EPOCH))

    def node_start(ident: str) -> tuple[float, float | None]:
        """(boot: request → Ray node up, worker start: node up → its first trial's workers ready, None when no
        trial ran on it: a trial waits for a node's workers only where no other slot frees sooner)."""
        keys = [k for k in started if started[k]["instances"] == [ident] and k in stopped]
        if not keys:
            return ready[ident]["startup_s"], None
        key = min(keys, key=lambda k: started[k]["t"])
        return ready[ident]["startup_s"], started[key]["t"] + stopped[key]["setup_s"] - ready[ident]["t"]

    (s0, w0), (s1, w1) = node_start(first_id), node_start(second_id)
    # the simulator, told what the run measured, with the executor's own prefetch policy
    model = _measured_model(epoch_s=epoch_s, task_s=task_s, worker_start_s=w0, startup_s=s0)
    sched = spec.scheduler
    stages = stages_for(
        "sha", trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    catalog = load_catalog(["local"])
    configs = [StageConfig(catalog.find(t, cloud="local"), n, w) for t, n, w in STAGES]
    sim = Simulator(stages, model, samples=1)
    simulated = sim.simulate(configs)
    sim_after_head = float(simulated.jct[0]) - s0  # the simulator boots a local head as one node start-up
    real_after_head = summary["actual"]["jct_s"] - head_s

    # what the simulator does not model, measured: the controller's dispatch / promotion gaps per stage
    # (a new node's first trial starts once its workers answer: that wait is the modelled worker start)
    workers_up = {
        first_id: ready[first_id]["t"] + w0,
        second_id: ready[second_id]["t"] + (w1 if w1 is not None else 0.0),
    }
    overhead = 0.0
    for g in (0, 1):
        first = min((e for e in of(J.TRIAL_STARTED, stage=g)), key=lambda e: e["t"])
        began = max(of(J.STAGE_STARTED, stage=g)[0]["t"], max(workers_up[i] for i in first["instances"]))
        last = max(e["t"] for e in of(J.TRIAL_STOPPED, stage=g))
        overhead += max(0.0, first["t"] - began) + (of(J.STAGE_FINISHED, stage=g)[0]["t"] - last) + POLL_S
    # waves in stage 0 wait for the previous trial's end to be seen (one poll each) before the next starts
    overhead += sum(b[0] - (a[0] + a[1]) for a, b in zip(stage0, stage0[1:]))
    noise = abs(s1 - s0) + (abs(w1 - w0) if w1 is not None else 0.0) + sum(abs(x - task_s) for x in stage1)
    prefetch = of(J.DECISION, kind="prefetch")[0]
    if prefetch["t"] < stage0[0][0] + stage0[0][1]:  # before any trial ended the executor used the plan's guess
        noise += len(stage0) * abs(guess_s - task_s)
    tolerance = overhead + noise + POLL_S
    print(
        f"\nreal {real_after_head:.2f}s, simulated {sim_after_head:.2f}s after the head; tolerance {tolerance:.2f}s "
        f"(overhead {overhead:.2f}s, measured spread {noise:.2f}s); node start-ups {s0:.2f}/{s1:.2f}s, "
        f"worker starts {w0:.2f}/{w1}s, task {task_s:.2f}s"
    )
    assert real_after_head == pytest.approx(sim_after_head, abs=tolerance)

    # and the prefetch itself: requested when the shared policy says, seconds after stage 0's first task
    assert prefetch["lead_s"] == pytest.approx(PrefetchPolicy().lead_s([s0]))
    offset = sim.request_offsets(configs)[1]
    assert prefetch["t"] - stage0[0][0] == pytest.approx(offset, abs=overhead + noise + 2 * POLL_S)
