"""The instance types a job may plan on: the catalog's offerings its spec allows, and one of each on-demand shape
sold in several regions. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from rubberband.catalog import Catalog, InstanceType
from rubberband.spec import JobSpec


def allowed_types(
    catalog: Catalog, spec: JobSpec, cloud: str | None = None, *, spot_required: bool | None = None
) -> list[InstanceType]:
    """Offerings allowed by the spec's resources, narrowed to ``cloud`` (``any`` or None: the spec's).

    ``spot_required`` (default: ``resources.spot``) keeps only types sold on spot: the old all-spot
    pricing; with a spot model, spot is per stage and on-demand-only types stay allowed."""
    res = spec.resources
    clouds: list[str]
    if cloud in (None, ""):
        clouds = list(res.clouds)
    elif cloud == "any":
        clouds = catalog.clouds()
    else:
        clouds = [cloud]
    spot = res.spot if spot_required is None else spot_required
    filtered = catalog.filter(clouds=clouds, regions=res.regions, names=res.instance_types, spot=spot)
    return list(filtered.types)


def region_twins_merged(types: Sequence[InstanceType]) -> list[InstanceType]:
    """``types`` with each on-demand shape once: of types alike in all but their region and spot offers (the same
    cloud, name, device, size and on-demand price), the first. An on-demand plan cannot tell them apart (start-ups
    are modelled per cloud and name, heads per cloud), and its instances do not carry over between regions, so
    searching both only doubles the neighbourhoods: Hyperband R=243 on the quickstart's types (each sold in
    us-east-1 and us-west-2) searched in 1.4 s with both, 1.1 s with one, for the same plan. Spot plans keep every
    region: there the region's spot market is what is planned."""
    kept: dict[InstanceType, InstanceType] = {}
    for t in types:
        kept.setdefault(replace(t, region="", zones=(), spot_price_hr=None, zone_spot_prices=()), t)
    return list(kept.values())
