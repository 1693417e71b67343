"""report.md: the same sections as report.html, with charts as PNG files beside it."""

from __future__ import annotations

from rubberband.report import fmt
from rubberband.report.charts import Chart, ChartSet
from rubberband.report.model import ReportData
from rubberband.report.source import TrackingLink


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def _image(chart: Chart | None) -> list[str]:
    return [f"![{chart.alt}]({chart.filename})", ""] if chart is not None else []


def _note(data: ReportData, key: str) -> list[str]:
    why = data.notes.get(key)
    return [f"> **Note:** {why}", ""] if why else []


def tracking_lines(links: tuple[TrackingLink, ...]) -> list[str]:
    """Where the trials were also logged: one line per tool (its link or command, and its error if it stopped)."""
    if not links:
        return []
    out = ["Trials logged to:", ""]
    for link in links:
        where = f"[{link.where}]({link.url})" if link.url else f"`{link.where}`"
        stopped = f" (stopped logging: {link.error})" if link.error else ""
        out.append(f"- {link.tool}: {where}{stopped}")
    return out + [""]


def render_markdown(data: ReportData, charts: ChartSet) -> str:
    """The report as Markdown; image links are the charts' file names (written beside report.md)."""
    s = data.summary
    out = [
        f"# rubberband report: {s.job_name}",
        "",
        f"{s.scheduler.upper()} job from `{data.source_label}`.",
        "",
        "## Summary",
        "",
    ]
    rows = [
        ["Deadline", f"{fmt.duration(s.deadline_s)} at {fmt.percent(s.confidence, 0)} confidence"],
        ["JCT p50 / p95", f"{fmt.duration(s.jct_p50_s)} / {fmt.duration(s.jct_p95_s)}"],
        ["Cost mean / p95", f"{fmt.usd(s.cost_mean_usd)} / {fmt.usd(s.cost_p95_usd)}"],
        ["P(meet deadline)", fmt.percent(s.p_meet_deadline)],
    ]
    if s.static_cost_mean_usd is not None:
        rows.append(
            [
                "Best static plan",
                f"{s.static_name}: {fmt.usd(s.static_cost_mean_usd)}, JCT p95 {fmt.duration(s.static_jct_p95_s)}",
            ]
        )
        rows.append(["Savings vs static", f"{fmt.usd(s.savings_usd)} ({fmt.ratio(s.savings_ratio)})"])
    if s.asha_cost_mean_usd is not None:
        verdict = "" if s.asha_meets_deadline else " (misses the deadline: the quickest cluster tried)"
        rows.append(
            [
                "ASHA on a fixed cluster",
                f"{s.asha_name}: {fmt.usd(s.asha_cost_mean_usd)}, JCT p95 {fmt.duration(s.asha_jct_p95_s)}{verdict}",
            ]
        )
    if s.brackets_text:
        rows.append(["Brackets", s.brackets_text])
    rows.append(["Catalog", f"{s.catalog_dates_text}; region {', '.join(s.regions) or fmt.DASH}"])
    out += _table(["", ""], rows)
    out += [
        f"Planned by {s.planner_algorithm} in {s.planner_seconds:.2f} s, {fmt.count(s.planner_samples)} "
        f"samples, seed {s.planner_seed}.",
        "",
    ]
    out += _note(data, "summary")
    out += [f"> {n}" for n in s.planner_notes] + ([""] if s.planner_notes else [])

    out += ["## Plan by stage", ""]
    out += _table(
        ["Stage", "Trials", "Epochs", "Instances", "Workers/trial", "Duration p50", "Duration p95", "Cost"],
        [
            [
                r.label,
                fmt.count(r.trials),
                str(r.epochs),
                f"{r.instances} × {r.instance_type}{' (' + r.market + ')' if r.spot else ''} ({r.cloud} {r.region})",
                str(r.workers_per_trial),
                fmt.duration(r.duration_s),
                fmt.duration(r.duration_p95_s),
                fmt.usd(r.cost_usd),
            ]
            for r in data.stages
        ],
    )

    c = data.costs
    out += [
        "## Cost breakdown",
        "",
        f"Total {fmt.usd(c.total_usd)}; overheads {fmt.usd(c.overhead_usd)} = "
        f"{fmt.percent(c.overhead_fraction)} of the bill.",
        "",
    ]
    out += _table(
        ["Where the money goes", "USD", "Share"],
        [[x.label, fmt.usd(x.usd), fmt.percent(x.fraction)] for x in c.overhead],
    )
    out += _image(charts.costs)

    out += ["## Allocation over time", ""]
    out += _image(charts.plan_gantt) + _note(data, "gantt")
    out += _image(charts.static_gantt) + _note(data, "gantt_static")
    out += _image(charts.actual_gantt)

    out += ["## Predicted distributions", ""]
    out += _image(charts.distributions) + _note(data, "distributions")
    if data.actual is not None:
        a = data.actual
        head = (
            f" Head instance: {fmt.usd(a.head_usd)} (predicted {fmt.usd(a.predicted_head_usd)}), in both."
            if a.head_usd or a.predicted_head_usd
            else ""
        )
        out += [
            f"Actual: JCT {fmt.duration(a.jct_s)} ({fmt.ratio(a.jct_vs_p50)} of p50), cost "
            f"{fmt.usd(a.cost_usd)} ({fmt.ratio(a.cost_vs_mean)} of mean).{fmt.before_start(a.before_start_s, a.head_early_s)}{head}",
            "",
        ]
        out += tracking_lines(a.tracking)
    if charts.progress is not None:
        out += ["## Search progress", ""]
        out += _image(charts.progress)

    out += ["## Cost versus deadline", ""]
    out += _image(charts.pareto)
    if data.pareto is not None:
        out += _table(
            ["Deadline", "Elastic cost", "Static cost", "JCT p95", "P(meet)"],
            [
                [
                    fmt.duration(p.deadline_s),
                    fmt.usd(p.cost_usd),
                    fmt.usd(p.static_cost_usd),
                    fmt.duration(p.jct_p95_s),
                    fmt.percent(p.p_meet_deadline),
                ]
                for p in data.pareto.points
            ],
        )
    out += _note(data, "pareto")

    out += ["## Cloud comparison", ""]
    if data.clouds is not None:
        out += _table(
            ["Option", "Instance types", "JCT p50", "JCT p95", "Cost mean", "P(meet)"],
            [
                [
                    r.label + (" (this plan)" if r.current else ""),
                    r.instance_types,
                    fmt.duration(r.jct_p50_s),
                    fmt.duration(r.jct_p95_s),
                    fmt.usd(r.cost_mean_usd),
                    fmt.percent(r.p_meet_deadline),
                ]
                if r.feasible
                else [r.label, r.note, fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH]
                for r in data.clouds
            ],
        )
    out += _note(data, "clouds")
    return "\n".join(out).rstrip() + "\n"
