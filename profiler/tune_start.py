"""Ray Tune's own trial start, measured with Ray Tune: what the plan's ASHA baseline pays per trial.

The ASHA baseline a plan shows is Ray Tune's ``ASHAScheduler`` on a fixed cluster. With Tune's default
``reuse_actors=False`` every trial is a new actor: Tune's driver loop places it, and a new worker process starts
its interpreter and imports (Ray Tune's, and the trial's framework) on the host's cores. Most ASHA trials train
one rung only, so these starts, and how they slow each other down, are much of its JCT (on 2 cores a start takes
about 2 s alone against 0.005 s for a trial on this executor's warm workers).

Three Tune runs on a profiling node of ``concurrent`` CPUs (:func:`concurrent_starts`: twice the host's cores),
every trial reporting once, placed by their CPUs as an ASHA run's trials are (a trial's place is free once Tune
has released the one before):

* :data:`SERIAL` trials of all the node's CPUs, reporting at once, one after another: the gaps from a trial's
  end to the next one's start, each a start alone. The first gap is left out: the trial after the first can
  start on a worker process Ray pre-started with the node (1.4-1.5 s against 2.0 s on 2 cores, in 2 of 5
  probes), which an ASHA run's later trials never find;
* :data:`STREAM_ROUNDS` × ``concurrent`` 1-CPU trials that report at once, so that every CPU is always starting
  a trial, as ASHA's first rung keeps its slots starting: the gaps from the end of the trial whose CPU a trial
  took to its start are starts sharing the host's cores. The second round's gaps are left out: they follow the
  first round, whose trials start together, some on pre-started workers. (Synchronised waves instead, each
  trial holding its CPU a second so that a wave ends together, gave 2.1 to 3.0 lanes on the same 2 cores from
  one probe to the next.)
* :data:`BUSY_ROUNDS` × half as many trials at once (2 CPUs each: the host's cores) that each train a moment
  first (a seeded draw from :data:`BUSY_TRAIN_S`, as ASHA's short rungs), so that starts meet the other trials'
  results and ends as in an ASHA run: Tune's driver handles those between a trial's end and the next one's start.
  On 2 cores, 2 trials at once start in 2.0 s when they report at once, as alone, and in 2.5 s when they train
  0.5 s first. (On a 1-core host, one at a time.)

:func:`~rubberband.planner.model.tune_start_model` turns them into a start's seconds, their spread, the start
lanes per core and the seconds a start takes on top amid other trials. The trials also hold a sliver of the
node's own resource, so they run on that node only.
"""

from __future__ import annotations

import importlib
import io
import os
import time
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rubberband.errors import ExecutionError
from rubberband.profile import TuneTrialStart

#: Trials started one after another (their gaps but the first are the starts alone: two fewer).
SERIAL = 5
#: Rounds of ``concurrent`` trials in the stream of concurrent starts (the first round's gaps are left out).
STREAM_ROUNDS = 4
#: The most trials started at once (twice the cores, so that the starts contend).
MAX_CONCURRENT = 16
#: Rounds of the busy stream (the first two rounds' gaps are left out): more than the others, as where a start
#: meets another trial's end varies from one to the next (0.1 to 1.1 s on top from one 8-trial stream to the next).
BUSY_ROUNDS = 8
#: Seconds each trial of the busy stream trains before it reports: uniform in this range, seeded.
BUSY_TRAIN_S = (0.2, 1.5)


def tune_installed() -> bool:
    """Whether Ray Tune (the ``ray[tune]`` extra) can be imported here."""
    try:
        importlib.import_module("ray.tune")
    except ImportError:
        return False
    return True


def concurrent_starts(host_cores: int) -> int:
    """Trials starting at once in the concurrent stream: twice the host's cores (2 to :data:`MAX_CONCURRENT`)."""
    return max(2, min(MAX_CONCURRENT, 2 * host_cores))


def start_gaps(spans: list[tuple[float, float]], concurrent: int) -> list[float]:
    """Per trial after the first ``concurrent``: its start − the end that freed its place (both in order)."""
    ends = sorted(end for _, end in spans)
    starts = sorted(start for start, _ in spans)
    return [starts[k] - ends[k - concurrent] for k in range(concurrent, len(starts))]


def measure_tune_start(
    storage: Path,
    node_resource: str,
    *,
    cpus: int,
    imports: tuple[str, ...] = (),
    time_budget_s: float | None = None,
) -> TuneTrialStart:
    """Time Ray Tune's trial starts on the node of ``cpus`` CPUs holding ``node_resource`` (one at a time, ``cpus``
    at once, then ``cpus // 2`` at once among training trials), on this host's cores, through the Ray cluster this
    process is connected to; each trial imports ``imports`` as it starts (the trial's framework, as the user's
    trainable would). Tune's results go under ``storage``. The Tune runs together stop after ``time_budget_s``
    (Tune's own ``time_budget_s``; None: no limit). Raises ExecutionError when Ray Tune is missing, a run fails or
    the time is up."""
    if not tune_installed():
        raise ExecutionError("Ray Tune is not installed (the raytune extra)")
    import ray
    from ray import tune

    if cpus < 2:
        raise ExecutionError("Ray Tune's concurrent trial starts need a node of at least 2 CPUs")
    runs = _TuneRuns(tune, storage, imports, _Limit(time_budget_s))
    pin = {node_resource: 0.001}
    serial = runs.spans({"cpu": cpus, **pin}, [0.0] * SERIAL)
    stream = runs.spans({"cpu": 1, **pin}, [0.0] * (STREAM_ROUNDS * cpus))
    alone, together = start_gaps(serial, 1)[1:], start_gaps(stream, cpus)[cpus:]
    busy = cpus // 2  # trials of 2 CPUs: the host's cores at once
    busy_s = start_gaps(runs.spans({"cpu": 2, **pin}, busy_train_s(BUSY_ROUNDS * busy)), busy)[busy:]
    if not alone or not together or not busy_s or min(alone + together + busy_s) <= 0:
        raise ExecutionError("Ray Tune's trials did not start one after another as asked")
    return TuneTrialStart(
        serial_s=[round(g, 4) for g in alone],
        concurrent=cpus,
        concurrent_s=[round(g, 4) for g in together],
        host_cores=os.cpu_count() or 1,
        ray_version=ray.__version__,
        busy_concurrent=busy,
        busy_concurrent_s=[round(g, 4) for g in busy_s],
    )


def busy_train_s(trials: int) -> list[float]:
    """What each trial of the busy stream trains before it reports (seconds; seeded, so every probe alike)."""
    low, high = BUSY_TRAIN_S
    return [round(float(x), 3) for x in np.random.default_rng(0).uniform(low, high, trials)]


class _Limit:
    """The seconds left of the probe's time budget, by the driver's clock (None: no limit)."""

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self._end = None if budget_s is None else time.perf_counter() + budget_s

    def left_s(self) -> float | None:
        """Seconds left (None: no limit); raises ExecutionError when none are."""
        if self._end is None:
            return None
        left = self._end - time.perf_counter()
        if left <= 0:
            raise self.spent()
        return left

    def spent(self) -> ExecutionError:
        return ExecutionError(f"it ran past its {self.budget_s:.0f} s of the budget")


@dataclass(frozen=True)
class _TuneRuns:
    """The probe's Tune runs: Ray Tune's module, where their results go, what each trial imports as it starts and
    the probe's time limit."""

    tune: Any
    storage: Path
    imports: tuple[str, ...]
    limit: _Limit

    def spans(self, resources: dict[str, float], train_s: list[float]) -> list[tuple[float, float]]:
        """(start, end) per trial of one Tune run of a trial per ``train_s`` of ``resources`` each, each reporting
        after training (sleeping) its seconds, by the driver's clock; the run stops where the limit is up."""
        trials = len(train_s)
        tune, limit = self.tune, self.limit
        marks: dict[str, list[float]] = {}

        class Marks(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                marks.setdefault(trial.trial_id, [time.perf_counter(), 0.0])

            def on_trial_complete(self, iteration, trials, trial, **info):
                marks[trial.trial_id][1] = time.perf_counter()

        def trial(config):  # defined here: pickled by value, so a trial imports only what a user's would
            for name in config["imports"]:
                importlib.import_module(name)
            time.sleep(config["train_s"][config["i"]])
            tune.report({"done": 1})

        tuner = tune.Tuner(
            tune.with_resources(trial, resources),
            param_space={
                "i": tune.grid_search(list(range(trials))),
                "imports": list(self.imports),
                "train_s": list(train_s),
            },
            tune_config=tune.TuneConfig(time_budget_s=limit.left_s()),
            run_config=tune.RunConfig(storage_path=str(self.storage), callbacks=[Marks()], verbose=0),
        )
        with redirect_stdout(io.StringIO()):  # Tune's run summary is not the profiler's output
            results = tuner.fit()
        finished = len(marks) == trials and all(end > 0.0 for _, end in marks.values())
        if not results.errors and not finished and limit.budget_s is not None:
            raise limit.spent()  # Tune stopped the run at its time budget
        if results.errors or not finished:
            failure = results.errors[0] if results.errors else "no result"
            raise ExecutionError(f"a Ray Tune probe run failed: {failure}")
        return [(start, end) for start, end in marks.values()]
