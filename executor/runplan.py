"""The plan a run follows, and the instance types its stages run on after failover and fall-backs.

:class:`RunPlan` is one source of truth for "which type does stage ``g`` run on now": the plan's type, or what
failover obtained in its place (the run's substitutes, folded from the journal's ``failover`` decisions), or —
for a spot stage bought on-demand — the plan's fall-back type. It also answers which instance may serve which
stage (type and market) and holds the plan's :class:`~rubberband.executor.lanes.LaneLayout`. A re-plan replaces
the plan here (:meth:`RunPlan.follow`); nothing else keeps a copy.
"""

from __future__ import annotations

from typing import Protocol

from rubberband.catalog import Catalog, InstanceType
from rubberband.cloud.failover import alternatives_for
from rubberband.errors import CatalogError
from rubberband.executor import spot as S
from rubberband.executor.lanes import LaneLayout
from rubberband.executor.runstate import DecisionState
from rubberband.plan import Plan, StagePlan
from rubberband.planner.policies import Market


class Served(Protocol):
    """What :meth:`RunPlan.serves` looks at of an instance."""

    itype: InstanceType
    spot: bool


class Availability(Protocol):
    """The cloud's view of a type (the backend's ``unavailable``)."""

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool: ...


class RunPlan:
    """The current plan, its lanes and the types it runs on (see the module docstring).

    ``choices``: the run's decision state (the journal's fold: substitutes and fall-back are read from it).
    """

    def __init__(self, plan: Plan, catalog: Catalog, choices: DecisionState) -> None:
        self.catalog = catalog
        self.choices = choices
        self.plan = plan
        self.layout = LaneLayout.for_plan(plan)
        self._types: dict[str, InstanceType] = {}  # keys failover obtained (may lie outside the catalog)

    # -- the plan -------------------------------------------------------------------------------
    @property
    def stages(self) -> list[StagePlan]:
        return self.plan.stages

    def stage(self, g: int) -> StagePlan:
        return self.plan.stages[g]

    def follow(self, plan: Plan) -> list[int]:
        """Take ``plan`` (a re-plan's); the positions whose stage changed."""
        changed = [i for i, (a, b) in enumerate(zip(self.plan.stages, plan.stages)) if a != b]
        self.plan = plan
        self.layout = LaneLayout.for_plan(plan)
        return changed

    def last_of_bracket(self, g: int) -> bool:
        stages = self.plan.stages
        return g + 1 == len(stages) or stages[g + 1].bracket != stages[g].bracket

    # -- types ----------------------------------------------------------------------------------
    def learn(self, itype: InstanceType) -> None:
        """Remember a type failover obtained (so a substitute's key resolves even outside the catalog)."""
        self._types[itype.key] = itype

    def by_key(self, key: str) -> InstanceType | None:
        if key in self._types:
            return self._types[key]
        try:
            return self.catalog.by_key(key)
        except CatalogError:
            return None

    def planned_type(self, stage: StagePlan) -> InstanceType:
        return self.catalog.find(stage.instance_type, cloud=stage.cloud, region=stage.region)

    def planned_key(self, stage: StagePlan) -> str:
        return self.planned_type(stage).key

    def substitute(self, itype: InstanceType) -> InstanceType:
        """What failover obtained in place of ``itype`` (followed when it failed over again), else ``itype``."""
        seen = {itype.key}
        subs = self.choices.substitutes
        while itype.key in subs and subs[itype.key] not in seen:
            nxt = self.by_key(subs[itype.key])
            if nxt is None:
                break
            itype = nxt
            seen.add(itype.key)
        return itype

    def stage_itype(self, stage: StagePlan) -> InstanceType:
        """The type a stage runs on: the planned one, or what failover obtained in its place."""
        return self.substitute(self.planned_type(stage))

    def fallback_itype(self, stage: StagePlan) -> InstanceType:
        """What a spot stage's instances are bought as on-demand: the plan's fall-back type (cheaper per epoch),
        else the stage's own type."""
        if stage.fallback_instance_type and S.stage_market(stage) is Market.SPOT:
            return self.catalog.find(stage.fallback_instance_type, cloud=stage.cloud, region=stage.region)
        return self.stage_itype(stage)

    def same_type(self, a: StagePlan, b: StagePlan) -> bool:
        return self.stage_itype(a).key == self.stage_itype(b).key and a.spot == b.spot

    def fits(self, spot: bool, stage: StagePlan) -> bool:
        """Whether an instance bought on this market may serve ``stage``: its planned market, or on-demand for a
        spot stage once the spot policy moved the run's spot work to on-demand (those instances carry over)."""
        planned = S.stage_market(stage) is Market.SPOT
        return spot == planned or (planned and not spot and self.choices.fell_back)

    def serves(self, entry: Served, stage: StagePlan) -> bool:
        """Whether ``entry`` may run ``stage``'s trials: the stage's type on a market that fits, (a spot stage
        moved to on-demand) its fall-back type bought on-demand, or a type the run re-planned around because
        failover found it unavailable, where the stage now runs a stand-in for it (same workers per instance, same
        device): an instance of a sold-out type that the run still holds is worth keeping, it cannot be bought
        again."""
        if not self.fits(entry.spot, stage):
            return False
        itype = self.stage_itype(stage)
        if entry.itype.key == itype.key:
            return True
        if entry.itype.key in self.choices.replanned_around and stands_in(itype, entry.itype):
            return True
        return not entry.spot and entry.itype.key == self.fallback_itype(stage).key

    def request_type(self, stage: StagePlan, spot: bool) -> tuple[InstanceType, InstanceType | None]:
        """The type to request for ``stage`` on this market, and what a spot request buys on-demand if it finds
        no spot capacity (the plan's fall-back type; None for an on-demand stage)."""
        fallback = self.fallback_itype(stage) if S.stage_market(stage) is Market.SPOT else None
        itype = fallback if fallback is not None and not spot else self.stage_itype(stage)
        return itype, fallback

    # -- unavailable types ----------------------------------------------------------------------
    def unavailable(self, stages: list[StagePlan], cloud: Availability) -> list[str]:
        """Keys of the planned types of ``stages`` failover found unavailable (substituted, or every zone
        blocked)."""
        out: list[str] = []
        for stage in stages:
            itype = self.planned_type(stage)
            if itype.key in out:
                continue
            if itype.key in self.choices.substitutes or cloud.unavailable(itype, spot=stage.spot):
                out.append(itype.key)
        return out

    def stand_in(
        self, itype: InstanceType, spot: bool, unavailable: list[str], cloud: Availability
    ) -> InstanceType | None:
        """What runs instead of an unavailable type: what failover obtained for it, else the cheapest
        alternative of its region."""
        if itype.key in self.choices.substitutes:
            return self.substitute(itype)
        for alt in alternatives_for(itype, self.catalog, spot=spot, clouds=[itype.cloud]):
            if alt.region == itype.region and alt.key not in unavailable and not cloud.unavailable(alt, spot=spot):
                return alt
        return None


def stands_in(alternative: InstanceType, primary: InstanceType) -> bool:
    """Whether ``alternative`` can run what was placed for ``primary``: as failover's alternatives
    (:func:`~rubberband.cloud.failover.alternatives_for`), the same workers per instance on the same device."""
    return alternative.workers == primary.workers and alternative.device == primary.device
