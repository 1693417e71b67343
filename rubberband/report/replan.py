"""Re-planning for the report's what-if sections (cost-vs-deadline sweep, cloud comparison).

The report never calls the planner directly: it asks an injected ``Replanner`` (a callable
taking a :class:`ReplanRequest` and returning a :class:`~rubberband.plan.Plan`, raising
``InfeasibleError`` when the deadline cannot be met). That keeps the report testable with a
fake planner and lets the ``plan`` command reuse the spec, profile and catalog it already
loaded. :func:`default_replanner` builds one from what a plan carries (its spec and profile
path), or returns ``None`` with the reason when that is not possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rubberband.plan import Plan


@dataclass(frozen=True)
class ReplanRequest:
    """Plan the same job again with these changes (``None`` keeps the spec's value)."""

    deadline_s: float | None = None
    cloud: str | None = None
    spot: bool | None = None
    samples: int = 300


Replanner = Callable[[ReplanRequest], Plan]


def plan_profile_path(plan: Plan) -> str | None:
    """The profile a plan was made with: its ``profile_path``, else its embedded spec's ``profile:``."""
    if plan.profile_path:
        return plan.profile_path
    if plan.spec is None:
        return None
    from rubberband.spec import JobSpec

    spec = JobSpec.model_validate(plan.spec)
    return str(spec.profile_path()) if spec.profile else None


def default_replanner(plan: Plan, *, samples: int = 300) -> tuple[Replanner | None, str]:
    """A replanner for ``plan`` from its embedded spec, or ``(None, why not)``.

    Uses ``rubberband.planner.plan_job`` with the spec and profile the plan was made from and
    the shipped catalogs.
    """
    if plan.spec is None:
        return None, "the plan carries no job spec to re-plan from (re-run `rubberband plan` to embed it)"
    try:
        from rubberband.planner import PlanOptions, SpotMarket, plan_job  # type: ignore[attr-defined]
    except ImportError:
        return None, "the planner is not available in this installation"
    from rubberband.catalog import load_catalog
    from rubberband.profile import load_profile
    from rubberband.spec import JobSpec

    spec = JobSpec.model_validate(plan.spec)
    profile_path = plan_profile_path(plan)
    if profile_path is None:
        return None, "the plan names no profile to re-plan with"
    profile = load_profile(profile_path)
    catalog = load_catalog()
    heads = replan_heads(plan)

    def replan(request: ReplanRequest) -> Plan:
        resources = spec.resources
        changes: dict = {}
        if request.cloud is not None:
            changes["clouds"] = [request.cloud]
            changes["regions"] = None
            changes["instance_types"] = None
        if request.spot is not None:
            changes["spot"] = request.spot
        job = spec.model_copy(update={"resources": resources.model_copy(update=changes)}) if changes else spec
        market = None
        if job.resources.spot:  # spot per stage with preemptions, as `rubberband plan` plans it
            from rubberband.spotmodel import load_spot_model

            fitted = load_spot_model()
            market = SpotMarket(fitted.market_model(), source=f"shipped default ({fitted.source})")
        options = PlanOptions(
            deadline_s=request.deadline_s,
            cloud=request.cloud,
            samples=request.samples,
            seed=plan.planner.seed,
            heads=heads,
            brackets=plan.brackets,
            asha=False,
            spot=market,
        )
        return plan_job(job, profile, catalog, options)

    return replan, ""


def replan_heads(plan: Plan) -> dict:
    """The billed heads re-plans include, as ``plan`` was made: its own head (and grace) on every cloud;
    none when it is an AWS/GCP plan without one (``--head local``, or made before heads were billed);
    the default heads for a local plan (compared with clouds a run would start a head on)."""
    from rubberband.planning import billed_heads

    if plan.head is not None:
        return billed_heads("instance", plan.head.grace_s)
    if any(s.cloud != "local" for s in plan.stages):
        return {}
    return billed_heads("instance")
