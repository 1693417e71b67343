"""report.html: one self-contained page (inline CSS, charts as PNG data URIs) from ReportData.

Every figure is formatted with :mod:`rubberband.report.fmt`; figures that tests check against
the plan JSON sit in elements carrying ``data-field="name"`` and the raw number in
``data-value`` (``repr`` of the float, so it round-trips exactly).
"""

from __future__ import annotations

import base64
from html import escape

from rubberband.report import fmt
from rubberband.report.charts import Chart, ChartSet
from rubberband.report.model import ReportData
from rubberband.report.source import TrackingLink

CSS = """
:root{--ink:#1f2328;--muted:#5f6b76;--line:#e3e6ea;--bg:#f6f7f9;--accent:#4C78A8;--good:#2f8f46}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 -apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:1040px;margin:0 auto;padding:28px 20px 60px}
header h1{margin:0 0 4px;font-size:26px}
header p{margin:0;color:var(--muted)}
section{background:#fff;border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin-top:18px}
h2{margin:0 0 12px;font-size:18px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:18px;font-weight:600;font-variant-numeric:tabular-nums}
.card .s{color:var(--muted);font-size:13px}
.card.good .v{color:var(--good)}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
td.l,th.l{text-align:left}
tr.current td{font-weight:600;background:#f1f6fb}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:middle}
figure{margin:12px 0 0}
figure img{max-width:100%;height:auto;display:block;border:1px solid var(--line);border-radius:6px}
figcaption{color:var(--muted);font-size:13px;margin-top:4px}
.note{border-left:3px solid #EECA3B;background:#fffbea;padding:8px 12px;margin:8px 0;color:#5c4b00;font-size:14px}
.meta{color:var(--muted);font-size:13px}
.scroll{overflow-x:auto}
"""


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _num(field: str, value: float | int | None, text: str) -> str:
    """A formatted figure with its raw value attached for machine checks."""
    if value is None:
        return f'<span data-field="{escape(field)}" data-value="">{escape(text)}</span>'
    raw = repr(float(value)) if isinstance(value, float) else str(value)
    return f'<span data-field="{escape(field)}" data-value="{raw}">{escape(text)}</span>'


def _card(key: str, value_html: str, sub: str = "", cls: str = "") -> str:
    sub_html = f'<div class="s">{sub}</div>' if sub else ""
    return (
        f'<div class="card {cls}"><div class="k">{escape(key)}</div><div class="v">{value_html}</div>{sub_html}</div>'
    )


def _note(data: ReportData, key: str) -> str:
    why = data.notes.get(key)
    return f'<p class="note" data-note="{escape(key)}">{escape(why)}</p>' if why else ""


def _figure(chart: Chart | None, caption: str) -> str:
    if chart is None:
        return ""
    return (
        f'<figure><img src="{data_uri(chart.png)}" alt="{escape(chart.alt)}" data-chart="{escape(chart.name)}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def _summary(data: ReportData) -> str:
    s = data.summary
    cards = [
        _card(
            "Deadline",
            _num("deadline_s", s.deadline_s, fmt.duration(s.deadline_s)),
            f"at {_num('confidence', s.confidence, fmt.percent(s.confidence, 0))} confidence",
        ),
        _card(
            "JCT p50 / p95",
            _num("jct_p50_s", s.jct_p50_s, fmt.duration(s.jct_p50_s))
            + " / "
            + _num("jct_p95_s", s.jct_p95_s, fmt.duration(s.jct_p95_s)),
            f"mean {escape(fmt.duration(s.jct_mean_s))}",
        ),
        _card(
            "Cost mean / p95",
            _num("cost_mean_usd", s.cost_mean_usd, fmt.usd(s.cost_mean_usd))
            + " / "
            + _num("cost_p95_usd", s.cost_p95_usd, fmt.usd(s.cost_p95_usd)),
            f"p50 {escape(fmt.usd(s.cost_p50_usd))}",
        ),
        _card("P(meet deadline)", _num("p_meet_deadline", s.p_meet_deadline, fmt.percent(s.p_meet_deadline))),
    ]
    if s.static_cost_mean_usd is not None:
        cards.append(
            _card(
                "Savings vs best static",
                _num("savings_usd", s.savings_usd, fmt.usd(s.savings_usd))
                + " · "
                + _num("savings_ratio", s.savings_ratio, fmt.ratio(s.savings_ratio)),
                f"static {_num('static_cost_mean_usd', s.static_cost_mean_usd, fmt.usd(s.static_cost_mean_usd))}"
                f" ({escape(s.static_name or '')}), JCT p95 {escape(fmt.duration(s.static_jct_p95_s))}",
                cls="good",
            )
        )
    if s.asha_cost_mean_usd is not None:
        ratio = s.asha_cost_mean_usd / s.cost_mean_usd if s.cost_mean_usd > 0 else None
        cards.append(
            _card(
                "ASHA on a fixed cluster" if s.asha_meets_deadline else "ASHA (misses the deadline)",
                _num("asha_cost_mean_usd", s.asha_cost_mean_usd, fmt.usd(s.asha_cost_mean_usd))
                + (" · " + escape(fmt.ratio(ratio)) if ratio is not None else ""),
                f"{escape(s.asha_name or '')}, JCT p95 {escape(fmt.duration(s.asha_jct_p95_s))}",
            )
        )
    cards.append(_card("Catalog", escape(s.catalog_dates_text), f"region {escape(', '.join(s.regions) or fmt.DASH)}"))
    budget = f", budget {escape(fmt.usd(s.budget_usd))}" if s.budget_usd is not None else ""
    meta = (
        f'<p class="meta">{escape(s.scheduler.upper())} optimising {escape(s.metric)} ({escape(s.mode)}){budget}; '
        f"planned by {escape(s.planner_algorithm)} in {s.planner_seconds:.2f} s, "
        f"{escape(fmt.count(s.planner_samples))} samples, seed {s.planner_seed}.</p>"
    )
    notes = "".join(
        f'<p class="note">{escape(n)}</p>' for n in ((s.brackets_text,) if s.brackets_text else ()) + s.planner_notes
    )
    return (
        f'<section id="summary"><h2>Summary</h2><div class="cards">{"".join(cards)}</div>{meta}'
        f"{_note(data, 'summary')}{notes}</section>"
    )


def _stages(data: ReportData) -> str:
    head = (
        "<tr><th class=l>Stage</th><th>Trials</th><th>Epochs</th><th class=l>Instances</th>"
        "<th>Workers/trial</th><th>Duration p50</th><th>Duration p95</th><th>Cost</th></tr>"
    )
    rows = []
    for r in data.stages:
        i = r.index
        where = (
            f"{_num(f'stage.{i}.instances', r.instances, str(r.instances))} × "
            f'<span data-field="stage.{i}.instance_type" data-value="{escape(r.instance_type)}">'
            f"{escape(r.instance_type)}</span>{' (' + escape(r.market) + ')' if r.spot else ''}"
            f' <span class="meta">{escape(r.cloud)} {escape(r.region)}</span>'
        )
        rows.append(
            f'<tr data-stage="{i}"><td class=l><span class="swatch" style="background:{r.color}"></span>'
            f"{escape(r.label)}</td><td>{_num(f'stage.{i}.trials', r.trials, fmt.count(r.trials))}</td>"
            f"<td>{_num(f'stage.{i}.epochs', r.epochs, str(r.epochs))}</td><td class=l>{where}</td>"
            f"<td>{_num(f'stage.{i}.workers_per_trial', r.workers_per_trial, str(r.workers_per_trial))}</td>"
            f"<td>{_num(f'stage.{i}.duration_s', r.duration_s, fmt.duration(r.duration_s))}</td>"
            f"<td>{escape(fmt.duration(r.duration_p95_s))}</td>"
            f"<td>{_num(f'stage.{i}.cost_usd', r.cost_usd, fmt.usd(r.cost_usd))}</td></tr>"
        )
    return (
        f'<section id="stages"><h2>Plan by stage</h2><div class="scroll"><table>{head}{"".join(rows)}'
        f"</table></div></section>"
    )


def _costs(data: ReportData, charts: ChartSet) -> str:
    c = data.costs
    rows = "".join(
        f'<tr><td class=l><span class="swatch" style="background:{s.color}"></span>{escape(s.label)}</td>'
        f"<td>{escape(fmt.usd(s.usd))}</td><td>{escape(fmt.percent(s.fraction))}</td></tr>"
        for s in c.overhead
    )
    text = (
        f"<p>Total {_num('costs.total_usd', c.total_usd, fmt.usd(c.total_usd))}; overheads (startup, idle, "
        f"billing minimums, transfer) {escape(fmt.usd(c.overhead_usd))} = "
        f"{escape(fmt.percent(c.overhead_fraction))} of the bill.</p>"
    )
    table = f"<table><tr><th class=l>Where the money goes</th><th>USD</th><th>Share</th></tr>{rows}</table>"
    return (
        f'<section id="costs"><h2>Cost breakdown</h2>{text}{table}'
        f"{_figure(charts.costs, 'Cost by stage, by instance type and by kind of spending.')}</section>"
    )


def tracking_section(links: tuple[TrackingLink, ...]) -> str:
    """Where the trials were also logged (TensorBoard, MLflow): a link or a command per tool."""
    if not links:
        return ""
    items = ""
    for link in links:
        where = (
            f'<a href="{escape(link.url, quote=True)}">{escape(link.where)}</a>'
            if link.url
            else f"<code>{escape(link.where)}</code>"
        )
        stopped = f" (stopped logging: {escape(link.error)})" if link.error else ""
        items += f"<li>{escape(link.tool)}: {where}{stopped}</li>"
    return f'<p id="tracking">Trials logged to:</p><ul>{items}</ul>'


def _gantt(data: ReportData, charts: ChartSet) -> str:
    body = _figure(charts.plan_gantt, "Instances over time in this plan, coloured by the stage they run.")
    body += _note(data, "gantt")
    body += _figure(charts.static_gantt, "The best static plan on the same time axis.")
    body += _note(data, "gantt_static")
    if data.actual is not None:
        body += _figure(charts.actual_gantt, "What actually ran.")
    return f'<section id="gantt"><h2>Allocation over time</h2>{body}</section>'


def _distributions(data: ReportData, charts: ChartSet) -> str:
    body = _figure(charts.distributions, "Simulated job completion time and cost (Monte Carlo samples).")
    body += _note(data, "distributions")
    if data.actual is not None:
        a = data.actual
        body += (
            f"<p>Actual: JCT {_num('actual.jct_from_start_s', a.jct_s, fmt.duration(a.jct_s))} "
            f"({escape(fmt.ratio(a.jct_vs_p50))} of p50), cost "
            f"{_num('actual.cost_usd', a.cost_usd, fmt.usd(a.cost_usd))} "
            f"({escape(fmt.ratio(a.cost_vs_mean))} of mean).{escape(fmt.before_start(a.before_start_s, a.head_early_s))}"
        )
        if a.head_usd or a.predicted_head_usd:
            body += (
                f" Head instance: {_num('actual.head_usd', a.head_usd, fmt.usd(a.head_usd))} (predicted "
                f"{escape(fmt.usd(a.predicted_head_usd))}), in both."
            )
        body += "</p>" + tracking_section(a.tracking)
    return f'<section id="distributions"><h2>Predicted distributions</h2>{body}</section>'


def _progress(data: ReportData, charts: ChartSet) -> str:
    """A run's search progress: the incumbent's metric over the run (nothing for a plan alone)."""
    if charts.progress is None:
        return ""
    caption = "The best result at the highest fidelity reached so far, as the run's trials reported it."
    return f'<section id="progress"><h2>Search progress</h2>{_figure(charts.progress, caption)}</section>'


def _pareto(data: ReportData, charts: ChartSet) -> str:
    body = _figure(charts.pareto, "Cheapest plan cost at each deadline, elastic versus static.")
    if data.pareto is not None:
        rows = "".join(
            f"<tr><td>{escape(fmt.duration(p.deadline_s))}</td><td>{escape(fmt.usd(p.cost_usd))}</td>"
            f"<td>{escape(fmt.usd(p.static_cost_usd))}</td><td>{escape(fmt.duration(p.jct_p95_s))}</td>"
            f"<td>{escape(fmt.percent(p.p_meet_deadline))}</td></tr>"
            for p in data.pareto.points
        )
        body += (
            "<div class=scroll><table><tr><th>Deadline</th><th>Elastic cost</th><th>Static cost</th>"
            f"<th>JCT p95</th><th>P(meet)</th></tr>{rows}</table></div>"
        )
    body += _note(data, "pareto")
    return f'<section id="pareto"><h2>Cost versus deadline</h2>{body}</section>'


def _clouds(data: ReportData) -> str:
    body = ""
    if data.clouds is not None:
        rows = []
        for r in data.clouds:
            cls = ' class="current"' if r.current else ""
            if r.feasible:
                cells = (
                    f"<td class=l>{escape(r.instance_types)}</td><td>{escape(fmt.duration(r.jct_p50_s))}</td>"
                    f"<td>{escape(fmt.duration(r.jct_p95_s))}</td><td>{escape(fmt.usd(r.cost_mean_usd))}</td>"
                    f"<td>{escape(fmt.percent(r.p_meet_deadline))}</td>"
                )
            else:
                cells = f'<td class=l colspan="5">{escape(r.note)}</td>'
            rows.append(f"<tr{cls}><td class=l>{escape(r.label)}{' (this plan)' if r.current else ''}</td>{cells}</tr>")
        body = (
            "<div class=scroll><table><tr><th class=l>Option</th><th class=l>Instance types</th><th>JCT p50</th>"
            f"<th>JCT p95</th><th>Cost mean</th><th>P(meet)</th></tr>{''.join(rows)}</table></div>"
        )
    body += _note(data, "clouds")
    return f'<section id="clouds"><h2>Cloud comparison</h2>{body}</section>'


def render_html(data: ReportData, charts: ChartSet) -> str:
    """The whole report as one HTML string with no external references."""
    s = data.summary
    title = f"rubberband report: {s.job_name}"
    parts = [
        _summary(data),
        _stages(data),
        _costs(data, charts),
        _gantt(data, charts),
        _distributions(data, charts),
        _progress(data, charts),
        _pareto(data, charts),
        _clouds(data),
    ]
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><main><header><h1>{escape(title)}</h1>"
        f"<p>{escape(s.scheduler.upper())} job from {escape(data.source_label)}; deadline "
        f"{escape(fmt.duration(s.deadline_s))} at {escape(fmt.percent(s.confidence, 0))} confidence.</p></header>"
        f"{''.join(parts)}</main></body></html>\n"
    )
