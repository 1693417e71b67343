"""``rubberband catalog``: show the instance catalog, or refresh AWS prices from AWS's APIs."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from rubberband.clouds import CLOUDS as KNOWN_CLOUDS
from rubberband.catalog import Catalog, InstanceType, load_catalog, user_catalog_dir
from rubberband.console import stdout
from rubberband.errors import CatalogError, InputError

ORDER = 50
CLOUDS = tuple(KNOWN_CLOUDS)


def _short_zones(t: InstanceType) -> str:
    """Zones without their region prefix: ``a,b,c,f`` on GCP, ``az1,az2`` for AWS zone IDs."""
    out = []
    for zone in t.zones:
        if zone.startswith(t.region + "-"):
            out.append(zone[len(t.region) + 1 :])
        elif "-" in zone:
            out.append(zone.rsplit("-", 1)[1])
        else:
            out.append(zone)
    return ",".join(out)


def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def select(
    catalog: Catalog, *, cloud: str | None, gpu: str | None, region: str | None, spot: bool
) -> list[InstanceType]:
    """The rows ``catalog show`` prints, cheapest per worker first within each cloud and region."""
    types = list(catalog.types)
    if gpu is not None:
        devices = sorted({t.device for t in types})
        match = [d for d in devices if d.lower() == gpu.lower()]
        if not match:
            raise InputError(f"--gpu {gpu!r} is not in the catalog; use one of {', '.join(devices)}")
        types = [t for t in types if t.device == match[0]]
    if region is not None:
        regions = sorted({t.region for t in types})
        if region not in regions:
            raise InputError(
                f"--region {region!r} is not in the catalog{' for ' + cloud if cloud else ''}; "
                f"use one of {', '.join(regions)}"
            )
        types = [t for t in types if t.region == region]
    if spot:
        types = [t for t in types if t.spot_price_hr is not None]
    return sorted(types, key=lambda t: (t.cloud, t.region, t.price_per_worker(spot), t.name))


def _as_dict(t: InstanceType, spot: bool) -> dict:
    return {
        "cloud": t.cloud,
        "region": t.region,
        "name": t.name,
        "host_type": t.host_type,
        "device": t.device,
        "accelerator_count": t.accelerator_count,
        "workers": t.workers,
        "vcpus": t.vcpus,
        "memory_gib": t.memory_gib,
        "price_hr": t.price_hr,
        "spot_price_hr": t.spot_price_hr,
        "price_per_worker_hr": round(t.price_per_worker(spot), 6),
        "zones": list(t.zones),
        "spot_zones": list(t.spot_zones),
    }


def register(app: typer.Typer) -> None:
    catalog_app = typer.Typer(help="Show the instance catalog, or refresh its prices.", no_args_is_help=True)
    app.add_typer(catalog_app, name="catalog")

    @catalog_app.command("show")
    def show(
        cloud: str = typer.Option(None, "--cloud", help="Only this cloud: aws, gcp or local."),
        gpu: str = typer.Option(None, "--gpu", help="Only this device, e.g. V100, A100, T4, L4, CPU."),
        region: str = typer.Option(None, "--region", help="Only this region, e.g. us-east-1."),
        spot: bool = typer.Option(False, "--spot", help="Only types sold as spot; per-worker price at spot."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout and nothing else."),
    ) -> None:
        """Print every offering with its prices, per-worker price and zones; the title dates the prices."""
        if cloud is not None and cloud not in CLOUDS:
            raise InputError(f"--cloud must be one of {', '.join(CLOUDS)} (got {cloud!r})")
        catalog = load_catalog([cloud] if cloud else None)
        types = select(catalog, cloud=cloud, gpu=gpu, region=region, spot=spot)
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "dates": catalog.dates,
                        "sources": catalog.sources,
                        "spot": spot,
                        "types": [_as_dict(t, spot) for t in types],
                    }
                )
            )
            return
        dated = ", ".join(f"{c} {catalog.dates[c]} ({catalog.sources.get(c, '?')})" for c in sorted(catalog.dates))
        table = Table(title=f"Instance catalog — prices as of {dated}", title_justify="left")
        for header, justify in (
            ("cloud", "left"),
            ("region", "left"),
            ("type", "left"),
            ("device × n", "left"),
            ("vCPUs", "right"),
            ("mem GiB", "right"),
            ("$/h on-demand", "right"),
            ("$/h spot", "right"),
            (f"$/h per worker{' (spot)' if spot else ''}", "right"),
            ("zones", "left"),
        ):
            table.add_column(header, justify=justify, no_wrap=header != "zones")
        for t in types:
            table.add_row(
                t.cloud,
                t.region,
                t.name,
                f"{t.device} × {t.workers if t.device == 'CPU' else t.accelerator_count}",
                f"{t.vcpus:g}",
                f"{t.memory_gib:g}",
                _money(t.price_hr),
                _money(t.spot_price_hr),
                _money(t.price_per_worker(spot)),
                _short_zones(t),
            )
        console = stdout()
        if not console.is_terminal:  # piped or captured: keep rows whole rather than squeeze to 80 columns
            console.width = max(console.width, 180)
        console.print(table)
        if not types:
            typer.echo("no offerings match these filters", err=True)

    @catalog_app.command("update")
    def update(
        cloud: str = typer.Argument(..., help="Which catalog to refresh (a cloud whose prices can be fetched: aws)."),
        regions: list[str] = typer.Option(
            None, "--region", help="Region to refresh (repeat); default: the shipped catalog's regions."
        ),
        types: list[str] = typer.Option(
            None, "--type", help="Instance type to refresh (repeat); default: the shipped catalog's types."
        ),
        out: str = typer.Option(
            None,
            "--out",
            help="Directory for the refreshed CLOUD.csv; default $RUBBERBAND_CATALOG_DIR or ~/.rubberband/catalogs.",
        ),
    ) -> None:
        """Refresh a cloud's prices from its own API (AWS: boto3, Price List API + spot price history) into a dated
        CSV."""
        from rubberband.cloud.registry import DESCRIPTORS

        known = DESCRIPTORS.get(cloud)
        if known is None or known.refresh_catalog is None:
            able = ", ".join(name for name, d in DESCRIPTORS.items() if d.refresh_catalog is not None)
            raise InputError(
                f"catalog update refreshes {able} (got {cloud!r}); other clouds' prices ship with rubberband"
            )
        done = known.refresh_catalog(
            regions or None, types or None, user_catalog_dir() if out is None else _out_dir(out)
        )
        for warning in done.warnings:
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(
            f"wrote {done.path}: {done.rows} rows, {done.types} instance types, regions {', '.join(done.regions)}",
            err=True,
        )


def _out_dir(out: str):
    from pathlib import Path

    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise CatalogError(f"--out {out!r} is a file; give a directory")
    return path
