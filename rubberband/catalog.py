"""Instance catalogs: what each cloud offers, where, for how much, and how it bills.

Catalogs ship as dated CSV files in SkyPilot's column layout (``rubberband/catalogs``).
GCP rows with an empty ``InstanceType`` are accelerators that attach to a host; the
loader composes them into offerings such as ``n1-standard-8+V100x1`` (``a2-*`` and
``g2-*`` hosts come with their accelerator, so those keep the host's name).
The ``local`` catalog prices the local backend's Ray nodes so that local runs are
costed exactly like cloud runs.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from rubberband.errors import CatalogError

CATALOG_PACKAGE = "rubberband.catalogs"


@dataclass(frozen=True)
class BillingRule:
    """Per-second billing with a minimum charge; a lifetime runs from request to termination."""

    granularity_s: float = 1.0
    minimum_s: float = 60.0

    def billed_seconds(self, lifetime_s: float) -> float:
        lifetime_s = max(lifetime_s, 0.0)
        billed = max(lifetime_s, self.minimum_s)
        return math.ceil(billed / self.granularity_s - 1e-9) * self.granularity_s

    def cost(self, lifetime_s: float, price_per_hour: float) -> float:
        return self.billed_seconds(lifetime_s) * price_per_hour / 3600.0


BILLING_RULES: dict[str, BillingRule] = {
    "aws": BillingRule(granularity_s=1.0, minimum_s=60.0),
    "gcp": BillingRule(granularity_s=1.0, minimum_s=60.0),
    "local": BillingRule(granularity_s=1.0, minimum_s=1.0),
}

# Price of moving checkpoints between instances, $/GB (inter-AZ transfer on AWS and GCP).
TRANSFER_USD_PER_GB: dict[str, float] = {"aws": 0.01, "gcp": 0.01, "local": 0.0}


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

    @property
    def workers(self) -> int:
        return self.accelerator_count if self.accelerator_count > 0 else max(1, int(self.vcpus))

    @property
    def key(self) -> str:
        """Unique id across clouds and regions: ``aws:us-east-1:p3.2xlarge``."""
        return f"{self.cloud}:{self.region}:{self.name}"

    def price(self, spot: bool = False) -> float:
        if spot:
            if self.spot_price_hr is None:
                raise CatalogError(f"{self.name} in {self.region} has no spot price; set resources.spot: false")
            return self.spot_price_hr
        return self.price_hr


@dataclass(frozen=True)
class Catalog:
    """The offerings of one or more clouds, with the date their prices were read."""

    types: tuple[InstanceType, ...]
    dates: dict[str, str] = field(default_factory=dict)

    def clouds(self) -> list[str]:
        return sorted({t.cloud for t in self.types})

    def find(self, name: str, *, cloud: str | None = None, region: str | None = None) -> InstanceType:
        matches = [t for t in self.types if t.name == name and (cloud is None or t.cloud == cloud)
                   and (region is None or t.region == region)]
        if not matches:
            known = ", ".join(sorted({t.name for t in self.types if cloud is None or t.cloud == cloud})[:12])
            raise CatalogError(f"instance type {name!r} is not in the catalog"
                               f"{' for ' + cloud if cloud else ''}{' in ' + region if region else ''}; "
                               f"known types include: {known}")
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
                raise CatalogError(f"region {unknown[0]!r} is not in the catalog for the allowed clouds; "
                                   f"use one of {', '.join(sorted(known))}")
            types = [t for t in types if t.region in regions]
        if names is not None:
            known = {t.name for t in types}
            unknown = [n for n in names if n not in known]
            if unknown:
                raise CatalogError(f"resources.instance_types: {unknown[0]!r} is not offered by the allowed "
                                   f"clouds/regions; see `rubberband catalog show`")
            types = [t for t in types if t.name in names]
        if spot:
            types = [t for t in types if t.spot_price_hr is not None]
        return Catalog(types=tuple(types), dates={c: d for c, d in self.dates.items()
                                                  if any(t.cloud == c for t in types)})


# -- loading ---------------------------------------------------------------------------------

_DATE_RE = re.compile(r"^#\s*date:\s*(\d{4}-\d{2}-\d{2})", re.I)
_AWS_COLUMNS = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo",
                "Price", "SpotPrice", "Region", "AvailabilityZone"]
_GCP_COLUMNS = ["InstanceType", "vCPUs", "MemoryGiB", "AcceleratorName", "AcceleratorCount", "GpuInfo",
                "Region", "AvailabilityZone", "Price", "SpotPrice"]
# Which accelerator counts may attach to which n1 hosts (GCP's documented combinations, abridged).
_N1_ATTACH = {"V100": {1: 8, 2: 16, 4: 32, 8: 64}, "T4": {1: 8, 2: 16, 4: 32}}
_GPU_MEMORY = {"V100": 16, "T4": 16, "A10G": 24, "A100": 40, "A100-80GB": 80, "H100": 80, "L4": 24, "CPU": None}


def _float(value: str, *, path: Path, line: int, column: str) -> float | None:
    value = (value or "").strip()
    if value == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise CatalogError(f"{path}:{line}: column {column} has {value!r}; expected a number") from None


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


def _aws_like(cloud: str, path: Path, text: str) -> tuple[str, list[InstanceType]]:
    date, rows = _read_rows(path, text, _AWS_COLUMNS)
    grouped: dict[tuple[str, str], dict] = {}
    for line, row in rows:
        name, region = row["InstanceType"].strip(), row["Region"].strip()
        if not name or not region:
            raise CatalogError(f"{path}:{line}: InstanceType and Region must not be empty")
        price = _float(row["Price"], path=path, line=line, column="Price")
        if price is None or price <= 0:
            raise CatalogError(f"{path}:{line}: Price must be a positive $/hour figure")
        entry = grouped.setdefault((name, region), {"row": row, "line": line, "zones": []})
        entry["zones"].append(row["AvailabilityZone"].strip())
    types = []
    for (name, region), entry in grouped.items():
        row, line = entry["row"], entry["line"]
        accel = (row["AcceleratorName"] or "").strip()
        count = int(_float(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount") or 0)
        device = accel if accel and count > 0 else "CPU"
        types.append(InstanceType(
            cloud=cloud, name=name, region=region, zones=tuple(z for z in entry["zones"] if z),
            device=device, accelerator_count=count if device != "CPU" else 0,
            vcpus=_float(row["vCPUs"], path=path, line=line, column="vCPUs") or 0.0,
            memory_gib=_float(row["MemoryGiB"], path=path, line=line, column="MemoryGiB") or 0.0,
            price_hr=_float(row["Price"], path=path, line=line, column="Price"),
            spot_price_hr=_float(row["SpotPrice"], path=path, line=line, column="SpotPrice"),
            host_type=name, accelerator_memory_gib=_GPU_MEMORY.get(device)))
    return date, types


def _gcp(path: Path, text: str) -> tuple[str, list[InstanceType]]:
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
        name = row["InstanceType"].strip()
        if name:
            entry = hosts.setdefault((name, region), {"row": row, "line": line, "zones": [], "price": price,
                                                      "spot": spot})
            entry["zones"].append(zone)
        else:
            accel = row["AcceleratorName"].strip()
            count = int(_float(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount") or 0)
            if not accel or count <= 0:
                raise CatalogError(f"{path}:{line}: a row without InstanceType must name an accelerator and count")
            entry = gpus.setdefault((accel, count, region), {"zones": [], "price": price, "spot": spot})
            entry["zones"].append(zone)
    types: list[InstanceType] = []
    for (name, region), host in hosts.items():
        row, line = host["row"], host["line"]
        vcpus = _float(row["vCPUs"], path=path, line=line, column="vCPUs") or 0.0
        memory = _float(row["MemoryGiB"], path=path, line=line, column="MemoryGiB") or 0.0
        bundled = (row["AcceleratorName"] or "").strip()
        if bundled:  # a2-*/g2-*: the host comes with its accelerators, priced separately
            count = int(_float(row["AcceleratorCount"], path=path, line=line, column="AcceleratorCount") or 0)
            gpu = gpus.get((bundled, count, region))
            if gpu is None:
                raise CatalogError(f"{path}:{line}: {name} needs a price row for {count}x {bundled} in {region}")
            zones = tuple(z for z in host["zones"] if z in gpu["zones"])
            spot = None if host["spot"] is None or gpu["spot"] is None else host["spot"] + gpu["spot"]
            types.append(InstanceType("gcp", name, region, zones, bundled, count, vcpus, memory,
                                      host["price"] + gpu["price"], spot, host_type=name,
                                      accelerator_memory_gib=_GPU_MEMORY.get(bundled)))
        elif name.startswith("n1-"):
            for (accel, count, gpu_region), gpu in gpus.items():
                max_vcpus = _N1_ATTACH.get(accel, {}).get(count)
                if gpu_region != region or max_vcpus is None or vcpus > max_vcpus:
                    continue
                zones = tuple(z for z in host["zones"] if z in gpu["zones"])
                if not zones:
                    continue
                spot = None if host["spot"] is None or gpu["spot"] is None else host["spot"] + gpu["spot"]
                types.append(InstanceType("gcp", f"{name}+{accel}x{count}", region, zones, accel, count, vcpus,
                                          memory, host["price"] + gpu["price"], spot, host_type=name,
                                          accelerator_memory_gib=_GPU_MEMORY.get(accel)))
    return date, types


def parse_catalog(cloud: str, text: str, *, path: Path | str = "<catalog>") -> Catalog:
    """Parse one cloud's catalog CSV text."""
    path = Path(path)
    if cloud == "gcp":
        date, types = _gcp(path, text)
    elif cloud in ("aws", "local"):
        date, types = _aws_like(cloud, path, text)
    else:
        raise CatalogError(f"unknown cloud {cloud!r}; use aws, gcp or local")
    types.sort(key=lambda t: (t.region, t.price_hr, t.name))
    return Catalog(types=tuple(types), dates={cloud: date})


def load_catalog(clouds: list[str] | None = None, *, directory: Path | str | None = None) -> Catalog:
    """Load the shipped catalogs (or those in ``directory``) for the given clouds."""
    clouds = clouds or ["aws", "gcp", "local"]
    types: list[InstanceType] = []
    dates: dict[str, str] = {}
    for cloud in clouds:
        if directory is not None:
            path = Path(directory) / f"{cloud}.csv"
            if not path.exists():
                raise CatalogError(f"catalog {path} does not exist; expected one CSV per cloud named <cloud>.csv")
            text = path.read_text()
        else:
            if cloud not in BILLING_RULES:
                raise CatalogError(f"unknown cloud {cloud!r}; use aws, gcp or local")
            resource = resources.files(CATALOG_PACKAGE.rsplit(".", 1)[0]).joinpath("catalogs", f"{cloud}.csv")
            path = Path(str(resource))
            text = resource.read_text()
        catalog = parse_catalog(cloud, text, path=path)
        types.extend(catalog.types)
        dates.update(catalog.dates)
    return Catalog(types=tuple(types), dates=dates)
