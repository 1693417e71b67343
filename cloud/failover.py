"""Cloud error vocabulary and the failover policy shared by AWS and GCP.

One table (:data:`ERROR_TABLE`) maps each cloud's error codes onto the four kinds of
:class:`~rubberband.errors.CloudError`:

* ``capacity``  – this type is sold out in this zone right now: block the (type, zone)
  pair, try the next zone of the region, then the next-cheapest alternative type;
* ``quota``     – the account may not have more: block the whole region (or the whole
  cloud for GCP's ``GPUS_ALL_REGIONS``) and name the quota to raise;
* ``transient`` – throttling or a 5xx: retry the same call with bounded exponential backoff;
* ``fatal``     – bad credentials, missing permission, bad input: stop at once.

:func:`provision_with_failover` walks the candidates in that order and returns what it
tried (:class:`Attempt`) so the executor can journal every step. SkyPilot's users
report failover that keeps hammering regions without quota (#1268); blocking regions on
quota errors is the fix adopted here.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from rubberband.cloud.provider import Instance, InstanceRequest, Provisioner
from rubberband.catalog import Catalog, InstanceType
from rubberband.credentials import redact
from rubberband.errors import CloudError, Location

T = TypeVar("T")


@dataclass(frozen=True)
class ErrorRule:
    """How one provider error code is handled, and what the user can do about it."""

    kind: str
    hint: str


_AUTH_AWS = (
    "check the AWS credentials boto3 finds (AWS_PROFILE, ~/.aws/credentials, environment, SSO or the instance role)"
)
_PERM = "grant the permission listed in docs/clouds.md"
_CAPACITY = "no capacity for this type in this zone right now; rubberband tries other zones and types"
_RETRY = "throttled or a server error; retried with backoff"

#: Provider error code → kind and hint. AWS codes are CamelCase, GCP codes UPPER_CASE
#: (operation errors) or camelCase (HTTP error reasons).
ERROR_TABLE: dict[str, ErrorRule] = {
    # -- AWS EC2
    "InsufficientInstanceCapacity": ErrorRule("capacity", _CAPACITY),
    "InsufficientHostCapacity": ErrorRule("capacity", _CAPACITY),
    "InsufficientCapacityOnOutpost": ErrorRule("capacity", _CAPACITY),
    "SpotMaxPriceTooLow": ErrorRule("capacity", "the spot price is above the maximum; trying elsewhere"),
    "Unsupported": ErrorRule("capacity", "this type is not offered in this zone; trying other zones"),
    "VcpuLimitExceeded": ErrorRule("quota", "raise the vCPU quota in the Service Quotas console"),
    "MaxSpotInstanceCountExceeded": ErrorRule("quota", "raise the spot vCPU quota in the Service Quotas console"),
    "InstanceLimitExceeded": ErrorRule("quota", "raise the instance quota in the Service Quotas console"),
    "RequestLimitExceeded": ErrorRule("transient", _RETRY),
    "Throttling": ErrorRule("transient", _RETRY),
    "ThrottlingException": ErrorRule("transient", _RETRY),
    "InternalError": ErrorRule("transient", _RETRY),
    "InternalFailure": ErrorRule("transient", _RETRY),
    "ServiceUnavailable": ErrorRule("transient", _RETRY),
    "Unavailable": ErrorRule("transient", _RETRY),
    "AuthFailure": ErrorRule("fatal", _AUTH_AWS),
    "InvalidClientTokenId": ErrorRule("fatal", _AUTH_AWS),
    "SignatureDoesNotMatch": ErrorRule("fatal", _AUTH_AWS),
    "ExpiredToken": ErrorRule("fatal", _AUTH_AWS + "; the session token has expired"),
    "NoCredentials": ErrorRule("fatal", _AUTH_AWS),
    "UnauthorizedOperation": ErrorRule("fatal", _PERM),
    "AccessDeniedException": ErrorRule("fatal", _PERM),
    "DryRunOperation": ErrorRule("fatal", "a DryRun request would have succeeded (permission check)"),
    "OptInRequired": ErrorRule("fatal", "opt in to this region in the AWS console or choose another region"),
    "InvalidAMIID.NotFound": ErrorRule(
        "fatal", "the machine image does not exist in this region; set RUBBERBAND_AWS_AMI or pass image_id"
    ),
    "InvalidParameterValue": ErrorRule("fatal", "the request was rejected as invalid"),
    # -- GCP Compute Engine
    "ZONE_RESOURCE_POOL_EXHAUSTED": ErrorRule("capacity", _CAPACITY),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": ErrorRule("capacity", _CAPACITY),
    "RESOURCE_POOL_EXHAUSTED": ErrorRule("capacity", _CAPACITY),
    "QUOTA_EXCEEDED": ErrorRule("quota", "raise the quota on the IAM & Admin > Quotas page"),
    "quotaExceeded": ErrorRule("quota", "raise the quota on the IAM & Admin > Quotas page"),
    "RATE_LIMIT_EXCEEDED": ErrorRule("transient", _RETRY),
    "rateLimitExceeded": ErrorRule("transient", _RETRY),
    "userRateLimitExceeded": ErrorRule("transient", _RETRY),
    "backendError": ErrorRule("transient", _RETRY),
    "internalError": ErrorRule("transient", _RETRY),
    "PERMISSION_DENIED": ErrorRule("fatal", _PERM),
    "forbidden": ErrorRule("fatal", _PERM),
    "UNAUTHENTICATED": ErrorRule(
        "fatal", "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
    ),
    "authError": ErrorRule(
        "fatal", "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
    ),
}


def _one_line(text: str, limit: int = 240) -> str:
    text = redact(" ".join(str(text or "").split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class CallContext:
    """What a failed provider call was about: the cloud, where (zone, region), for which instance type and
    market, and the API action (``ec2:RunInstances``), each where known; the message and the quota hint name them."""

    cloud: str
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    spot: bool = False
    action: str | None = None
    #: the cloud's quota names and console (its provider passes them); None: a generic hint
    quotas: QuotaGuide | None = None


class QuotaGuide(Protocol):
    """A cloud's quotas, for the hint of a quota error (``cloud/<name>/quotas.py``)."""

    @property
    def console(self) -> str: ...

    def quota_name(self, instance_type: str, spot: bool, message: str) -> str:
        """The quota that stopped a launch of ``instance_type`` (``message``: the cloud's error text)."""
        ...


def classify(
    code: str, message: str, context: CallContext, *, http_status: int | None = None, quota: str | None = None
) -> CloudError:
    """Turn one provider error into a one-line :class:`CloudError` of the right kind."""
    cloud, zone, region, instance_type = context.cloud, context.zone, context.region, context.instance_type
    rule = ERROR_TABLE.get(code)
    if rule is None:
        if http_status is not None and (http_status >= 500 or http_status == 429):
            rule = ErrorRule("transient", _RETRY)
        elif http_status in (401, 403):
            rule = ErrorRule("fatal", _PERM)
        else:
            rule = ErrorRule("fatal", "unexpected cloud error; nothing was left running")
    where = zone or region or cloud
    what = f" for {instance_type}" if instance_type else ""
    hint = rule.hint
    if rule.kind == "quota":
        guide = context.quotas
        if quota is None:
            quota = guide.quota_name(instance_type or "", context.spot, message) if guide else "the instance quota"
        scope = "every region" if quota == "GPUS_ALL_REGIONS" else (region or where)
        console = guide.console if guide else f"{cloud}'s quota console"
        hint = f"raise the quota '{quota}' in {scope} ({console})"
    if code in ("UnauthorizedOperation", "AccessDeniedException") and context.action:
        hint = f"the credentials lack the permission {context.action}; {_PERM}"
    text = f"{cloud} {code or http_status}{what} in {where}: {_one_line(message)} — {hint}"
    return CloudError(
        _one_line(text, 400), kind=rule.kind, code=code, where=Location(region=region, zone=zone), quota=quota
    )


# -- retries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for transient errors (equal jitter)."""

    max_tries: int = 5
    base_s: float = 1.0
    cap_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap_s, self.base_s * 2**attempt)
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)


def call_with_retry(fn: Callable[[], T], retry: RetryPolicy) -> T:
    """Call ``fn``; on a transient CloudError sleep and try again, at most ``retry.max_tries`` times."""
    for attempt in range(retry.max_tries):
        try:
            return fn()
        except CloudError as exc:
            if exc.kind != "transient" or attempt == retry.max_tries - 1:
                raise
            retry.sleep(retry.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


# -- failover ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One provisioning try, for the journal: where, what, and how it ended."""

    cloud: str
    region: str
    zone: str | None
    instance_type: str
    outcome: str  # ok | capacity | quota | transient | fatal | skipped
    code: str = ""
    message: str = ""
    market: str = ""  # spot | on_demand ("" where the caller did not say)


class FailoverExhausted(CloudError):
    """Every candidate zone and type was tried (or blocked); carries what was tried."""

    def __init__(self, message: str, *, kind: str, attempts: list[Attempt]) -> None:
        super().__init__(message, kind=kind)
        self.attempts = attempts


#: Seconds a (type, zone) out of capacity stays skipped before it is tried again. Capacity comes back: in the
#: shipped spot traces an outage of p3.2xlarge lasts 20 to 85 minutes at the median, depending on the zone
#: (rubberband/catalogs/spot_model.json, ``unavailable_s``), and the planner's simulator draws every spot
#: request afresh. Ten minutes asks again well within an outage's typical length, at one failed call a zone.
CAPACITY_RETRY_S = 600.0


@dataclass
class FailoverPolicy:
    """Blocked zones, regions and clouds, remembered across the provisioning calls of one run.

    Spot and on-demand are blocked apart (``blocked_spot_*``): a zone without spot capacity may well sell the
    type on-demand, and both clouds count spot quotas apart. An all-region GPU quota blocks both markets.
    A quota block lasts the run; a capacity block lasts ``capacity_retry_s`` (time from ``clock``), after which
    the zone is tried again.
    """

    #: (cloud, type, zone) → when it was found out of capacity (``clock``)
    blocked_zones: dict[tuple[str, str, str], float] = field(default_factory=dict)
    blocked_regions: set[tuple[str, str]] = field(default_factory=set)  # (cloud, region)
    blocked_clouds: set[str] = field(default_factory=set)
    blocked_spot_zones: dict[tuple[str, str, str], float] = field(default_factory=dict)
    blocked_spot_regions: set[tuple[str, str]] = field(default_factory=set)
    capacity_retry_s: float = CAPACITY_RETRY_S
    clock: Callable[[], float] = time.monotonic

    def is_blocked(self, itype: InstanceType, zone: str | None, spot: bool = False) -> bool:
        zones, regions = (
            (self.blocked_spot_zones, self.blocked_spot_regions) if spot else (self.blocked_zones, self.blocked_regions)
        )
        since = zones.get((itype.cloud, itype.name, zone or ""))
        return (
            itype.cloud in self.blocked_clouds
            or (itype.cloud, itype.region) in regions
            or (since is not None and self.clock() - since < self.capacity_retry_s)
        )

    def block(self, itype: InstanceType, zone: str | None, error: CloudError, spot: bool = False) -> None:
        """Capacity blocks the (type, zone) for ``capacity_retry_s``; quota blocks the region, or the cloud for
        all-region quotas (each for the market that failed), for the run."""
        zones, regions = (
            (self.blocked_spot_zones, self.blocked_spot_regions) if spot else (self.blocked_zones, self.blocked_regions)
        )
        if error.kind == "capacity":
            zones[(itype.cloud, itype.name, zone or "")] = self.clock()
        elif error.kind == "quota":
            if error.quota == "GPUS_ALL_REGIONS":
                self.blocked_clouds.add(itype.cloud)
            else:
                regions.add((itype.cloud, itype.region))

    @staticmethod
    def candidates(
        primary: InstanceType,
        alternatives: Sequence[InstanceType],
        preferred_zone: str | None = None,
        spot: bool = False,
    ) -> Iterator[tuple[InstanceType, str | None]]:
        """Every zone of the primary type (preferred first), then each alternative's zones, each type's in its
        :meth:`~rubberband.catalog.InstanceType.zones_to_try` order (spot: the zones with a spot offer, cheapest
        first — the order the planner prices a spot stage by)."""
        for itype in (primary, *alternatives):
            zones: list[str | None] = list(itype.zones_to_try(spot)) or [None]
            if itype is primary and preferred_zone in zones:
                zones.remove(preferred_zone)
                zones.insert(0, preferred_zone)
            for zone in zones:
                yield itype, zone


def alternatives_for(
    primary: InstanceType,
    catalog: Catalog,
    *,
    spot: bool = False,
    same_device: bool = True,
    clouds: Sequence[str] | None = None,
) -> list[InstanceType]:
    """Types that can stand in for ``primary`` (same workers per instance), cheapest first."""

    def price(t: InstanceType) -> float:
        return t.spot_price_hr if spot and t.spot_price_hr is not None else t.price_hr

    pool = [
        t
        for t in catalog.types
        if t.key != primary.key
        and t.workers == primary.workers
        and (not same_device or t.device == primary.device)
        and (clouds is None or t.cloud in clouds)
        and (not spot or t.spot_price_hr is not None)
    ]
    return sorted(pool, key=lambda t: (price(t), t.key))


@dataclass(frozen=True)
class FailoverResult:
    instances: list[Instance]
    instance_type: InstanceType
    zone: str | None
    attempts: list[Attempt]
    spot: bool = False  # the market obtained: on-demand when a spot request fell over to it


def _market_steps(request: InstanceRequest, on_demand_fallback: bool) -> list[bool]:
    """The markets to try, in order: the requested one, then on-demand for a spot request that may fall back."""
    return [True, False] if request.spot and on_demand_fallback else [request.spot]


def provision_with_failover(
    request: InstanceRequest,
    provider_for: Callable[[InstanceType], Provisioner],
    *,
    alternatives: Sequence[InstanceType] = (),
    policy: FailoverPolicy | None = None,
    on_demand_fallback: bool = False,
) -> FailoverResult:
    """Provision ``request`` somewhere: zone → alternative type (→ on-demand), skipping what is blocked.

    On spot, only the ``alternatives`` with a spot offer (a ``spot_price_hr``) are tried. A spot request with
    ``on_demand_fallback`` walks the zones and types again on-demand (every alternative; the request's
    ``on_demand_type``, where set, before all of them) once spot has no capacity (or quota) anywhere; the
    result's ``spot`` says which market it got and each :class:`Attempt` names it.

    Providers retry transient errors themselves (bounded backoff, same idempotency
    token); one that still surfaces stops here, like a fatal error. Capacity and quota
    errors block and move on. Raises :class:`FailoverExhausted`
    (with the attempts) when nothing is left to try.
    """
    policy = policy or FailoverPolicy()
    attempts: list[Attempt] = []
    last: CloudError | None = None
    for spot in _market_steps(request, on_demand_fallback):
        others: Sequence[InstanceType] = (
            [t for t in alternatives if t.spot_price_hr is not None] if spot else alternatives
        )  # spot needs an offer
        market = "spot" if spot else "on_demand"
        primary, preferred = request.instance_type, request.zone
        if not spot and request.on_demand_type is not None and request.on_demand_type.key != primary.key:
            # on-demand for a spot stage: the plan's fall-back type first, then the requested type, then the rest
            primary, preferred = request.on_demand_type, None
            others = [
                request.instance_type,
                *(t for t in others if t.key not in (primary.key, request.instance_type.key)),
            ]
        for itype, zone in policy.candidates(primary, others, preferred, spot):
            if policy.is_blocked(itype, zone, spot):
                attempts.append(
                    Attempt(itype.cloud, itype.region, zone, itype.name, "skipped", "blocked", market=market)
                )
                continue
            provider = provider_for(itype)
            try_request = dataclasses.replace(request, instance_type=itype, zone=zone, spot=spot)
            try:
                instances = provider.provision(try_request)
            except CloudError as exc:
                attempts.append(
                    Attempt(itype.cloud, itype.region, zone, itype.name, exc.kind, exc.code, exc.message, market=market)
                )
                if exc.kind in ("fatal", "transient"):
                    raise FailoverExhausted(exc.message, kind=exc.kind, attempts=attempts) from exc
                policy.block(itype, zone, exc, spot)
                last = exc
                continue
            attempts.append(Attempt(itype.cloud, itype.region, zone, itype.name, "ok", market=market))
            return FailoverResult(instances, itype, zone, attempts, spot=spot)
    tried = "; ".join(f"{a.instance_type}@{a.zone or a.region}: {a.outcome}" for a in attempts)
    kind = last.kind if last is not None else "capacity"
    reason = f" — {last.message}" if last is not None else ""
    raise FailoverExhausted(
        _one_line(
            f"could not provision {request.count}x {request.instance_type.name} for "
            f"run {request.run_id} (tried {tried}){reason}",
            600,
        ),
        kind=kind,
        attempts=attempts,
    )
