"""Where a report's facts come from: a plan alone now, a plan plus what actually happened later.

A :class:`ReportSource` hands the report a :class:`~rubberband.plan.Plan` and, when it knows
them, the actual outcome of running it (:class:`ActualOutcome`). :class:`PlanSource` is the
plan-only source; a run directory's source (``RunSource``, written with the executor) returns
the plan it ran plus an ``ActualOutcome``, and the report then adds its predicted-vs-actual
overlay (actual Gantt beside the planned one, actual JCT and cost marked on the predicted
distributions) without any other change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from rubberband.errors import RunDirError
from rubberband.plan import Plan, Timeline, load_plan
from rubberband.report.progress import ProgressPoint, search_progress


@dataclass(frozen=True)
class TrackingLink:
    """Where a run's trials were also logged (``tracking`` in the spec): the tool, how to open it (a URL, or a
    command) and the tool's error where it stopped logging part way."""

    tool: str  # "TensorBoard", "MLflow"
    where: str  # the command or location shown
    url: str | None = None  # a link, where the tool has a page for it
    error: str | None = None


@dataclass(frozen=True)
class ActualOutcome:
    """What a finished (or stopped) run measured, in the plan's units: its JCT from the executor's start, as the plan
    predicts it (``before_start_s``: what the user's command spent before that, part of result.json's JCT)."""

    jct_s: float
    cost_usd: float
    timeline: Timeline
    stage_duration_s: tuple[float, ...] = ()
    stage_cost_usd: tuple[float, ...] = ()
    completed: bool = True
    head_usd: float = 0.0  # the run's head instance (head mode), part of cost_usd
    tracking: tuple[TrackingLink, ...] = ()
    progress: tuple[ProgressPoint, ...] = ()  # the incumbent's metric over the run (report/progress.py)
    before_start_s: float = 0.0
    head_early_s: float = 0.0  # the part of it the run's Ray head was already starting (begun while planning)


@runtime_checkable
class ReportSource(Protocol):
    """Anything a report can be made from."""

    @property
    def plan(self) -> Plan: ...

    @property
    def label(self) -> str: ...

    def actual(self) -> ActualOutcome | None: ...


@dataclass(frozen=True)
class PlanSource:
    """A plan on its own: the report shows predictions only."""

    plan: Plan
    label: str = "plan"

    @classmethod
    def from_path(cls, path: str | Path) -> "PlanSource":
        """Load and validate a plan JSON file (PlanFileError on anything wrong)."""
        path = Path(path)
        return cls(plan=load_plan(path), label=str(path))

    def actual(self) -> ActualOutcome | None:
        return None


def as_source(source: "ReportSource | Plan | str | Path") -> ReportSource:
    """Accept a source, a Plan, the path of a plan JSON file or a run directory."""
    if isinstance(source, Plan):
        return PlanSource(plan=source, label=source.job.name)
    if isinstance(source, (str, Path)):
        return RunSource.from_dir(source) if Path(source).is_dir() else PlanSource.from_path(source)
    return source


@dataclass(frozen=True)
class RunSource:
    """A run directory of ``rubberband run``: the plan it ran and what actually happened.

    Built from the run's journal (instance lifetimes, trial tasks) and ``result.json``
    (actual JCT and cost under the billing rules, per-stage actuals) when the run wrote one.
    """

    plan: Plan
    label: str
    outcome: ActualOutcome

    def actual(self) -> ActualOutcome | None:
        return self.outcome

    @classmethod
    def from_dir(cls, run_dir: str | Path) -> "RunSource":
        from rubberband.clouds import billing_rule
        from rubberband.executor import journal as J
        from rubberband.plan import TimelineInstance, TimelineTask

        run_dir = Path(run_dir)
        state = J.read_state(run_dir)  # RunDirError (exit 2) when it is not a run directory
        plan = Plan.model_validate(state.plan)
        t0 = state.first_started_at
        end = state.ended_at or max(
            [t0] + [life.terminated_at or life.requested_at for life in state.instances.values()]
        )
        instances = []
        for life in sorted(state.instances.values(), key=lambda i: i.requested_at):
            released = life.terminated_at or end
            rule = billing_rule(life.cloud)
            instances.append(
                TimelineInstance(
                    id=life.id,
                    instance_type=life.instance_type,
                    cloud=life.cloud,
                    first_stage=life.stage,
                    last_stage=life.stage,
                    requested_s=life.requested_at - t0,
                    ready_s=(life.ready_at or released) - t0,
                    released_s=released - t0,
                    cost_usd=rule.cost(released - life.requested_at, life.price_hr),
                )
            )
        tasks, open_tasks = [], {}
        events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
        for event in events:
            if event["type"] == J.TRIAL_STARTED:
                open_tasks[event["trial_id"]] = event
            elif event["type"] == J.TRIAL_STOPPED and event["trial_id"] in open_tasks:
                began = open_tasks.pop(event["trial_id"])
                stage = plan.stages[began["stage"]] if began["stage"] < len(plan.stages) else None
                tasks.append(
                    TimelineTask(
                        trial=int(event["trial_id"].rsplit("t", 1)[-1] or 0),
                        stage=stage.stage if stage else began["stage"],
                        bracket=stage.bracket if stage else 0,
                        instance_ids=list(began.get("instances", [])),
                        workers=int(began.get("workers", 1)),
                        start_s=began["t"] - t0,
                        end_s=event["t"] - t0,
                    )
                )
        result = _read_result(run_dir / "result.json")
        if result is not None:
            jct, cost, head_usd, durations, costs = result
        else:  # a run that died before writing its result: what the journal shows so far
            jct, cost, durations, costs = end - t0, sum(i.cost_usd for i in instances), (), ()
            head_usd = 0.0
            if state.head is not None:  # billed as result.json would, up to the journal's end
                from rubberband.executor.accounting import bill_head

                head_usd = bill_head(state.head, now=end).cost_usd
                cost += head_usd
        outcome = ActualOutcome(
            jct_s=jct,
            cost_usd=cost,
            timeline=Timeline(instances=instances, tasks=tasks),
            stage_duration_s=durations,
            stage_cost_usd=costs,
            completed=state.status == "finished",
            head_usd=head_usd,
            tracking=tracking_links(run_dir),
            progress=search_progress(events, plan.job.metric, plan.job.mode, t0),
            before_start_s=state.before_start_s,
            head_early_s=state.head_early_s,
        )
        return cls(plan=plan, label=f"run {state.run_id}", outcome=outcome)


def _read_result(path: Path) -> tuple[float, float, float, tuple[float, ...], tuple[float, ...]] | None:
    """A run's result.json as the report reads it: JCT, cost, the head's bill and each stage's duration and cost
    (None: the run wrote none); a damaged one is a one-line RunDirError saying how to report without it."""
    if not path.exists():
        return None
    try:
        result = json.loads(path.read_text())
        measured = result["actual"]
        jct = float(measured.get("jct_from_start_s", measured["jct_s"]))
        stages = result.get("stages", [])
        return (
            jct,
            float(measured["cost_usd"]),
            float(measured.get("head_usd") or 0.0),
            tuple(float(s.get("actual_duration_s") or 0.0) for s in stages),
            tuple(float(s.get("actual_cost_usd") or 0.0) for s in stages),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON, UTF-8, shape and number errors
        raise RunDirError(
            f"{path} is damaged ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); move it aside to "
            f"report the run from its journal alone"
        ) from None


def tracking_links(run_dir: Path) -> tuple[TrackingLink, ...]:
    """The TensorBoard log folder and the MLflow experiment a run's trials were logged to (its tracking.json)."""
    from rubberband.executor.tracking import read_tracking

    data = read_tracking(run_dir) or {}
    links = []
    board = data.get("tensorboard")
    if isinstance(board, dict) and board.get("logdir"):
        logdir = (run_dir / str(board["logdir"])).resolve()
        links.append(TrackingLink("TensorBoard", f"tensorboard --logdir {logdir}", None, board.get("error")))
    flow = data.get("mlflow")
    if isinstance(flow, dict) and flow.get("uri"):
        url = flow.get("experiment_url")
        where = url or f"experiment {flow.get('experiment')!r} (id {flow.get('experiment_id')}) at {flow['uri']}"
        links.append(TrackingLink("MLflow", str(where), url, flow.get("error")))
    return tuple(links)
