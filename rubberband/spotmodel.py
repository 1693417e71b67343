"""Spot preemption/availability model files and trace directories (the I/O side of planner/spot.py).

A *trace* is a JSON file in the format of the NSDI'24 paper "Can't Be Late: Optimizing Spot
Instance Savings under Deadlines" (Wu, Chiang, Mao, Yang, Friedman, Shenker, Stoica; public
repository ``skypilot-org/spot-traces``): ``{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}``,
one file per (cloud, zone, instance kind), 0 = spot available / running, 1 = none / preempted.
Where a file is says what it is, as in that repository: a path component ``availability`` or
``preemption``, a folder named ``<cloud>-<date>`` and a file named ``<zone>_<kind>_<n>.json``;
``metadata`` may instead name ``cloud``, ``zone``, ``instance_type`` and ``kind`` itself.

A *spot model file* (schema v1, :class:`SpotModelFile`) is what ``rubberband spot fit`` writes: per
(cloud, instance type, zone) the fitted figures of :class:`rubberband.planner.spot.ZoneModel`. The
shipped default (``rubberband/catalogs/spot_model.json``) is fitted from the traces published with
that paper.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rubberband.clouds import CLOUDS
from rubberband.clouds import cloud as cloud_descriptor
from rubberband.errors import InputError
from rubberband.planner.spot import (
    DURATION_LEVELS,
    SpotMarketModel,
    Trace,
    TraceStats,
    ZoneModel,
    ZoneTraces,
    fit_zone,
    p_none_of,
    trace_stats,
)
from rubberband.versioned import DocumentSchema, read_json, validate_versioned
from rubberband.files import write_text_atomic

SPOT_MODEL_SCHEMA_VERSION = 1
PAPER = (
    "Wu, Chiang, Mao, Yang, Friedman, Shenker, Stoica: Can't Be Late: Optimizing Spot Instance Savings "
    "under Deadlines, NSDI'24"
)


class SpotTraceError(InputError):
    """A spot trace file or directory (or a spot model file) is missing or malformed."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ZoneFit(_Model):
    """One (cloud, instance type, zone): what a plan's spot stage there is sampled from."""

    cloud: str
    instance_type: str
    region: str
    zone: str
    preemption_rate_per_h: float = Field(ge=0, description="preemptions per hour a spot instance runs")
    p_unavailable: float = Field(ge=0, le=1, description="probability that a spot request finds no capacity")
    unavailable_s: list[float] = Field(
        min_length=len(DURATION_LEVELS),
        max_length=len(DURATION_LEVELS),
        description="quantiles 0, 5 %, …, 100 % of how long unavailability lasts",
    )
    running_hours: float = Field(default=0.0, ge=0, description="hours of running spot the rate is fitted on")
    preemptions: int = Field(default=0, ge=0)
    observed_hours: float = Field(default=0.0, ge=0, description="hours of traces p_unavailable is fitted on")
    unavailable_runs: int = Field(default=0, ge=0)
    rate_source: str = ""
    p_none_of: list[float] = Field(
        default_factory=list,
        description="a region's entry: P(none of j of its zones, picked at random, has capacity), j = 1, 2, …",
    )
    traces: list[str] = Field(default_factory=list, description="the trace files fitted (relative paths)")

    def zone_model(self) -> ZoneModel:
        return ZoneModel(
            cloud=self.cloud,
            instance_type=self.instance_type,
            region=self.region,
            zone=self.zone,
            preemption_rate_per_h=self.preemption_rate_per_h,
            p_unavailable=self.p_unavailable,
            unavailable_s=tuple(self.unavailable_s),
            running_hours=self.running_hours,
            preemptions=self.preemptions,
            observed_hours=self.observed_hours,
            unavailable_runs=self.unavailable_runs,
            rate_source=self.rate_source,
            p_none_of=tuple(self.p_none_of),
        )

    @classmethod
    def of(cls, z: ZoneModel, traces: list[str] | None = None) -> "ZoneFit":
        return cls(
            cloud=z.cloud,
            instance_type=z.instance_type,
            region=z.region,
            zone=z.zone,
            preemption_rate_per_h=round(z.preemption_rate_per_h, 6),
            p_unavailable=round(z.p_unavailable, 6),
            unavailable_s=[round(x, 3) for x in z.unavailable_s],
            running_hours=round(z.running_hours, 4),
            preemptions=z.preemptions,
            observed_hours=round(z.observed_hours, 4),
            unavailable_runs=z.unavailable_runs,
            rate_source=z.rate_source,
            p_none_of=[round(q, 6) for q in z.p_none_of],
            traces=traces or [],
        )


class SpotModelFile(_Model):
    schema_version: Literal[1] = SPOT_MODEL_SCHEMA_VERSION
    source: str = Field(description="where the traces come from")
    paper: str = PAPER
    zones: list[ZoneFit] = Field(min_length=1)

    def market_model(self) -> SpotMarketModel:
        return SpotMarketModel(tuple(z.zone_model() for z in self.zones))


# -- traces ---------------------------------------------------------------------------------------


class TraceFile(_Model):
    """One trace file as read (its kind and what it covers, from its path or metadata)."""

    path: str
    kind: Literal["availability", "preemption"]
    cloud: str
    zone: str
    region: str
    instance_type: str
    gap_s: float
    data: list[int]

    def trace(self) -> Trace:
        return Trace(tuple(self.data), self.gap_s, self.path)

    def stats(self) -> TraceStats:
        return trace_stats(self.data, self.gap_s)


def read_trace(path: Path, root: Path | None = None) -> TraceFile:
    """One trace file (named in the model relative to ``root``, the folder given), or SpotTraceError naming the
    file, the field and the fix."""
    fix = 'a trace is {"metadata": {"gap_seconds": N}, "data": [0, 1, ...]} (docs/spot.md)'
    data = read_json(
        path, kind="spot trace", error=SpotTraceError, missing="pass a directory of trace files", remedy=fix
    )
    if not isinstance(data, dict):
        raise SpotTraceError(f"{path}: a spot trace must be a JSON object; {fix}")
    meta = data.get("metadata")
    if not isinstance(meta, dict):
        raise SpotTraceError(f"{path}: spot trace field 'metadata': required object is missing; {fix}")
    gap = meta.get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise SpotTraceError(
            f"{path}: spot trace field 'metadata.gap_seconds': must be a positive number of seconds, got {gap!r}; {fix}"
        )
    ticks = data.get("data")
    if not isinstance(ticks, list) or not ticks:
        raise SpotTraceError(f"{path}: spot trace field 'data': must be a non-empty list of 0/1 ticks; {fix}")
    for i, x in enumerate(ticks):
        if isinstance(x, bool) or x not in (0, 1):
            raise SpotTraceError(
                f"{path}: spot trace field 'data.{i}': must be 0 (available) or 1 (not), got {x!r}; {fix}"
            )
    # the folders of the file's whole path, nearest first: `.../availability/1-node/aws-02-15-2023/<file>` passed
    # as its last folder still says availability and aws
    parts = [p.lower() for p in reversed(path.resolve().parent.parts)]
    kind = meta.get("kind") or next((p for p in parts if p in ("availability", "preemption")), None)
    if kind not in ("availability", "preemption"):
        raise SpotTraceError(
            f"{path}: cannot tell whether this is an availability or a preemption trace; put it "
            f"under a folder named 'availability' or 'preemption', or set metadata.kind"
        )
    cloud = meta.get("cloud") or next((p.split("-", 1)[0] for p in parts if p.split("-", 1)[0] in CLOUDS), None)
    if cloud not in CLOUDS:
        raise SpotTraceError(
            f"{path}: cannot tell the cloud; put it under a folder named like 'aws-02-15-2023' "
            f"or set metadata.cloud (one of {', '.join(CLOUDS)})"
        )
    stem = path.stem.split("_")
    zone = meta.get("zone") or stem[0]
    label = meta.get("instance_type") or (
        cloud_descriptor(cloud).spot_trace_kinds.get(stem[1].lower(), stem[1]) if len(stem) > 1 else None
    )
    if not label:
        raise SpotTraceError(
            f"{path}: cannot tell the instance type; name the file <zone>_<kind>_<n>.json or set metadata.instance_type"
        )
    return TraceFile(
        path=str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else str(path),
        kind=kind,
        cloud=cloud,
        zone=zone,
        region=meta.get("region") or cloud_descriptor(cloud).region_of(zone),
        instance_type=label,
        gap_s=float(gap),
        data=[int(x) for x in ticks],
    )


def read_traces(directory: Path) -> list[TraceFile]:
    """Every ``*.json`` trace under ``directory`` (recursively), or SpotTraceError."""
    directory = Path(directory)
    if not directory.exists():
        raise SpotTraceError(
            f"spot trace directory {directory} does not exist; give the directory that holds the trace JSON files "
            f"(docs/spot.md)"
        )
    if not directory.is_dir():
        raise SpotTraceError(f"{directory} is not a directory; give the directory that holds the trace JSON files")
    files = sorted(directory.rglob("*.json"))
    if not files:
        raise SpotTraceError(f"{directory} holds no *.json trace files; see docs/spot.md for the format")
    return [read_trace(f, directory) for f in files]


ANY_ZONE = "*"


def any_zone(region: str) -> str:
    """The zone name of "any zone of ``region``": a spot request that falls over to the region's other
    zones on a capacity error (the executor's fall-over) finds none only when every zone has none."""
    return f"{region}{ANY_ZONE}"


def combined_availability(traces: list[TraceFile]) -> TraceFile | None:
    """One availability trace that is available when any of ``traces`` is (zones of one region, time-aligned:
    same gap and length), or None when they cannot be aligned or there are fewer than two."""
    avail = [t for t in traces if t.kind == "availability"]
    if len(avail) < 2 or len({(t.gap_s, len(t.data)) for t in avail}) != 1:
        return None
    data = [min(col) for col in zip(*(t.data for t in avail))]
    first = avail[0]
    return TraceFile(
        path="+".join(sorted(t.path for t in avail)),
        kind="availability",
        cloud=first.cloud,
        zone=any_zone(first.region),
        region=first.region,
        instance_type=first.instance_type,
        gap_s=first.gap_s,
        data=data,
    )


def scenario_traces(
    traces: list[TraceFile], cloud: str, instance_type: str, region: str, zone: str | None
) -> tuple[list[Trace], list[Trace]]:
    """(preemption, availability) traces to replay a spot stage in ``zone`` (``region*``: any zone of the
    region): the zone's own where there are any, else the region's, else the cloud and type's, else the cloud's."""

    def pick(kind: str) -> list[TraceFile]:
        pools = [
            [t for t in traces if t.cloud == cloud and t.instance_type == instance_type and t.zone == zone],
            [t for t in traces if t.cloud == cloud and t.instance_type == instance_type and t.region == region],
            [t for t in traces if t.cloud == cloud and t.instance_type == instance_type],
            [t for t in traces if t.cloud == cloud],
        ]
        for pool in pools:
            mine = [t for t in pool if t.kind == kind]
            if mine:
                return mine
        return []

    pre = pick("preemption")
    avail = pick("availability")
    if zone is not None and zone.endswith(ANY_ZONE):
        regional = [t for t in traces if (t.cloud, t.instance_type, t.region) == (cloud, instance_type, region)]
        combined = combined_availability(regional)
        if combined is not None:
            avail = [combined]
    return [t.trace() for t in pre], [t.trace() for t in avail]


def fit_traces(traces: list[TraceFile], *, source: str) -> SpotModelFile:
    """Fit every (cloud, type, zone) the traces cover, and per region with several time-aligned zones an
    "any zone" entry (:func:`any_zone`) with the chance that none of ``j`` of its zones has capacity
    (``p_none_of``, from which the planner weighs the zones a spot request tries; pure apart from the traces
    already read)."""
    keys = sorted({(t.cloud, t.instance_type, t.region, t.zone) for t in traces})
    pooled: dict[tuple[str, str], tuple[int, float, float]] = {}
    for t in traces:
        if t.kind == "preemption":
            st = t.stats()
            n, h, g = pooled.get((t.cloud, t.instance_type), (0, 0.0, math.inf))
            pooled[(t.cloud, t.instance_type)] = (n + st.preemptions, h + st.running_hours, min(g, st.gap_s))
    zones = []
    for cloud, itype, region, zone in keys:
        mine = [t for t in traces if (t.cloud, t.instance_type, t.zone) == (cloud, itype, zone)]
        own = ZoneTraces(
            preemption=[t.stats() for t in mine if t.kind == "preemption"],
            availability=[t.stats() for t in mine if t.kind == "availability"],
            pooled=pooled.get((cloud, itype)),
        )
        fit = fit_zone(cloud, itype, region, zone, own)
        zones.append(ZoneFit.of(fit, sorted(t.path for t in mine)))
    for cloud, itype, region in sorted({(t.cloud, t.instance_type, t.region) for t in traces}):
        regional = [t for t in traces if (t.cloud, t.instance_type, t.region) == (cloud, itype, region)]
        combined = combined_availability(regional)
        if combined is None:
            continue
        pre = [t.stats() for t in regional if t.kind == "preemption"]
        regional_traces = ZoneTraces(preemption=pre, availability=[combined.stats()], pooled=pooled.get((cloud, itype)))
        fit = fit_zone(cloud, itype, region, any_zone(region), regional_traces)
        aligned = [t.data for t in regional if t.kind == "availability"]
        fit = replace(fit, p_none_of=p_none_of(aligned))
        if pre:
            fit = replace(fit, rate_source="preemption traces of the region's zones")
        zones.append(ZoneFit.of(fit, sorted(t.path for t in regional)))
    return SpotModelFile(source=source, zones=zones)


# -- model files ----------------------------------------------------------------------------------


def default_model_path() -> Path:
    return Path(str(resources.files("rubberband.catalogs").joinpath("spot_model.json")))


def parse_spot_model(data: Any, *, source: str) -> SpotModelFile:
    schema = DocumentSchema(
        SpotModelFile,
        kind="spot model",
        version=SPOT_MODEL_SCHEMA_VERSION,
        error=SpotTraceError,
        remedy="fit it again with `rubberband spot fit --traces DIR`",
    )
    return validate_versioned(schema, data, source=source)


def load_spot_model(path: str | Path | None = None) -> SpotModelFile:
    """A spot model file (None: the shipped default)."""
    path = Path(path) if path is not None else default_model_path()
    data = read_json(
        path,
        kind="spot model",
        error=SpotTraceError,
        missing="fit one with `rubberband spot fit --traces DIR --out FILE`",
        remedy="fit it again with `rubberband spot fit --traces DIR`",
    )
    return parse_spot_model(data, source=str(path))


def write_spot_model(model: SpotModelFile, path: str | Path) -> None:
    """Write atomically (nothing half-written)."""
    write_text_atomic(path, json.dumps(model.model_dump(mode="json"), indent=1) + "\n", make_parents=True)
