"""``rubberband plan``: the cheapest elastic plan that meets the deadline, versus the best static plan."""

from __future__ import annotations


import typer
from rich import box
from rich.console import Console
from rich.table import Table

from rubberband.commands._injected import injected
from rubberband.commands._options import deadline_flag
from rubberband.console import stdout
from rubberband.errors import InputError
from rubberband.files import check_writable
from rubberband.inputs import CLOUD_CHOICES, load_job_inputs
from rubberband.plan import Plan, StagePlan, plan_json, write_plan
from rubberband.planning import HEAD_MODES, PlanningOptions, plan_from_inputs
from rubberband.units import format_duration, format_usd, format_usd_column

ORDER = 20


def print_plan(plan: Plan) -> None:
    """The plan as a table, its totals, and how it compares with the best static plan."""
    console = stdout()
    if not console.is_terminal and console.width < 120:  # pipes and CI logs: do not squeeze the table
        console = Console(highlight=False, soft_wrap=False, width=120)
    if plan.is_asha:
        console.print(asha_table(plan))
        console.print(
            "Phase k: every trial has started and none trains below rung k; it holds that many instances "
            "(idle ones beyond released at once, busy ones as they go idle). ≈trials: SHA's survivors, for scale."
        )
    else:
        console.print(stage_table(plan))
    if plan.parallel_brackets:
        console.print(brackets_line(plan))
    print_totals(plan, console)


def asha_table(plan: Plan) -> Table:
    """An ASHA plan by phase of the rung ladder: rung, its cumulative epochs, the cluster the phase holds."""
    table = Table(
        title=f"ASHA plan for {plan.job.name} (η={plan.job.eta}, {plan.job.trials} trials): deadline "
        f"{format_duration(plan.deadline_s)} at {plan.confidence:.0%} confidence",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name in ("phase", "rung epochs", "≈trials"):
        table.add_column(name, justify="right")
    table.add_column("instances", no_wrap=True)
    table.add_column("w/trial", justify="right")
    table.add_column("time p50", justify="right", no_wrap=True)
    table.add_column("cost", justify="right")
    costs = format_usd_column([s.predicted_cost_usd or 0.0 for s in plan.stages])
    for s, cost in zip(plan.stages, costs):
        table.add_row(
            str(s.stage),
            str(s.epochs),
            str(s.trials),
            f"{s.instances} × {s.instance_type}",
            str(s.workers_per_trial),
            format_duration(s.predicted_duration_s or 0.0),
            cost,
        )
    return table


def market_cell(plan: Plan, s: StagePlan) -> str:
    """A stage's market as the plan table shows it: on spot, the first zone tried (+ how many more), the expected
    $/h over them and ``prior`` where the type has no traces; on-demand where spot was allowed, a ``*`` that
    :func:`why_not_lines` explains."""
    if not s.spot:
        return "on-demand*" if s.why_not_spot else "on-demand"
    entry = plan.spot_entry(s)
    more = f" +{len(entry.tried) - 1}" if entry is not None and len(entry.tried) > 1 else ""
    price = f" ${s.spot_price_hr:.3f}/h" if s.spot_price_hr is not None else ""
    return f"spot {s.zone or ''}{more}{price}{' prior' if s.spot_prior else ''}".replace("  ", " ")


def stage_table(plan: Plan) -> Table:
    """A SHA or Hyperband plan by stage."""
    table = Table(
        title=f"Plan for {plan.job.name}: deadline {format_duration(plan.deadline_s)} at "
        f"{plan.confidence:.0%} confidence",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    hyperband = plan.job.scheduler == "hyperband"
    several_clouds = len({s.cloud for s in plan.stages}) > 1 or len(plan.catalog.clouds) > 1
    if hyperband:
        table.add_column("bracket", justify="right")
    for name in ("stage", "trials", "epochs"):
        table.add_column(name, justify="right")
    table.add_column("instances", no_wrap=True)
    if plan.spot is not None:
        table.add_column("market", no_wrap=True)
    table.add_column("w/trial", justify="right")
    table.add_column("time p50", justify="right", no_wrap=True)
    table.add_column("cost", justify="right")
    costs = format_usd_column([s.predicted_cost_usd or 0.0 for s in plan.stages])
    for s, cost in zip(plan.stages, costs):
        where = f"{s.instances} × {s.instance_type}" + (f" ({s.cloud})" if several_clouds else "")
        market = [market_cell(plan, s)] if plan.spot is not None else []
        row = [
            str(s.stage),
            str(s.trials),
            str(s.epochs),
            where,
            *market,
            str(s.workers_per_trial),
            format_duration(s.predicted_duration_s or 0.0),
            cost,
        ]
        table.add_row(*([str(s.bracket)] if hyperband else []), *row)
    return table


def print_totals(plan: Plan, console: Console) -> None:
    """The plan's predicted totals and how it compares with its baselines."""
    p = plan.predicted
    console.print(
        f"JCT p50 {format_duration(p.jct_s.p50)}, p95 {format_duration(p.jct_s.p95)}; "
        f"cost mean {format_usd(p.cost_usd.mean)}, p95 {format_usd(p.cost_usd.p95)}; "
        f"P(meet deadline) {p.p_meet_deadline:.1%}"
    )
    if plan.spot is not None:
        from rubberband.report.model import spot_notes

        for line in spot_notes(plan):
            console.print(line)
    if plan.survivors is not None:
        console.print(f"Survivors: {plan.survivors.note}")
    if plan.head is not None:
        h = plan.head
        console.print(
            f"Includes the head instance {h.instance_type} (${h.price_hr:.4f}/h for boot "
            f"{format_duration(h.boot_s)} + JCT + grace {format_duration(h.grace_s)}): "
            f"{format_usd(p.cost_breakdown.head_usd)} mean"
        )
    static = plan.baselines.get("static")
    if static is not None:
        s0 = static.stages[0]
        saving = static.predicted.cost_usd.mean - p.cost_usd.mean
        ratio = static.predicted.cost_usd.mean / p.cost_usd.mean if p.cost_usd.mean > 0 else float("inf")
        workers = f"{s0.workers_per_trial} worker{'s' if s0.workers_per_trial != 1 else ''}/trial"
        what = (
            f"{'best fixed ASHA cluster' if plan.is_asha else 'best static plan'} ({s0.instances} × "
            f"{s0.instance_type}, {workers}, "
            f"{format_usd(static.predicted.cost_usd.mean)}, JCT p95 {format_duration(static.predicted.jct_s.p95)})"
        )
        if _same_cluster(plan, static):
            console.print(
                f"This is the {what}: no elastic plan found is cheaper by more than 1% and as fast"
                + (
                    f"; run elastically it releases idle instances early and costs {format_usd(p.cost_usd.mean)}"
                    if saving > 0.01 * static.predicted.cost_usd.mean
                    else ""
                )
            )
        elif ratio < 1.01:
            console.print(f"vs {what}: about as cheap ({ratio:.2f}×)")
        else:
            console.print(f"vs {what}: saves {format_usd(saving)} ({ratio:.2f}× cheaper)")
    else:
        console.print("No static plan meets the deadline at this confidence.")
    if plan.asha is not None and not plan.is_asha:  # an ASHA plan's static baseline is that cluster
        console.print(asha_line(plan))
    exact = plan.baselines.get("exact")
    if exact is not None:
        gap = p.cost_usd.mean / exact.predicted.cost_usd.mean if exact.predicted.cost_usd.mean > 0 else 1.0
        console.print(
            f"Exact optimum: {format_usd(exact.predicted.cost_usd.mean)} (this plan {gap:.3f}× it); "
            f"{exact.note or 'search extent unknown'}"
        )
    console.print(
        f"Planned in {plan.planner.seconds:.2f} s ({plan.planner.candidates_evaluated} candidates, "
        f"{plan.planner.samples} samples, seed {plan.planner.seed})."
    )


def brackets_line(plan: Plan) -> str:
    """How parallel Hyperband brackets start and share instances."""
    late = [f"{b} at +{format_duration(o)}" for b, o in enumerate(plan.bracket_offsets_s) if o > 0]
    starts = "all start at once" if not late else "later starts: bracket " + ", ".join(late)
    moves = len(plan.handoffs)
    return f"Brackets run side by side ({starts}); {moves} instance{'s' if moves != 1 else ''} handed between brackets."


def asha_line(plan: Plan) -> str:
    """ASHA on a fixed cluster, beside the elastic plan."""
    a = plan.asha
    p = plan.predicted
    cluster = f"{a.instances} × {a.instance_type}, {a.workers_per_trial} worker{'s' if a.workers_per_trial != 1 else ''}/trial"
    if not a.meets_deadline:
        return (
            f"ASHA on a fixed cluster does not meet the deadline; its quickest ({cluster}): JCT p95 "
            f"{format_duration(a.predicted.jct_s.p95)}, {format_usd(a.predicted.cost_usd.mean)}"
            + _starts_note(plan)
            + "."
        )
    ratio = a.predicted.cost_usd.mean / p.cost_usd.mean if p.cost_usd.mean > 0 else float("inf")
    return (
        f"vs ASHA on a fixed cluster ({cluster}, {format_usd(a.predicted.cost_usd.mean)}, JCT p95 "
        f"{format_duration(a.predicted.jct_s.p95)}): {ratio:.2f}× the elastic plan's cost" + _starts_note(plan)
    )


def _starts_note(plan: Plan) -> str:
    """Whether an SHA plan's ASHA baseline starts trials as Ray Tune does (an ASHA plan's runs on this executor)."""
    if plan.is_asha:
        return ""
    if plan.asha is not None and plan.asha.trial_starts == "ray_tune":
        return " (Ray Tune's trial starts, as profiled)"
    return " (trial starts on warm workers: Ray Tune's were not profiled, so Ray Tune would take longer)"


def _same_cluster(plan: Plan, static) -> bool:
    """Whether the plan runs the static plan's cluster (same type, count and width in every stage)."""
    key = lambda s: (s.cloud, s.instance_type, s.instances, s.workers_per_trial)  # noqa: E731
    return [key(s) for s in plan.stages] == [key(s) for s in static.stages]


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        ctx: typer.Context,
        spec: str = typer.Argument(..., metavar="SPEC", help="Job spec (YAML)."),
        profile: str = typer.Option(None, "--profile", help="Profile JSON (default: the spec's `profile:`)."),
        deadline: str = typer.Option(None, "--deadline", help="Override the deadline (90m, 2h, seconds)."),
        cloud: str = typer.Option(None, "--cloud", help="aws, gcp, local or any (default: the spec's clouds)."),
        confidence: float = typer.Option(None, "--confidence", help="P(JCT ≤ deadline) to guarantee, 0..1."),
        samples: int = typer.Option(1000, "--samples", help="Monte Carlo samples per plan."),
        seed: int = typer.Option(None, "--seed", min=0, help="Random seed (default: the spec's seed)."),
        out: str = typer.Option(None, "--out", help="Write the plan JSON here (atomically)."),
        as_json: bool = typer.Option(False, "--json", help="Print only the plan JSON on stdout."),
        report: str = typer.Option(None, "--report", help="Also write an HTML/Markdown report into this folder."),
        head: str = typer.Option(
            "instance",
            "--head",
            help="How an aws/gcp run will place its executor and Ray "
            "head (as `rubberband run --head`): 'instance' bills the run's own head instance "
            "in the predictions, 'local' (this machine) does not.",
        ),
        exact: bool = typer.Option(
            False,
            "--exact",
            help="Also search the whole plan space exactly (branch and "
            "bound, small jobs only) and report the plan's gap to it.",
        ),
        spot_model: str = typer.Option(
            None,
            "--spot-model",
            help="Spot model JSON (`rubberband spot fit`) for a "
            "spec with resources.spot: true (default: the shipped one).",
        ),
    ) -> None:
        """Plan the cheapest elastic allocation that meets the deadline, and compare with static."""
        deadline_s = deadline_flag(deadline)
        if cloud is not None and cloud not in CLOUD_CHOICES:
            raise InputError(f"--cloud must be one of {', '.join(CLOUD_CHOICES)} (got {cloud!r})")
        if confidence is not None and not 0 < confidence < 1:
            raise InputError(f"--confidence must be between 0 and 1 exclusive (got {confidence})")
        if samples < 10 or samples > 100_000:
            raise InputError(f"--samples must be between 10 and 100000 (got {samples})")
        if head not in HEAD_MODES:
            raise InputError(f"--head {head!r}: use 'instance' (a head instance per run) or 'local' (this machine)")
        if out is not None:
            check_writable("--out", out)
        if report is not None:
            check_writable("--report", report, new_folder=True)
        inputs = load_job_inputs(spec, profile=profile, cloud=cloud)
        options = PlanningOptions(
            samples=samples,
            seed=seed,
            include_exact=exact,
            head=head,
            spot_model=spot_model,
            fork_workers=injected(ctx).fork_workers,
        )
        result = plan_from_inputs(inputs, deadline_s=deadline_s, confidence=confidence, cloud=cloud, options=options)
        if out is not None:
            write_plan(result, out)
        report_path = None
        if report is not None:
            from rubberband.report import write_report

            report_path = write_report(result, report)
        if as_json:
            typer.echo(plan_json(result))
            return
        print_plan(result)
        if out is not None:
            stdout().print(f"Plan written to {out}")
        if report_path is not None:
            stdout().print(f"Report written to {report_path}")
