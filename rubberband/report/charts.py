"""The report's charts, drawn with matplotlib's Agg backend into PNG bytes.

Each function takes parts of :class:`~rubberband.report.model.ReportData` and returns a
:class:`Chart`; nothing here computes a figure the report states in words, it only draws.
Figures are made with ``matplotlib.figure.Figure`` (not pyplot) inside an ``rc_context`` so
no global matplotlib state is touched and charts can be drawn from any thread.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - before anything imports pyplot

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import Formatter, MaxNLocator  # noqa: E402

from rubberband.report import fmt  # noqa: E402
from rubberband.report.model import (
    ACTUAL_COLOR,
    ActualData,
    PLAN_COLOR,
    STATIC_COLOR,  # noqa: E402
    CostData,
    GanttData,
    ParetoData,
    ReportData,
    Share,
    StageRow,
)

DPI = 144
WIDTH_IN = 9.6
STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.labelsize": 10,
    "axes.edgecolor": "#9AA0A6",
    "axes.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#E6E8EB",
    "grid.linewidth": 0.7,
    "axes.axisbelow": True,
    "xtick.color": "#3C4043",
    "ytick.color": "#3C4043",
    "legend.frameon": False,
    "legend.fontsize": 9,
    "figure.facecolor": "white",
}
STARTUP_COLOR = "#C9CDD2"
IDLE_COLOR = "#F1F3F4"
DEADLINE_COLOR = "#C5221F"
INK = "#202124"


@dataclass(frozen=True)
class Chart:
    """One picture: a file name (for report.md), alt text and the PNG bytes."""

    name: str
    filename: str
    alt: str
    png: bytes


def _render(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.12)
    return buf.getvalue()


@dataclass(frozen=True)
class _TimeAxis:
    """Minutes for jobs under three hours, hours beyond: the unit the axis label names."""

    divisor: float
    unit: str

    @classmethod
    def for_span(cls, seconds: float) -> "_TimeAxis":
        return cls(3600.0, "h") if seconds > 3 * 3600 else cls(60.0, "min")


class UsdAxis(Formatter):
    """Dollar tick labels with as many decimals as the tick spacing needs (a local run costs $0.0004)."""

    ticks: Sequence[float] = ()

    def set_locs(self, locs: Sequence[float]) -> None:
        self.ticks = list(locs)

    def __call__(self, value: float, pos: float | None = None) -> str:
        return f"${value:,.{usd_decimals(self.ticks or [value])}f}"


def usd_decimals(ticks: Sequence[float]) -> int:
    """Fewest decimals (none from $100 up, else 2 to 6) that write every tick exactly."""
    values = [float(t) for t in ticks]
    if values and max(abs(v) for v in values) >= 100:
        return 0
    for decimals in range(2, 7):
        if all(abs(round(v, decimals) - v) <= 1e-9 * max(1.0, abs(v)) for v in values):
            return decimals
    return 6


def _usd_ticks(axis, bins: int = 4) -> None:  # noqa: ANN001 - a matplotlib Axis
    """Dollar labels on ``axis`` at round steps, few enough that small amounts do not run into each other."""
    axis.set_major_locator(MaxNLocator(nbins=bins, steps=[1, 2, 5, 10]))
    axis.set_major_formatter(UsdAxis())


# -- Gantt --------------------------------------------------------------------------------------


def gantt_chart(
    gantt: GanttData, stages: tuple[StageRow, ...], *, name: str, x_max_s: float, deadline_s: float | None
) -> Chart:
    """One row per instance: start-up shaded, each stage's work in the stage's colour, idle pale.

    With several Hyperband brackets the rows form a lane per bracket: an instance has a row in the
    lane of its first stage's bracket and in the lane of every bracket that ran work on it (an
    instance handed from one bracket to another shows in both, each lane with its bracket's work)."""
    tl = gantt.timeline
    axis = _TimeAxis.for_span(x_max_s)
    served: dict[str, set[int]] = {inst.id: {_bracket_of(inst.first_stage, stages)} for inst in tl.instances}
    for task in tl.tasks:
        for iid in task.instance_ids:
            if iid in served:
                served[iid].add(task.bracket)
    lanes = sorted({b for bs in served.values() for b in bs})
    if len(lanes) < 2:  # one bracket: one row per instance, no lanes
        served = {iid: {lanes[0] if lanes else 0} for iid in served}
    # by bracket (one lane each), then request time, then naturally by id (i2 before i10)
    keyed = sorted(
        ((b, inst) for inst in tl.instances for b in served[inst.id]),
        key=lambda x: (x[0], x[1].requested_s, len(x[1].id), x[1].id),
    )
    rows = {(b, inst.id): n for n, (b, inst) in enumerate(keyed)}
    height = min(0.27 * len(keyed) + 1.7, 14)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH_IN, height))
        ax = fig.add_subplot()
        bar_h = 0.72
        d = axis.divisor
        for b, inst in keyed:
            y = rows[(b, inst.id)]
            ax.barh(
                y,
                (inst.released_s - inst.ready_s) / d,
                left=inst.ready_s / d,
                height=bar_h,
                color=IDLE_COLOR,
                edgecolor="#DADCE0",
                linewidth=0.6,
            )
            ax.barh(
                y,
                (inst.ready_s - inst.requested_s) / d,
                left=inst.requested_s / d,
                height=bar_h,
                color=STARTUP_COLOR,
                edgecolor="#9AA0A6",
                linewidth=0.4,
                hatch="////",
            )
        for task in tl.tasks:
            index = gantt.stage_of.get((task.bracket, task.stage))
            color = stages[index].color if index is not None else "#777777"
            for iid in task.instance_ids:
                row = rows.get((task.bracket, iid), rows.get((lanes[0] if len(lanes) < 2 else -1, iid)))
                if row is not None:
                    ax.barh(
                        row,
                        (task.end_s - task.start_s) / d,
                        left=task.start_s / d,
                        height=bar_h * 0.8,
                        color=color,
                        edgecolor="white",
                        linewidth=0.5,
                    )
        if deadline_s is not None:
            ax.axvline(deadline_s / d, color=DEADLINE_COLOR, linestyle="--", linewidth=1.3)
            ax.annotate(
                "deadline",
                (deadline_s / d, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -2),
                textcoords="offset points",
                color=DEADLINE_COLOR,
                fontsize=9,
                va="top",
            )
        ax.set_yticks(range(len(keyed)))
        prefix = (lambda b: f"b{b}  ") if len(lanes) > 1 else (lambda b: "")
        ax.set_yticklabels([f"{prefix(b)}{i.id}  {i.instance_type}" for b, i in keyed], fontsize=8.5)
        if len(lanes) > 1:  # a line between bracket lanes
            for n in range(1, len(keyed)):
                if keyed[n][0] != keyed[n - 1][0]:
                    ax.axhline(n - 0.5, color="#5F6368", linewidth=0.9)
        ax.invert_yaxis()
        ax.set_ylim(len(keyed) - 0.4, -0.6)
        ax.set_xlim(0, x_max_s / d)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel(f"time since job start ({axis.unit})")
        ax.set_title(gantt.title)
        used = sorted(
            {gantt.stage_of[(t.bracket, t.stage)] for t in tl.tasks if (t.bracket, t.stage) in gantt.stage_of}
        )
        handles = [Patch(facecolor=stages[i].color, label=stages[i].label) for i in used]
        handles += [
            Patch(facecolor=STARTUP_COLOR, hatch="////", edgecolor="#9AA0A6", label="start-up"),
            Patch(facecolor=IDLE_COLOR, edgecolor="#DADCE0", label="idle (billed)"),
        ]
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.1 - 0.45 / height),
            ncol=min(len(handles), 7),
            handlelength=1.4,
            columnspacing=1.2,
        )
        return Chart(
            name=name,
            filename=f"{name}.png",
            alt=f"{gantt.title}: {len(tl.instances)} instances over time, coloured by stage"
            + (f", a lane per bracket ({len(lanes)})" if len(lanes) > 1 else ""),
            png=_render(fig),
        )


def _bracket_of(position: int, stages: tuple[StageRow, ...]) -> int:
    """The Hyperband bracket of the stage at ``position`` in the plan (0 when out of range)."""
    return stages[position].bracket if 0 <= position < len(stages) else 0


# -- distributions ------------------------------------------------------------------------------


def _marker(ax, x: float, label: str, color: str, style: str) -> None:
    ax.axvline(x, color=color, linestyle=style, linewidth=1.4, label=label)


def _near(value: float, samples: tuple[float, ...], slack: float = 0.5) -> bool:
    """Whether ``value`` lies within the samples' range widened by ``slack`` times that range."""
    lo, hi = min(samples, default=value), max(samples, default=value)
    span = max(hi - lo, abs(hi) * 0.02, 1e-9)
    return lo - slack * span <= value <= hi + slack * span


def distribution_chart(data: ReportData) -> Chart:
    """Histograms of simulated JCT (deadline marked) and cost (static baseline marked)."""
    s = data.summary
    jct = data.distributions.jct_samples_s
    cost = data.distributions.cost_samples_usd
    deadline_shown = _near(s.deadline_s, jct + ((data.actual.jct_s,) if data.actual else ()), slack=1.0)
    axis = _TimeAxis.for_span(max(max(jct, default=0.0), s.deadline_s if deadline_shown else 0.0))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH_IN, 4.0))
        ax1, ax2 = fig.subplots(1, 2)
        d = axis.divisor
        ax1.hist([v / d for v in jct], bins=30, color=PLAN_COLOR, alpha=0.85, edgecolor="white", linewidth=0.5)
        _marker(ax1, s.jct_p50_s / d, f"p50 {fmt.duration(s.jct_p50_s)}", INK, ":")
        _marker(ax1, s.jct_p95_s / d, f"p95 {fmt.duration(s.jct_p95_s)}", INK, "-.")
        jct_title = f"Completion time, P(meet deadline) = {fmt.percent(s.p_meet_deadline)}"
        if deadline_shown:
            _marker(ax1, s.deadline_s / d, f"deadline {fmt.duration(s.deadline_s)}", DEADLINE_COLOR, "--")
        else:  # far to the right: marking it would squash the histogram into one bar
            jct_title += f"\n(deadline {fmt.duration(s.deadline_s)}, off this scale)"
        if data.actual is not None:
            _marker(ax1, data.actual.jct_s / d, f"actual {fmt.duration(data.actual.jct_s)}", ACTUAL_COLOR, "-")
        ax1.set_xlabel(f"job completion time ({axis.unit})")
        ax1.set_ylabel("simulated samples")
        ax1.set_title(jct_title)
        ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8.5)
        ax2.hist(cost, bins=30, color="#54A24B", alpha=0.85, edgecolor="white", linewidth=0.5)
        _marker(ax2, s.cost_mean_usd, f"mean {fmt.usd(s.cost_mean_usd)}", INK, ":")
        _marker(ax2, s.cost_p95_usd, f"p95 {fmt.usd(s.cost_p95_usd)}", INK, "-.")
        cost_title = "Cost"
        if s.static_cost_mean_usd is not None:
            if _near(s.static_cost_mean_usd, cost):
                _marker(ax2, s.static_cost_mean_usd, f"static {fmt.usd(s.static_cost_mean_usd)}", STATIC_COLOR, "--")
            else:  # a marker far away would squash the histogram into one bar: name it in the title instead
                cost_title = f"Cost (best static plan: {fmt.usd(s.static_cost_mean_usd)}, off this scale)"
        if data.actual is not None:
            _marker(ax2, data.actual.cost_usd, f"actual {fmt.usd(data.actual.cost_usd)}", ACTUAL_COLOR, "-")
        _usd_ticks(ax2.xaxis)
        ax2.set_xlabel("job cost (USD)")
        ax2.set_ylabel("simulated samples")
        ax2.set_title(cost_title)
        ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8.5)
        for ax in (ax1, ax2):
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout(w_pad=2.5)
        return Chart(
            name="distributions",
            filename="distributions.png",
            alt="Histograms of simulated job completion time and cost",
            png=_render(fig),
        )


# -- search progress ----------------------------------------------------------------------------


def progress_chart(actual: ActualData) -> Chart:
    """The incumbent's metric over the run (a step per change), each step marked with the fidelity it holds."""
    points = actual.progress
    axis = _TimeAxis.for_span(max(actual.jct_s, max(p.t_s for p in points)))
    d = axis.divisor
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH_IN, 3.4))
        ax = fig.subplots()
        xs = [p.t_s / d for p in points] + [max(actual.jct_s, points[-1].t_s) / d]
        ys = [p.value for p in points] + [points[-1].value]
        ax.step(xs, ys, where="post", color=ACTUAL_COLOR, linewidth=1.8)
        shown: set[int] = set()
        for p in points:
            if p.fidelity not in shown:  # where the incumbent first stands at a higher fidelity
                shown.add(p.fidelity)
                ax.plot([p.t_s / d], [p.value], "o", color=INK, markersize=4)
                ax.annotate(f"{p.fidelity} ep", (p.t_s / d, p.value), textcoords="offset points", xytext=(4, 5),
                            fontsize=8, color="#5F6368")  # fmt: skip
        best = points[-1]
        ax.set_xlabel(f"time since the run started ({axis.unit})")
        ax.set_ylabel(f"{actual.metric} ({'lower' if actual.mode == 'min' else 'higher'} is better)")
        ax.set_title(
            f"Incumbent {actual.metric}: final {best.value:.4g} (trial {best.trial_id}, after "
            f"{best.epochs_trained} epochs trained)"
        )
        fig.tight_layout()
        return Chart(
            name="progress",
            filename="progress.png",
            alt=f"The incumbent {actual.metric} over the run",
            png=_render(fig),
        )


# -- cost breakdown -----------------------------------------------------------------------------


def _share_bars(ax, shares: tuple[Share, ...], title: str) -> None:
    labels = [sh.label for sh in shares]
    values = [sh.usd for sh in shares]
    ax.barh(range(len(shares)), values, color=[sh.color for sh in shares], height=0.62)
    ax.set_yticks(range(len(shares)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    top = max(values, default=0.0) or 1.0
    for y, sh in enumerate(shares):
        ax.annotate(
            f"{fmt.usd(sh.usd)} ({fmt.percent(sh.fraction, 0)})",
            (sh.usd, y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8.5,
            color=INK,
        )
    ax.set_xlim(0, top * 1.6)
    _usd_ticks(ax.xaxis, bins=3)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("USD (mean)")
    ax.set_title(title)


def cost_chart(costs: CostData) -> Chart:
    """Where the money goes: by stage, by instance type, and training versus overheads."""
    rows = max(len(costs.by_stage), len(costs.by_instance_type), len(costs.overhead))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH_IN + 1.4, 0.42 * rows + 1.6))
        axes = fig.subplots(1, 3)
        _share_bars(axes[0], costs.by_stage, "By stage")
        _share_bars(axes[1], costs.by_instance_type, "By instance type")
        _share_bars(axes[2], costs.overhead, "Training vs overhead")
        fig.tight_layout(w_pad=1.5)
        return Chart(
            name="costs",
            filename="costs.png",
            alt="Cost broken down by stage, by instance type and into training and overheads",
            png=_render(fig),
        )


# -- Pareto -------------------------------------------------------------------------------------


def pareto_chart(pareto: ParetoData, deadline_s: float) -> Chart:
    """Mean cost against deadline for elastic plans and the best static plan; the chosen plan starred."""
    xs = [p.deadline_s for p in pareto.points] + [pareto.chosen_deadline_s]
    axis = _TimeAxis.for_span(max(xs))
    d = axis.divisor
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH_IN, 3.9))
        ax = fig.add_subplot()
        ax.plot(
            [p.deadline_s / d for p in pareto.points],
            [p.cost_usd for p in pareto.points],
            marker="o",
            color=PLAN_COLOR,
            linewidth=2,
            label="elastic plan (rubberband)",
        )
        static = [(p.deadline_s / d, p.static_cost_usd) for p in pareto.points if p.static_cost_usd is not None]
        if static:
            ax.plot(
                *zip(*static), marker="s", color=STATIC_COLOR, linewidth=1.6, linestyle="--", label="best static plan"
            )
        ax.scatter(
            [pareto.chosen_deadline_s / d],
            [pareto.chosen_cost_usd],
            marker="*",
            s=260,
            color="#F9AB00",
            edgecolor=INK,
            linewidth=0.8,
            zorder=5,
            label=f"this plan ({fmt.duration(deadline_s)})",
        )
        ax.axvspan(0, pareto.shortest_jct_s / d, color="#F1F3F4", zorder=0)
        ax.axvline(pareto.shortest_jct_s / d, color="#9AA0A6", linestyle=":", linewidth=1.2)
        ax.annotate(
            f"shortest feasible\n{fmt.duration(pareto.shortest_jct_s)}",
            (pareto.shortest_jct_s / d, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -4),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=8.5,
            color="#5F6368",
        )
        ax.set_xlim(pareto.shortest_jct_s / d * 0.8, max(xs) / d * 1.05)
        costs = [p.cost_usd for p in pareto.points] + [c for _, c in static] + [pareto.chosen_cost_usd]
        ax.set_ylim(0, max(costs) * 1.35)  # head room for the legend above the curves
        _usd_ticks(ax.yaxis)
        ax.set_xlabel(f"deadline ({axis.unit})")
        ax.set_ylabel("predicted mean cost (USD)")
        ax.set_title("Cost versus deadline")
        ax.legend(loc="upper right", ncol=3)
        return Chart(
            name="pareto",
            filename="pareto.png",
            alt="Predicted cost against deadline for elastic and static plans",
            png=_render(fig),
        )


# -- all ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChartSet:
    plan_gantt: Chart | None
    static_gantt: Chart | None
    actual_gantt: Chart | None
    distributions: Chart | None
    costs: Chart
    pareto: Chart | None
    progress: Chart | None = None

    def all(self) -> list[Chart]:
        return [
            c
            for c in (
                self.plan_gantt,
                self.static_gantt,
                self.actual_gantt,
                self.distributions,
                self.costs,
                self.pareto,
                self.progress,
            )
            if c is not None
        ]


def draw_all(data: ReportData) -> ChartSet:
    """Every chart the report data supports; Gantt charts share one time axis so they compare."""
    gantts = [g for g in (data.plan_gantt, data.static_gantt, data.actual.gantt if data.actual else None) if g]
    x_max = max([g.horizon_s for g in gantts] + [data.summary.deadline_s]) * 1.03
    deadline = data.summary.deadline_s

    def gantt(g: GanttData | None, name: str) -> Chart | None:
        return gantt_chart(g, data.stages, name=name, x_max_s=x_max, deadline_s=deadline) if g else None

    return ChartSet(
        plan_gantt=gantt(data.plan_gantt, "gantt_plan"),
        static_gantt=gantt(data.static_gantt, "gantt_static"),
        actual_gantt=gantt(data.actual.gantt if data.actual else None, "gantt_actual"),
        distributions=distribution_chart(data) if data.distributions.jct_samples_s else None,
        costs=cost_chart(data.costs),
        pareto=pareto_chart(data.pareto, deadline) if data.pareto else None,
        progress=progress_chart(data.actual) if data.actual and data.actual.progress else None,
    )
