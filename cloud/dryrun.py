"""Dry run: what a plan would provision, when, where, for how long and for how much — and whether
the credentials may do it. Nothing is provisioned.

:func:`dry_run` turns the plan's representative timeline (instances with requested / ready /
released times) into a provisioning schedule priced from the catalog with each cloud's
billing rule, adds the run's head (see :mod:`rubberband.cloud.head`), and asks each provider
for a permission check: on AWS, ``DryRun=True`` calls (``DryRunOperation`` means allowed,
``UnauthorizedOperation`` means denied). A denied permission raises a fatal
:class:`~rubberband.errors.CloudError` naming it. ``rubberband run --cloud aws|gcp --dry-run``
prints :func:`render_dry_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rubberband.catalog import BILLING_RULES, Catalog, InstanceType, load_catalog
from rubberband.cloud.bootstrap import WatchdogSettings
from rubberband.catalog import head_types
from rubberband.cloud.provider import InstanceRequest, PermissionCheck, ProbesPermissions, Provider
from rubberband.errors import CloudError, InputError, PlanFileError
from rubberband.plan import Plan, StagePlan
from rubberband.units import format_duration, format_usd

ProviderFactory = Callable[[str, str], Provider]


@dataclass(frozen=True)
class ScheduledInstance:
    """One instance the run would request (seconds from the start of the run)."""

    id: str
    role: str  # head | worker
    cloud: str
    region: str
    zone: str
    instance_type: str
    spot: bool
    first_stage: int
    last_stage: int
    request_at_s: float
    ready_at_s: float
    release_at_s: float
    billed_s: float
    price_hr: float
    cost_usd: float


@dataclass(frozen=True)
class DryRunReport:
    job: str
    schedule: list[ScheduledInstance]
    checks: list[PermissionCheck]
    predicted_cost_usd: float
    catalog_dates: dict[str, str] = field(default_factory=dict)
    predicted_head_usd: float = 0.0  # the planner's mean head cost (plan.predicted.cost_breakdown.head_usd)

    @property
    def total_usd(self) -> float:
        return sum(s.cost_usd for s in self.schedule)

    @property
    def head_usd(self) -> float:
        return sum(s.cost_usd for s in self.schedule if s.role == "head")

    @property
    def workers_usd(self) -> float:
        return self.total_usd - self.head_usd

    @property
    def end_s(self) -> float:
        return max((s.release_at_s for s in self.schedule), default=0.0)

    @property
    def peak_instances(self) -> int:
        events = sorted(
            [(s.request_at_s, 1) for s in self.schedule] + [(s.release_at_s, -1) for s in self.schedule],
            key=lambda e: (e[0], e[1]),
        )
        peak = current = 0
        for _, delta in events:
            current += delta
            peak = max(peak, current)
        return peak

    def cost_by_type(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.schedule:
            out[s.instance_type] = out.get(s.instance_type, 0.0) + s.cost_usd
        return out

    @property
    def denied(self) -> list[PermissionCheck]:
        return [c for c in self.checks if c.allowed is False and c.expect == "allow"]

    @property
    def broader(self) -> list[PermissionCheck]:
        """Least-privilege rows the identity fails: it could do what rubberband never needs."""
        return [c for c in self.checks if c.allowed is True and c.expect == "deny"]


def _stage_for(plan: Plan, instance_type: str, cloud: str, first_stage: int) -> StagePlan:
    matches = [s for s in plan.stages if s.instance_type == instance_type and s.cloud == cloud]
    if not matches:
        raise PlanFileError(f"plan timeline names {cloud} {instance_type}, which no stage uses; regenerate the plan")
    return next((s for s in matches if s.stage == first_stage), matches[0])


def _timeline(plan: Plan) -> list[tuple[str, str, str, int, int, float, float, float]]:
    """(id, cloud, type, first, last, requested, ready, released) — the plan's timeline, or one per stage."""
    if plan.timeline.instances:
        return [
            (t.id, t.cloud, t.instance_type, t.first_stage, t.last_stage, t.requested_s, t.ready_s, t.released_s)
            for t in plan.timeline.instances
        ]
    rows = []
    start = 0.0
    for index, stage in enumerate(plan.stages):
        if stage.predicted_duration_s is None:
            raise PlanFileError("plan has neither a timeline nor stage durations; regenerate it with `rubberband plan`")
        for k in range(stage.instances):
            rows.append(
                (
                    f"s{index}-i{k}",
                    stage.cloud,
                    stage.instance_type,
                    stage.stage,
                    stage.stage,
                    start,
                    start,
                    start + stage.predicted_duration_s,
                )
            )
        start += stage.predicted_duration_s
    return rows


def schedule_for(
    plan: Plan, catalog: Catalog, *, include_head: bool = True, head_grace_s: float | None = None
) -> list[ScheduledInstance]:
    """The provisioning schedule of ``plan``, priced with ``catalog`` and each cloud's billing rule.

    With ``include_head`` the run's head comes first: requested its boot before the job starts
    (``plan.head.boot_s``; 0 for a plan that records no head) and released the results grace after
    the last worker (``head_grace_s``, else ``plan.head.grace_s``, else the watchdog's default), so
    its bill matches the planner's ``cost_breakdown.head_usd`` for the same plan.
    """
    schedule: list[ScheduledInstance] = []
    for ident, cloud, name, first, last, requested, ready, released in _timeline(plan):
        if cloud not in head_types():
            raise InputError(
                f"the plan runs on {cloud!r}; a cloud dry run needs a plan for aws or gcp "
                f"(plan with resources.clouds: [aws] or [gcp])"
            )
        stage = _stage_for(plan, name, cloud, first)
        itype: InstanceType = catalog.find(name, cloud=cloud, region=stage.region)
        price = itype.price(stage.spot)
        rule = BILLING_RULES[cloud]
        lifetime = released - requested
        schedule.append(
            ScheduledInstance(
                id=ident,
                role="worker",
                cloud=cloud,
                region=stage.region,
                zone=itype.zones[0] if itype.zones else "",
                instance_type=name,
                spot=stage.spot,
                first_stage=first,
                last_stage=last,
                request_at_s=requested,
                ready_at_s=ready,
                release_at_s=released,
                billed_s=rule.billed_seconds(lifetime),
                price_hr=price,
                cost_usd=rule.cost(lifetime, price),
            )
        )
    if include_head and schedule:
        grace = (
            head_grace_s
            if head_grace_s is not None
            else (plan.head.grace_s if plan.head is not None else WatchdogSettings().done_grace_s)
        )
        boot = plan.head.boot_s if plan.head is not None else 0.0
        first_worker = min(schedule, key=lambda s: s.request_at_s)
        head = head_types()[first_worker.cloud]
        end = max(s.release_at_s for s in schedule) + grace
        rule = BILLING_RULES[first_worker.cloud]
        schedule.insert(
            0,
            ScheduledInstance(
                id="head",
                role="head",
                cloud=first_worker.cloud,
                region=first_worker.region,
                zone=first_worker.zone,
                instance_type=head.name,
                spot=False,
                first_stage=0,
                last_stage=max(s.last_stage for s in schedule),
                request_at_s=-boot,
                ready_at_s=0.0,
                release_at_s=end,
                billed_s=rule.billed_seconds(boot + end),
                price_hr=head.price_hr,
                cost_usd=rule.cost(boot + end, head.price_hr),
            ),
        )
    return schedule


def dry_run_report(
    plan: Plan,
    provider_factory: ProviderFactory | None,
    *,
    catalog: Catalog | None = None,
    include_head: bool = True,
    extra_checks: Sequence[PermissionCheck] = (),
) -> DryRunReport:
    """Schedule, bill and permission checks for ``plan``; provisions nothing, refuses nothing.

    ``provider_factory(cloud, region)`` builds a provider (e.g.
    :func:`rubberband.cloud.registry.make_provider`) whose permissions are probed; None: none are.
    ``extra_checks``: checks made elsewhere (the head's identity,
    :func:`rubberband.cloud.identity.check_identity`).
    """
    clouds = sorted({s.cloud for s in plan.stages})
    catalog = catalog or load_catalog([c for c in clouds if c in BILLING_RULES])
    schedule = schedule_for(plan, catalog, include_head=include_head)
    checks: list[PermissionCheck] = list(extra_checks)
    if provider_factory is not None:
        for cloud, region in sorted({(s.cloud, s.region) for s in schedule}):
            provider = provider_factory(cloud, region)
            first = next(s for s in schedule if (s.cloud, s.region) == (cloud, region) and s.role == "worker")
            itype = catalog.find(first.instance_type, cloud=cloud, region=region)
            request = InstanceRequest(
                run_id="dry-run", stage=0, instance_type=itype, spot=first.spot, zone=first.zone or None
            )
            if isinstance(provider, ProbesPermissions):
                checks.extend(provider.check_permissions(request))
            else:
                checks.append(
                    PermissionCheck(
                        cloud, region, "*", None, f"{cloud} has no dry-run mode; permissions are checked at launch"
                    )
                )
    return DryRunReport(
        job=plan.job.name,
        schedule=schedule,
        checks=checks,
        predicted_cost_usd=plan.predicted.cost_usd.mean,
        predicted_head_usd=plan.predicted.cost_breakdown.head_usd,
        catalog_dates={c: d for c, d in catalog.dates.items() if c in clouds},
    )


def dry_run(
    plan: Plan,
    provider_factory: ProviderFactory | None,
    *,
    catalog: Catalog | None = None,
    include_head: bool = True,
    extra_checks: Sequence[PermissionCheck] = (),
) -> DryRunReport:
    """:func:`dry_run_report`, which must find no permission denied: a denied one raises a fatal CloudError
    naming it (and whose it is)."""
    report = dry_run_report(
        plan, provider_factory, catalog=catalog, include_head=include_head, extra_checks=extra_checks
    )
    if report.denied:
        names = ", ".join(
            f"{c.action} ({c.detail if c.region == 'global' else f'{c.cloud} {c.region}'})" for c in report.denied
        )
        raise CloudError(
            f"permission missing: {names}; grant it (see docs/clouds.md) and retry",
            kind="fatal",
            code="UnauthorizedOperation",
        )
    return report


def _at(seconds: float) -> str:
    """A time relative to the job's start; the head is requested its boot before it (negative)."""
    return f"-{format_duration(-seconds)}" if seconds < 0 else format_duration(seconds)


def render_dry_run(report: DryRunReport) -> RenderableType:
    """Rich tables: the schedule, the expected bill, the permission checks."""
    table = Table(title=f"Dry run of {report.job}: provisioning schedule", title_justify="left")
    for column in (
        "instance",
        "role",
        "type",
        "where",
        "market",
        "request",
        "ready",
        "release",
        "billed",
        "$/h",
        "cost",
    ):
        table.add_column(column, justify="right" if column in ("billed", "$/h", "cost") else "left")
    for s in sorted(report.schedule, key=lambda s: (s.request_at_s, s.id)):
        table.add_row(
            s.id,
            s.role,
            s.instance_type,
            s.zone or s.region,
            "spot" if s.spot else "on-demand",
            _at(s.request_at_s),
            _at(s.ready_at_s),
            _at(s.release_at_s),
            format_duration(s.billed_s),
            f"{s.price_hr:.4f}",
            format_usd(s.cost_usd),
        )
    bill = Text()
    bill.append(f"Expected bill: {format_usd(report.total_usd)}", style="bold")
    planned_head = f", head {format_usd(report.predicted_head_usd)}" if report.predicted_head_usd else ""
    bill.append(
        f"  (workers {format_usd(report.workers_usd)}, head {format_usd(report.head_usd)}; "
        f"planner's mean {format_usd(report.predicted_cost_usd)}{planned_head}; "
        f"peak {report.peak_instances} instances; "
        f"last release at {format_duration(report.end_s)})\n"
    )
    bill.append("By type: " + ", ".join(f"{k} {format_usd(v)}" for k, v in sorted(report.cost_by_type().items())))
    if report.catalog_dates:
        bill.append(
            "\nPrices from catalogs dated " + ", ".join(f"{c} {d}" for c, d in sorted(report.catalog_dates.items()))
        )
    parts: list[RenderableType] = [table, bill]
    if report.checks:
        perms = Table(
            title="Permissions (DryRun calls, IAM simulation / testIamPermissions; nothing created)",
            title_justify="left",
        )
        for column in ("cloud", "region", "permission", "status", "detail"):
            perms.add_column(column)
        for c in report.checks:
            if c.expect == "deny":
                status = {
                    True: "[yellow]BROADER than needed[/]",
                    False: "[green]denied, as it must be[/]",
                    None: "[yellow]not checked[/]",
                }[c.allowed]
            else:
                status = {True: "[green]allowed[/]", False: "[red]DENIED[/]", None: "[yellow]not checked[/]"}[c.allowed]
            perms.add_row(c.cloud, c.region, c.action, status, c.detail)
        parts.append(perms)
    return Group(*parts)
