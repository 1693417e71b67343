"""``rubberband spot``: fit a spot preemption/availability model from traces, or show one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rubberband.console import stdout
from rubberband.units import format_duration

ORDER = 35


def register(app: typer.Typer) -> None:
    spot = typer.Typer(help="Spot preemption and availability models (fitted from traces).", no_args_is_help=True)
    app.add_typer(spot, name="spot")

    @spot.command("fit")
    def fit(
        traces: Path = typer.Option(
            ...,
            "--traces",
            help="Folder of trace JSON files (the format of the NSDI'24 "
            "'Can't Be Late' traces; docs/spot.md), searched recursively.",
        ),
        out: Path = typer.Option(..., "--out", "-o", help="Where to write the fitted spot model JSON."),
        source: str = typer.Option(None, "--source", help="Where the traces come from (recorded in the model)."),
    ) -> None:
        """Fit per (cloud, instance type, zone): preemptions per running hour, P(no capacity on request) and
        how long unavailability lasts; use it with `rubberband plan --spot-model`."""
        from rubberband.spotmodel import fit_traces, read_traces, write_spot_model

        model = fit_traces(read_traces(traces), source=source or str(traces))
        write_spot_model(model, out)
        _print(model)
        stdout().print(f"Spot model written to {out}")

    @spot.command("show")
    def show(model: Path = typer.Argument(None, help="Spot model JSON (default: the shipped one).")) -> None:
        """Print a spot model's zones."""
        from rubberband.spotmodel import load_spot_model

        _print(load_spot_model(model))


def _print(model) -> None:
    from rich.console import Console

    console = stdout()
    if not console.is_terminal and console.width < 120:  # pipes and CI logs: do not squeeze the table
        console = Console(highlight=False, soft_wrap=False, width=120)
    table = Table(title=f"Spot model ({model.source})", title_justify="left")
    for name in ("cloud", "type", "zone", "preempt/h", "hours run", "P(no capacity)", "unavail p50", "unavail p90"):
        table.add_column(name, justify="left" if name in ("cloud", "type", "zone") else "right")
    for z in model.zones:
        table.add_row(
            z.cloud,
            z.instance_type,
            z.zone,
            f"{z.preemption_rate_per_h:.2f}" + ("†" if "pooled" in z.rate_source else ""),
            f"{z.running_hours:.0f}",
            f"{z.p_unavailable:.0%}",
            format_duration(z.unavailable_s[10]),
            format_duration(z.unavailable_s[18]),
        )
    console.print(table)
    if any("pooled" in z.rate_source for z in model.zones):
        console.print("† no preemption trace for the zone: the rate is pooled over the type's other zones")
