"""Refresh the AWS catalog from AWS's own APIs (``rubberband catalog update aws``).

On-demand prices come from the Price List API (``pricing:GetProducts``, AmazonEC2, Linux,
shared tenancy, no pre-installed software); spot prices from ``ec2:DescribeSpotPriceHistory``
(the latest price per type and zone); the zones that sell each type from
``ec2:DescribeInstanceTypeOfferings`` by zone ID, so rows stay comparable across accounts.
Hardware (vCPUs, memory, GPUs) comes from ``ec2:DescribeInstanceTypes`` and falls back to the
shipped catalog's row for types the endpoint does not describe.

Credentials and endpoints follow boto3's standard chain (``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ...). Every failure becomes one :class:`CatalogError` line; nothing is
written until every answer is in, and the file is written atomically.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rubberband.catalog import Catalog, InstanceType, parse_catalog, shipped_catalog_text
from rubberband.errors import CatalogError

PRICING_REGION = "us-east-1"  # the Price List API answers from us-east-1 (and two other regions)
LINUX_SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
AWS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
)


@dataclass(frozen=True)
class Hardware:
    """What one instance type is made of."""

    vcpus: float
    memory_gib: float
    accelerator: str = ""
    accelerator_count: int = 0


@dataclass(frozen=True)
class AwsRow:
    """One catalog row: a type's prices in one zone."""

    instance_type: str
    hardware: Hardware
    price: float
    spot_price: float | None
    region: str
    zone: str

    def csv_line(self) -> str:
        hw = self.hardware
        spot = "" if self.spot_price is None else _number(self.spot_price)
        count = str(hw.accelerator_count) if hw.accelerator else ""
        return (
            f"{self.instance_type},{hw.accelerator},{count},{_number(hw.vcpus)},{_number(hw.memory_gib)},,"
            f"{_number(self.price)},{spot},{self.region},{self.zone}"
        )


def _number(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _gpu_name(name: str, memory_mib: int) -> str:
    """AWS GpuInfo names, with the large-memory variants named as the catalogs name them."""
    if name == "A100" and memory_mib >= 80 * 1024:
        return "A100-80GB"
    if name == "V100" and memory_mib >= 32 * 1024:
        return "V100-32GB"
    return name


def _client_error(exc: Exception, what: str) -> CatalogError:
    """One line naming the call that failed and AWS's error code."""
    from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError, PartialCredentialsError

    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return CatalogError(
            "no AWS credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "(boto3's standard credential chain) and retry"
        )
    if isinstance(exc, NoRegionError):
        return CatalogError("no AWS region configured; pass --region")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return CatalogError(f"AWS {what} failed: {error.get('Code', 'Error')}: {error.get('Message', '')}".strip())
    return CatalogError(f"AWS {what} failed: {type(exc).__name__}: {exc}")


def zone_names_by_id(ec2) -> dict[str, str]:
    """Zone ID -> this account's zone name (``use1-az1`` -> ``us-east-1b``) for one region's ec2 client.

    The catalog lists AWS zones by ID; RunInstances' ``Placement.AvailabilityZone`` wants a name.
    """
    return {zone_id: name for name, zone_id in AwsCatalogFetcher._zone_ids(ec2).items()}


class AwsCatalogFetcher:
    """Reads prices, zones and hardware for a set of types and regions from AWS."""

    def __init__(self, session=None, reference: Catalog | None = None) -> None:
        from botocore.config import Config

        from rubberband.cloud.aws.session import new_session

        self._session = session or new_session()
        self._config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=30)
        self._reference = reference
        self.warnings: list[str] = []

    def _client(self, service: str, region: str):
        return self._session.client(service, region_name=region, config=self._config)

    def fetch(self, regions: Iterable[str], instance_types: Iterable[str]) -> list[AwsRow]:
        from botocore.exceptions import BotoCoreError, ClientError

        regions, instance_types = list(dict.fromkeys(regions)), list(dict.fromkeys(instance_types))
        if not regions or not instance_types:
            raise CatalogError("catalog update needs at least one --region and one instance type")
        rows: list[AwsRow] = []
        step = "pricing:GetProducts"
        try:
            pricing = self._client("pricing", PRICING_REGION)
            for region in regions:
                ec2 = self._client("ec2", region)
                step = "ec2:DescribeAvailabilityZones"
                zone_ids = self._zone_ids(ec2)
                step = "ec2:DescribeInstanceTypeOfferings"
                offered = self._offerings(ec2, instance_types)
                step = "ec2:DescribeSpotPriceHistory"
                spots = self._spot_prices(ec2, instance_types, zone_ids)
                for name in instance_types:
                    step = "pricing:GetProducts"
                    price = self._on_demand_price(pricing, name, region)
                    if price is None:
                        self.warnings.append(f"{name}: no on-demand Linux price in {region}; left out")
                        continue
                    step = "ec2:DescribeInstanceTypes"
                    hardware = self._hardware(ec2, name, region)
                    if hardware is None:
                        self.warnings.append(
                            f"{name}: AWS does not describe it and the shipped catalog lacks it; left out"
                        )
                        continue
                    zones = sorted(set(offered.get(name, ())) | set(spots.get(name, {})))
                    if not zones:
                        self.warnings.append(f"{name}: not offered in any zone of {region}; left out")
                        continue
                    rows.extend(
                        AwsRow(name, hardware, price, spots.get(name, {}).get(zone), region, zone) for zone in zones
                    )
        except CatalogError:
            raise
        except (BotoCoreError, ClientError) as exc:
            raise _client_error(exc, step) from None
        if not rows:
            raise CatalogError(
                f"AWS returned no prices for {', '.join(instance_types)} in {', '.join(regions)}; nothing written"
            )
        return rows

    @staticmethod
    def _zone_ids(ec2) -> dict[str, str]:
        zones = ec2.describe_availability_zones()["AvailabilityZones"]
        return {z["ZoneName"]: z.get("ZoneId") or z["ZoneName"] for z in zones}

    @staticmethod
    def _offerings(ec2, instance_types: list[str]) -> dict[str, list[str]]:
        offered: dict[str, list[str]] = {}
        paginator = ec2.get_paginator("describe_instance_type_offerings")
        for page in paginator.paginate(
            LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": instance_types}]
        ):
            for offer in page.get("InstanceTypeOfferings", []):
                offered.setdefault(offer["InstanceType"], []).append(offer["Location"])
        return offered

    @staticmethod
    def _spot_prices(ec2, instance_types: list[str], zone_ids: dict[str, str]) -> dict[str, dict[str, float]]:
        """The latest Linux spot price per (type, zone ID)."""
        latest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
        paginator = ec2.get_paginator("describe_spot_price_history")
        now = dt.datetime.now(dt.timezone.utc)
        for page in paginator.paginate(InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"], StartTime=now):
            for entry in page.get("SpotPriceHistory", []):
                if entry.get("ProductDescription") not in LINUX_SPOT_PRODUCTS:
                    continue
                zone = zone_ids.get(entry["AvailabilityZone"], entry["AvailabilityZone"])
                key = (entry["InstanceType"], zone)
                stamp = entry["Timestamp"]  # botocore parses it into an aware datetime
                price = float(entry["SpotPrice"])
                if price > 0 and (key not in latest or stamp > latest[key][0]):
                    latest[key] = (stamp, price)
        spots: dict[str, dict[str, float]] = {}
        for (name, zone), (_, price) in latest.items():
            spots.setdefault(name, {})[zone] = price
        return spots

    def _on_demand_price(self, pricing, name: str, region: str) -> float | None:
        filters = [
            {"Type": "TERM_MATCH", "Field": field, "Value": value}
            for field, value in (
                ("instanceType", name),
                ("regionCode", region),
                ("operatingSystem", "Linux"),
                ("tenancy", "Shared"),
                ("preInstalledSw", "NA"),
                ("capacitystatus", "Used"),
            )
        ]
        prices: set[float] = set()
        for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
            for item in page.get("PriceList", []):
                product = json.loads(item) if isinstance(item, str) else item
                for term in product.get("terms", {}).get("OnDemand", {}).values():
                    for dimension in term.get("priceDimensions", {}).values():
                        usd = float(dimension.get("pricePerUnit", {}).get("USD", "0") or 0)
                        if dimension.get("unit", "Hrs").lower().startswith("hr") and usd > 0:
                            prices.add(usd)
        if len(prices) > 1:
            self.warnings.append(f"{name}: {len(prices)} on-demand prices in {region}; planning with the dearest")
        return max(prices) if prices else None

    def _hardware(self, ec2, name: str, region: str) -> Hardware | None:
        from botocore.exceptions import ClientError

        try:
            described = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceType":
                raise
            described = []
        if described:
            info = described[0]
            gpus = info.get("GpuInfo", {}).get("Gpus", [])
            accel = _gpu_name(gpus[0]["Name"], gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0)) if gpus else ""
            return Hardware(
                vcpus=float(info["VCpuInfo"]["DefaultVCpus"]),
                memory_gib=info["MemoryInfo"]["SizeInMiB"] / 1024,
                accelerator=accel,
                accelerator_count=sum(g.get("Count", 0) for g in gpus),
            )
        known = self._reference_type(name, region)
        if known is None:
            return None
        accel = known.device if known.device != "CPU" else ""
        return Hardware(known.vcpus, known.memory_gib, accel, known.accelerator_count if accel else 0)

    def _reference_type(self, name: str, region: str) -> InstanceType | None:
        if self._reference is None:
            return None
        same = [t for t in self._reference.types if t.name == name]
        return next((t for t in same if t.region == region), same[0] if same else None)


def shipped_aws_catalog() -> Catalog:
    """The AWS catalog rubberband ships (the default regions, types and hardware for a refresh)."""
    return parse_catalog("aws", shipped_catalog_text("aws"), path="shipped:aws.csv")


def render_aws_csv(rows: list[AwsRow], *, date: str, source: str) -> str:
    """The catalog file text, dated, in the loader's (SkyPilot's) column layout."""
    out = io.StringIO()
    out.write(f"# date: {date}\n# source: {source}\n")
    out.write("# AvailabilityZone holds zone IDs; an empty SpotPrice means no spot offer in that zone.\n")
    out.write(AWS_HEADER + "\n")
    for row in sorted(rows, key=lambda r: (r.instance_type, r.region, r.zone)):
        out.write(row.csv_line() + "\n")
    text = out.getvalue()
    parse_catalog("aws", text, path="<refreshed aws catalog>")  # never write a file the loader rejects
    return text


def write_atomically(directory: Path, filename: str, text: str) -> Path:
    """Write ``directory/filename`` through a temporary file and a rename: never half-written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise CatalogError(f"cannot write to {directory}: {exc.strerror or exc}; pass --out DIR") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        target = directory / filename
        os.replace(tmp, target)
        return target
    except OSError as exc:
        raise CatalogError(f"cannot write {directory / filename}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclass(frozen=True)
class RefreshedCatalog:
    """What ``rubberband catalog update`` wrote: the file, how many rows and types, the regions, the warnings."""

    path: Path
    rows: int
    types: int
    regions: tuple[str, ...]
    warnings: tuple[str, ...]


def refresh_catalog(regions: list[str] | None, types: list[str] | None, directory: Path) -> RefreshedCatalog:
    """Refresh AWS prices through boto3 (Price List API + spot price history) into ``directory/aws.csv``, dated;
    ``regions`` / ``types`` default to the shipped catalog's."""
    shipped = shipped_aws_catalog()
    regions = regions or sorted({t.region for t in shipped.types})
    types = types or sorted({t.name for t in shipped.types})
    fetcher = AwsCatalogFetcher(reference=shipped)
    rows = fetcher.fetch(regions, types)
    now = dt.datetime.now(dt.timezone.utc)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "").strip()
    source = (
        f"AWS Price List API (GetProducts: AmazonEC2, Linux, Shared tenancy, on-demand) and "
        f"ec2:DescribeSpotPriceHistory (latest per type and zone), fetched {now:%Y-%m-%dT%H:%MZ}"
        f"{' from ' + endpoint if endpoint else ''} by `rubberband catalog update aws`"
    )
    text = render_aws_csv(rows, date=now.strftime("%Y-%m-%d"), source=source)
    target = write_atomically(directory, "aws.csv", text)
    kinds = len({r.instance_type for r in rows})
    return RefreshedCatalog(target, len(rows), kinds, tuple(regions), tuple(fetcher.warnings))
