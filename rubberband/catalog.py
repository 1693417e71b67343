"""Instance catalogs: what each cloud offers, where, for how much, and how it bills.

Catalogs ship as dated CSV files in SkyPilot's column layout (``rubberband/catalogs``).
GCP rows with an empty ``InstanceType`` are accelerators that attach to a host; the
loader composes them into offerings such as ``n1-standard-8+V100x1`` (``a2-*`` and
``g2-*`` hosts come with their accelerator, so those keep the host's name).
The ``local`` catalog prices the local backend's Ray nodes so that local runs are
costed exactly like cloud runs.

A refreshed catalog written by ``rubberband catalog update`` lives in the user catalog
directory (``$RUBBERBAND_CATALOG_DIR`` or ``~/.rubberband/catalogs``); when it holds
``<cloud>.csv`` that file replaces the shipped one. The shipped files always work offline.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path


from rubberband import clouds
from rubberband.clouds import CLOUDS, BillingRule
from rubberband.errors import CatalogError

CATALOG_PACKAGE = "rubberband.catalogs"
CATALOG_DIR_ENV = "RUBBERBAND_CATALOG_DIR"


#: Each cloud's billing rule, moving price and provisioning: views of the facts in catalogs/clouds.yaml.
BILLING_RULES: dict[str, BillingRule] = {name: facts.billing for name, facts in CLOUDS.items()}
TRANSFER_USD_PER_GB: dict[str, float] = {name: facts.transfer_usd_per_gb for name, facts in CLOUDS.items()}
SERIAL_PROVISIONING: frozenset[str] = frozenset(name for name, facts in CLOUDS.items() if facts.serial_provisioning)


@dataclass(frozen=True)
class InstanceType:
    """One purchasable instance shape in one region.

    ``workers`` is how many data-parallel trial workers it holds: one per accelerator,
    or one per vCPU on CPU-only (local) types. ``device`` names the hardware a worker
    runs on (``V100``, ``A100``, ``CPU``) and keys the performance model.
    """

    cloud: str
    name: str
    region: str
    zones: tuple[str, ...]
    device: str
    accelerator_count: int
    vcpus: float
    memory_gib: float
    price_hr: float
    spot_price_hr: float | None
    host_type: str = ""
    accelerator_memory_gib: float | None = None
    # (zone, spot $/h) for every zone that sells this shape as spot, cheapest first.
    # ``spot_price_hr`` is the cheapest of them; zones missing here have no spot offer.
    zone_spot_prices: tuple[tuple[str, float], ...] = ()

    @property
    def workers(self) -> int:
        return self.accelerator_count if self.accelerator_count > 0 else max(1, int(self.vcpus))

    @cached_property  # read millions of times while planning
    def key(self) -> str:
        """Unique id across clouds and regions: ``aws:us-east-1:p3.2xlarge``."""
        return f"{self.cloud}:{self.region}:{self.name}"

    @property
    def spot_zones(self) -> tuple[str, ...]:
        """Zones that sell this shape as spot, cheapest first (try them in this order)."""
        return tuple(zone for zone, _ in self.zone_spot_prices)

    def zones_to_try(self, spot: bool = False) -> tuple[str, ...]:
        """The zones a request for this type tries, in order — the one source of the order both the executor's
        failover (:meth:`rubberband.cloud.failover.FailoverPolicy.candidates`) and the planner's spot pricing
        (:mod:`rubberband.planner.spotzones`) follow. On-demand: every zone, as the catalog lists them. Spot: the
        zones with a spot offer, cheapest first (ties by name); a type with a spot price but no per-zone offers
        (a hand-made catalog) tries every zone."""
        return self.spot_zones if spot and self.zone_spot_prices else self.zones

    def zone_price(self, zone: str | None, spot: bool = False) -> float:
        """$/h in ``zone``: its own spot offer where it has one, else the type's price (:meth:`price`)."""
        if spot:
            for z, p in self.zone_spot_prices:
                if z == zone:
                    return p
        return self.price(spot)

    def price(self, spot: bool = False) -> float:
        if spot:
            if self.spot_price_hr is None:
                raise CatalogError(f"{self.name} in {self.region} has no spot price; set resources.spot: false")
            return self.spot_price_hr
        return self.price_hr

    def price_per_worker(self, spot: bool = False) -> float:
        """$/hour for one trial worker (one accelerator, or one vCPU on CPU-only types)."""
        return self.price(spot) / self.workers


@dataclass(frozen=True)
class Catalog:
    """The offerings of one or more clouds, with the date their prices were read."""

    types: tuple[InstanceType, ...]
    dates: dict[str, str] = field(default_factory=dict)
    # Which file each cloud's rows came from (a path, or ``shipped:<cloud>.csv``).
    sources: dict[str, str] = field(default_factory=dict)

    def clouds(self) -> list[str]:
        return sorted({t.cloud for t in self.types})

    def find(self, name: str, *, cloud: str | None = None, region: str | None = None) -> InstanceType:
        matches = [
            t
            for t in self.types
            if t.name == name and (cloud is None or t.cloud == cloud) and (region is None or t.region == region)
        ]
        if not matches:
            known = ", ".join(sorted({t.name for t in self.types if cloud is None or t.cloud == cloud})[:12])
            raise CatalogError(
                f"instance type {name!r} is not in the catalog"
                f"{' for ' + cloud if cloud else ''}{' in ' + region if region else ''}; "
                f"known types include: {known}"
            )
        return matches[0]

    def by_key(self, key: str) -> InstanceType:
        for t in self.types:
            if t.key == key:
                return t
        raise CatalogError(f"instance type {key!r} is not in the catalog")

    def filter(self, *, clouds=None, regions=None, names=None, spot: bool = False) -> "Catalog":
        """Offerings allowed by a spec's resource section; CatalogError names anything unknown."""
        types = list(self.types)
        if clouds is not None:
            unknown = sorted(set(clouds) - set(self.clouds()))
            if unknown:
                raise CatalogError(f"cloud {unknown[0]!r} has no catalog; use one of {', '.join(self.clouds())}")
            types = [t for t in types if t.cloud in clouds]
        if regions is not None:
            known = {t.region for t in types}
            unknown = sorted(set(regions) - known)
            if unknown:
                raise CatalogError(
                    f"region {unknown[0]!r} is not in the catalog for the allowed clouds; "
                    f"use one of {', '.join(sorted(known))}"
                )
            types = [t for t in types if t.region in regions]
        if names is not None:
            known = {t.name for t in types}
            unknown = [n for n in names if n not in known]
            if unknown:
                raise CatalogError(
                    f"resources.instance_types: {unknown[0]!r} is not offered by the allowed "
                    f"clouds/regions; see `rubberband catalog show`"
                )
            types = [t for t in types if t.name in names]
        if spot:
            types = [t for t in types if t.spot_price_hr is not None]
        kept = {t.cloud for t in types}
        return Catalog(
            types=tuple(types),
            dates={c: d for c, d in self.dates.items() if c in kept},
            sources={c: s for c, s in self.sources.items() if c in kept},
        )


# -- loading ---------------------------------------------------------------------------------

_DATE_RE = re.compile(r"^#\s*date:\s*(\d{4}-\d{2}-\d{2})", re.I)
_AWS_COLUMNS = [
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "GpuInfo",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
]
_GCP_COLUMNS = [
    "InstanceType",
    "vCPUs",
    "MemoryGiB",
    "AcceleratorName",
    "AcceleratorCount",
    "GpuInfo",
    "Region",
    "AvailabilityZone",
    "Price",
    "SpotPrice",
]
# GPUs that attach to N1 hosts, by count: the largest host GCP allows, as (max vCPUs, max memory GiB).
# Source: cloud.google.com/compute/docs/gpus (N1 with attached GPUs; SkyPilot's gcp_catalog.py has the
# same table). 4x P100 keeps the smaller limit of us-east1-c / europe-west1-b,d. A count missing here
# cannot be attached (e.g. 8 T4s). A100, L4 and H100 come only bundled with a2/g2/a3 hosts.
N1_GPU_LIMITS: dict[str, dict[int, tuple[int, float]]] = {
    "V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "P100": {1: (16, 104), 2: (32, 208), 4: (64, 208)},
    "P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
}
_GPU_MEMORY = {
    "V100": 16,
    "V100-32GB": 32,
    "T4": 16,
    "A10G": 24,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "L4": 24,
    "P100": 16,
    "P4": 8,
    "CPU": None,
}


def _float(value: str, *, path: Path, line: int, column: str, minimum: float | None = None) -> float | None:
    value = (value or "").strip()
    if value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise CatalogError(f"{path}:{line}: column {column} has {value!r}; expected a number") from None
    if not math.isfinite(number):
        raise CatalogError(f"{path}:{line}: column {column} has {value!r}; expected a finite number")
    if minimum is not None and number < minimum:
        raise CatalogError(f"{path}:{line}: column {column} has {value!r}; expected a number ≥ {minimum:g}")
    return number


def _count(value: str, *, path: Path, line: int, column: str) -> int:
    """A whole number ≥ 0 (empty: 0)."""
    number = _float(value, path=path, line=line, column=column, minimum=0) or 0.0
    if number != int(number):
        raise CatalogError(f"{path}:{line}: column {column} has {value!r}; expected a whole number")
    return int(number)


def _read_rows(path: Path, text: str, columns: list[str]) -> tuple[str, list[tuple[int, dict]]]:
    lines = text.splitlines()
    date = ""
    body: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        match = _DATE_RE.match(line)
        if match:
            date = match.group(1)
        elif line.strip() and not line.lstrip().startswith("#"):
            body.append((number, line))
    if not date:
        raise CatalogError(f"{path}: catalog has no '# date: YYYY-MM-DD' line; date every catalog file")
    if not body:
        raise CatalogError(f"{path}: catalog has no rows")
    reader = csv.DictReader([line for _, line in body])
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{path}: catalog header lacks column {missing[0]}; expected {','.join(columns)}")
    rows = [(body[i + 1][0], row) for i, row in enumerate(reader)]
    return date, rows


def _zone_spots(pairs: list[tuple[str, float | None]]) -> tuple[tuple[str, float], ...]:
    """(zone, spot) pairs with a spot price, cheapest first, ties by zone name."""
    return tuple(sorted(((z, p) for z, p in pairs if p is not None), key=lambda zp: (zp[1], zp[0])))


def _rows(cloud: str, path: Path, text: str) -> tuple[str, list[InstanceType]]:
    """The ``rows`` layout (AWS, local): one row per (type, region, zone); on-demand is regional, spot is per zone."""
    date, rows = _read_rows(path, text, _AWS_COLUMNS)
    grouped: dict[tuple[str, str], dict] = {}
    for line, row in rows:
        name, region = row["InstanceType"].strip(), row["Region"].strip()
        if not name or not region:
            raise CatalogError(f"{path}:{line}: InstanceType and Region must not be empty")
        price = _float(row["Price"], path=path, line=line, column="Price")
        if price is None or price <= 0:
            raise CatalogError(f"{path}:{line}: Price must be a positive $/hour figure")
        spot = _float(row["SpotPrice"], path=path, line=line, column="SpotPrice")
        if spot is not None and spot <= 0:
            raise CatalogError(f"{path}:{line}: SpotPrice must be a positive $/hour figure or empty")
        for column in ("vCPUs", "MemoryGiB"):  # every row is checked, not only the one its type is read from
            _float(row[column], path=path, line=line, column=column, minimum=0)
        _count(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount")
        entry = grouped.setdefault((name, region), {"row": row, "line": line, "zones": [], "prices": []})
        zone = row["AvailabilityZone"].strip()
        if zone and zone not in [z for z, _ in entry["zones"]]:
            entry["zones"].append((zone, spot))
        entry["prices"].append(price)
    types = []
    for (name, region), entry in grouped.items():
        row, line = entry["row"], entry["line"]
        accel = (row["AcceleratorName"] or "").strip()
        count = _count(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount")
        device = accel if accel and count > 0 else "CPU"
        zone_spots = _zone_spots(entry["zones"])
        types.append(
            InstanceType(
                cloud=cloud,
                name=name,
                region=region,
                zones=tuple(z for z, _ in entry["zones"]),
                device=device,
                accelerator_count=count if device != "CPU" else 0,
                vcpus=_float(row["vCPUs"], path=path, line=line, column="vCPUs", minimum=0) or 0.0,
                memory_gib=_float(row["MemoryGiB"], path=path, line=line, column="MemoryGiB", minimum=0) or 0.0,
                # On-demand is one regional price; should zones disagree, plan with the dearest.
                price_hr=max(entry["prices"]),
                spot_price_hr=zone_spots[0][1] if zone_spots else None,
                host_type=name,
                accelerator_memory_gib=_GPU_MEMORY.get(device),
                zone_spot_prices=zone_spots,
            )
        )
    return date, types


def n1_accepts(accelerator: str, count: int, vcpus: float, memory_gib: float) -> bool:
    """Whether GCP lets ``count`` x ``accelerator`` attach to an N1 host of this size."""
    limit = N1_GPU_LIMITS.get(accelerator, {}).get(count)
    return limit is not None and vcpus <= limit[0] and memory_gib <= limit[1]


@dataclass(frozen=True)
class _Host:
    """A host row of the ``hosts_and_gpus`` layout (a machine type in a region, without its GPUs): where it is sold, what it costs and has."""

    cloud: str
    name: str
    region: str
    zones: tuple[str, ...]
    price: float
    spot: float | None
    vcpus: float
    memory_gib: float


def _compose(host: _Host, gpu: dict, accel: str, count: int, name: str) -> InstanceType | None:
    """A host plus its GPU row, offered as ``name``: prices add, zones intersect; None when no zone sells both."""
    zones = tuple(z for z in host.zones if z in gpu["zones"])
    if not zones:
        return None
    # Rounded to the catalogs' own precision so sums print as 0.89, not 0.8899999999999999.
    spot = None if host.spot is None or gpu["spot"] is None else round(host.spot + gpu["spot"], 6)
    return InstanceType(
        host.cloud,
        name,
        host.region,
        zones,
        accel,
        count,
        host.vcpus,
        host.memory_gib,
        round(host.price + gpu["price"], 6),
        spot,
        host_type=host.name,
        accelerator_memory_gib=_GPU_MEMORY.get(accel),
        zone_spot_prices=() if spot is None else tuple((z, spot) for z in zones),
    )


def _hosts_and_gpus(cloud: str, path: Path, text: str) -> tuple[str, list[InstanceType]]:
    """The ``hosts_and_gpus`` layout (GCP): host rows and GPU rows (empty InstanceType) priced apart; offerings add
    them up."""
    date, rows = _read_rows(path, text, _GCP_COLUMNS)
    hosts: dict[tuple[str, str], dict] = {}
    gpus: dict[tuple[str, int, str], dict] = {}
    for line, row in rows:
        region = row["Region"].strip()
        zone = row["AvailabilityZone"].strip()
        price = _float(row["Price"], path=path, line=line, column="Price")
        spot = _float(row["SpotPrice"], path=path, line=line, column="SpotPrice")
        if price is None or price <= 0:
            raise CatalogError(f"{path}:{line}: Price must be a positive $/hour figure")
        if spot is not None and spot <= 0:
            raise CatalogError(f"{path}:{line}: SpotPrice must be a positive $/hour figure or empty")
        name = row["InstanceType"].strip()
        if name:
            entry = hosts.setdefault(
                (name, region), {"row": row, "line": line, "zones": [], "price": price, "spot": spot}
            )
        else:
            accel = row["AcceleratorName"].strip()
            count = _count(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount")
            if not accel or count <= 0:
                raise CatalogError(f"{path}:{line}: a row without InstanceType must name an accelerator and count")
            entry = gpus.setdefault((accel, count, region), {"zones": [], "price": price, "spot": spot})
        if zone not in entry["zones"]:  # upstream files sometimes repeat a zone
            entry["zones"].append(zone)
    types: list[InstanceType] = []
    for (name, region), entry in hosts.items():
        row, line = entry["row"], entry["line"]
        vcpus = _float(row["vCPUs"], path=path, line=line, column="vCPUs", minimum=0) or 0.0
        memory = _float(row["MemoryGiB"], path=path, line=line, column="MemoryGiB", minimum=0) or 0.0
        host = _Host(cloud, name, region, tuple(entry["zones"]), entry["price"], entry["spot"], vcpus, memory)
        bundled = (row["AcceleratorName"] or "").strip()
        if bundled:  # a2-*/g2-*: the host comes with its accelerators, priced by a GPU row
            count = _count(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount")
            gpu = gpus.get((bundled, count, region))
            if gpu is None:
                raise CatalogError(f"{path}:{line}: {name} needs a price row for {count}x {bundled} in {region}")
            offering = _compose(host, gpu, bundled, count, name)
            if offering is None:
                raise CatalogError(f"{path}:{line}: {name} and its {count}x {bundled} row share no zone in {region}")
            types.append(offering)
        elif name.startswith("n1-"):
            for (accel, count, gpu_region), gpu in sorted(gpus.items()):
                if gpu_region != region or not n1_accepts(accel, count, vcpus, memory):
                    continue
                offering = _compose(host, gpu, accel, count, f"{name}+{accel}x{count}")
                if offering is not None:
                    types.append(offering)
        else:  # a CPU-only host (e.g. n2-*): offered as it is
            spots = _zone_spots([(z, host.spot) for z in host.zones])
            types.append(
                InstanceType(
                    cloud,
                    name,
                    region,
                    host.zones,
                    "CPU",
                    0,
                    vcpus,
                    memory,
                    host.price,
                    host.spot,
                    host_type=name,
                    zone_spot_prices=spots,
                )
            )
    return date, types


def parse_catalog(cloud: str, text: str, *, path: Path | str = "<catalog>") -> Catalog:
    """Parse one cloud's catalog CSV text."""
    path = Path(path)
    if cloud not in CLOUDS:
        raise CatalogError(f"unknown cloud {cloud!r}; use {_known()}")
    if CLOUDS[cloud].catalog_layout == "hosts_and_gpus":
        date, types = _hosts_and_gpus(cloud, path, text)
    else:
        date, types = _rows(cloud, path, text)
    types.sort(key=lambda t: (t.region, t.price_hr, t.name))
    return Catalog(types=tuple(types), dates={cloud: date})


def _known() -> str:
    return ", ".join(sorted(CLOUDS))


def head_type(cloud: str) -> InstanceType | None:
    """The run's head instance on ``cloud`` (its region left open: the run picks it), or None where the cloud runs
    no head instance (the local backend's head is this machine's Ray)."""
    shape = clouds.cloud(cloud).head
    if shape is None:
        return None
    return InstanceType(
        cloud, shape.name, "", (), "CPU", 0, shape.vcpus, shape.memory_gib, shape.price_hr, None, host_type=shape.name
    )


def head_types() -> dict[str, InstanceType]:
    """Each cloud's head shape (clouds that run a head instance only)."""
    return {name: head for name in CLOUDS if (head := head_type(name)) is not None}


def user_catalog_dir(environ: dict[str, str] | None = None) -> Path:
    """Where refreshed catalogs live: ``$RUBBERBAND_CATALOG_DIR``, else ``~/.rubberband/catalogs``."""
    environ = os.environ if environ is None else environ
    override = environ.get(CATALOG_DIR_ENV, "").strip()
    return Path(override).expanduser() if override else Path.home() / ".rubberband" / "catalogs"


def shipped_catalog_text(cloud: str) -> str:
    """The CSV text rubberband ships for ``cloud`` (always present, works offline)."""
    if cloud not in CLOUDS:
        raise CatalogError(f"unknown cloud {cloud!r}; use {_known()}")
    return resources.files(CATALOG_PACKAGE).joinpath(f"{cloud}.csv").read_text()


def load_catalog(
    clouds: list[str] | None = None, *, directory: Path | str | None = None, user_dir: Path | str | None = None
) -> Catalog:
    """Load each cloud's catalog.

    With ``directory`` every cloud must have ``<directory>/<cloud>.csv``. Otherwise a refreshed
    ``<cloud>.csv`` in the user catalog directory (``user_dir``, default :func:`user_catalog_dir`)
    wins, and the shipped file is used for clouds it lacks.
    """
    clouds = clouds or list(CLOUDS)
    types: list[InstanceType] = []
    dates: dict[str, str] = {}
    sources: dict[str, str] = {}
    user = Path(user_dir) if user_dir is not None else user_catalog_dir()
    for cloud in clouds:
        if cloud not in CLOUDS:
            raise CatalogError(f"unknown cloud {cloud!r}; use {_known()}")
        if directory is not None:
            path = Path(directory) / f"{cloud}.csv"
            if not path.exists():
                raise CatalogError(f"catalog {path} does not exist; expected one CSV per cloud named <cloud>.csv")
            text, source = path.read_text(), str(path)
        elif (user / f"{cloud}.csv").is_file():
            path = user / f"{cloud}.csv"
            text, source = path.read_text(), str(path)
        else:
            path = Path(str(resources.files(CATALOG_PACKAGE).joinpath(f"{cloud}.csv")))
            text, source = shipped_catalog_text(cloud), f"shipped:{cloud}.csv"
        catalog = parse_catalog(cloud, text, path=path)
        types.extend(catalog.types)
        dates.update(catalog.dates)
        sources[cloud] = source
    return Catalog(types=tuple(types), dates=dates, sources=sources)
