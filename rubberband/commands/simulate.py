"""``rubberband simulate``: replay a plan (Monte Carlo) under its own model or under spot traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

from rubberband.console import stdout
from rubberband.errors import InputError
from rubberband.units import format_duration, format_usd

ORDER = 27


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        plan_path: Path = typer.Argument(..., metavar="PLAN", help="Plan JSON (from `rubberband plan --out`)."),
        preemption_traces: Path = typer.Option(
            None,
            "--preemption-traces",
            help="Folder of spot traces: each "
            "sample replays a random trace from a random point instead of the "
            "plan's fitted spot model (docs/spot.md).",
        ),
        samples: int = typer.Option(1000, "--samples", help="Monte Carlo samples."),
        seed: int = typer.Option(None, "--seed", min=0, help="Random seed (default: the plan's)."),
        as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    ) -> None:
        """Hit rate P(JCT ≤ deadline) and the cost distribution of a plan, replayed."""
        from rubberband.catalog import load_catalog
        from rubberband.plan import load_plan
        from rubberband.planner import Replay, replay_plan
        from rubberband.profile import load_profile
        from rubberband.report.replan import plan_profile_path

        if samples < 10 or samples > 100_000:
            raise InputError(f"--samples must be between 10 and 100000 (got {samples})")
        plan = load_plan(plan_path)
        profile_path = plan_profile_path(plan)
        if profile_path is None:
            raise InputError(
                f"{plan_path}: the plan names no profile to simulate with; re-run `rubberband plan --out` to record it"
            )
        profile = load_profile(profile_path)
        catalog = load_catalog(sorted({s.cloud for s in plan.stages}))
        seed = plan.planner.seed if seed is None else seed
        if plan.is_asha:
            if preemption_traces is not None:
                raise InputError("--preemption-traces: ASHA plans run on on-demand instances; leave the option out")
            show_asha(plan, asha_figures(plan, profile, catalog, samples=samples, seed=seed), as_json=as_json)
            return
        scenarios = None
        source = "the plan's own model" + (" (spot model)" if plan.spot is not None else "")
        if preemption_traces is not None:
            scenarios = trace_scenarios(plan, preemption_traces, seed=seed, samples=samples)
            source = f"traces in {preemption_traces}"
        result = replay_plan(
            plan, profile, catalog, samples=samples, replay=Replay(seed=seed, spot_scenarios=scenarios)
        )
        figures = summary(result.jct, result.cost, plan.deadline_s, plan.confidence)
        figures["source"] = source
        figures["spot_stages"] = sum(1 for s in plan.stages if s.spot)
        figures["spot_events_mean"] = {k: round(float(np.mean(v)), 4) for k, v in sorted(result.spot_events.items())}
        if as_json:
            typer.echo(json.dumps(figures, indent=2))
            return
        c = figures["cost_usd"]
        stdout().print(f"{plan.job.name}: {samples} samples under {source}")
        stdout().print(
            f"hit rate P(JCT ≤ {format_duration(plan.deadline_s)}) {figures['hit_rate']:.1%} "
            f"(asked {plan.confidence:.0%}); JCT p50 {format_duration(figures['jct_s']['p50'])}, "
            f"p95 {format_duration(figures['jct_s']['p95'])}"
        )
        stdout().print(
            f"cost p10 {format_usd(c['p10'])}, p50 {format_usd(c['p50'])}, p90 {format_usd(c['p90'])}, "
            f"mean {format_usd(c['mean'])}"
        )
        ev = figures["spot_events_mean"]
        if ev:
            stdout().print(
                f"per run (mean): {ev['preemptions']:.2f} preemptions, {ev['moved_to_on_demand']:.2f} trials "
                f"moved to on-demand, {ev['stages_on_demand']:.2f} spot stages bought on-demand (no "
                f"capacity or no slack at the request), {format_duration(ev['wait_s'])} waited for capacity"
            )


def asha_figures(plan, profile, catalog, *, samples: int, seed: int) -> dict:
    """An ASHA plan replayed with the elastic ASHA simulator (its phase counts; at most ASHA_SAMPLES samples, the
    event-driven simulator's own): the figures ``rubberband simulate`` prints."""
    from rubberband.planner.asha_plan import replay_asha_plan
    from rubberband.planner.asha import ASHA_SAMPLES

    result = replay_asha_plan(plan, profile, catalog, samples=min(samples, ASHA_SAMPLES), seed=seed)
    figures = summary(result.jct, result.cost, plan.deadline_s, plan.confidence)
    figures["source"] = "the plan's own model (elastic ASHA)"
    figures["phase_instances"] = list(plan.phase_instances)
    return figures


def show_asha(plan, figures: dict, *, as_json: bool) -> None:
    """Print :func:`asha_figures` (as JSON, or as three lines)."""
    if as_json:
        typer.echo(json.dumps(figures, indent=2))
        return
    c = figures["cost_usd"]
    phases = ", ".join(str(k) for k in figures["phase_instances"])
    stdout().print(
        f"{plan.job.name}: ASHA, {figures['samples']} samples under {figures['source']}, instances by phase "
        f"{phases} × {plan.stages[0].instance_type}"
    )
    stdout().print(
        f"hit rate P(JCT ≤ {format_duration(plan.deadline_s)}) {figures['hit_rate']:.1%} "
        f"(asked {plan.confidence:.0%}); JCT p50 {format_duration(figures['jct_s']['p50'])}, "
        f"p95 {format_duration(figures['jct_s']['p95'])}"
    )
    stdout().print(
        f"cost p10 {format_usd(c['p10'])}, p50 {format_usd(c['p50'])}, p90 {format_usd(c['p90'])}, "
        f"mean {format_usd(c['mean'])}"
    )


def summary(jct: np.ndarray, cost: np.ndarray, deadline_s: float, confidence: float) -> dict:
    """The figures ``rubberband simulate`` prints."""
    q = lambda a, p: round(float(np.quantile(a, p)), 4)  # noqa: E731
    return {
        "samples": int(len(jct)),
        "deadline_s": deadline_s,
        "confidence": confidence,
        "hit_rate": float(np.mean(jct <= deadline_s)),
        "jct_s": {"p50": q(jct, 0.5), "p95": q(jct, 0.95), "mean": round(float(jct.mean()), 4)},
        "cost_usd": {
            "p10": q(cost, 0.1),
            "p50": q(cost, 0.5),
            "p90": q(cost, 0.9),
            "mean": round(float(cost.mean()), 4),
        },
    }


def trace_scenarios(plan, directory: Path, *, seed: int, samples: int) -> dict:
    """One trace replay per spot (cloud, region, type) of the plan: the traces of that cloud and type
    (of the cloud when none names the type), preemption traces for running instances, availability
    traces for requests."""
    from rubberband.planner.spot import TraceScenario
    from rubberband.spotmodel import SpotTraceError, read_traces, scenario_traces

    traces = read_traces(directory)
    out = {}
    for s in plan.stages:
        key = (s.cloud, s.region, s.instance_type)
        if not s.spot or key in out:
            continue
        pre, avail = scenario_traces(traces, s.cloud, s.instance_type, s.region, s.zone)
        if not pre and not avail:
            raise SpotTraceError(
                f"{directory} holds no trace of cloud {s.cloud} for the plan's spot stage on "
                f"{s.instance_type}; add traces of that cloud"
            )
        out[key] = TraceScenario(pre, avail, seed=seed, samples=samples)
    return out
