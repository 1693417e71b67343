"""Re-planning the remaining work: at a lane's stage boundary, and once failover finds a planned type unavailable.

**At a boundary** (before a lane's next stage, and before a lane's first stage when it starts after the job:
a sequential bracket, or a parallel one at its offset) the remaining work (:meth:`~rubberband.executor.
lane_outlook.LaneOutlook.remainder`) goes to the re-planner with what the run measured; the
:class:`~rubberband.planner.policies.LatenessPolicy` decides from both outlooks — go on, take a cheaper plan,
buy speed, finish late, or stop now with the best so far (``on_late``) — and the decision is journaled
(``replan``). A taken plan is journaled (``plan_changed``) and the lanes follow it.

**After a failover** (a planned type of the remaining work found unavailable: substituted, or every zone
blocked) the same remainder is re-planned without it, at once and once per type: by the re-planner with those
types excluded, else each replaced by its stand-in (what failover obtained, or the cheapest alternative of the
region; same workers per instance, so placement and epochs are unchanged) and re-priced. Stages already
running go on with the type failover obtained.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.decisions import Standing, judge_proposal, proposal_problem, stand_in_stages
from rubberband.executor.fleet import Fleet
from rubberband.executor.lane_outlook import Chain, LaneOutlook
from rubberband.executor.runplan import RunPlan
from rubberband.executor.runtime import ReplanAnswer, ReplanRequest, Replanner
from rubberband.executor.scheduling import RunView
from rubberband.executor.services import Services
from rubberband.executor.stopping import RunStopped
from rubberband.executor.survivors import measured_survivors
from rubberband.plan import Plan, StagePlan
from rubberband.planner.brackets import Remainder, parallel_remainder
from rubberband.planner.policies import Action, LatenessPolicy


@dataclass(frozen=True)
class Asked:
    """A re-plan's question: the request, the ``replan`` decision's fields so far and the remaining time by the
    stage predictions (the current plan's outlook without a re-planner)."""

    request: ReplanRequest
    decision: dict[str, Any]
    remaining_pred_s: float


class Replanning:
    """The run's re-plans (see the module docstring). ``deadline_s``: the run's deadline."""

    def __init__(
        self, services: Services, fleet: Fleet, replanner: Replanner | None, lateness: LatenessPolicy, deadline_s: float
    ) -> None:
        self.services = services
        self.fleet = fleet
        self.runplan: RunPlan = fleet.runplan
        self.replanner = replanner
        self.lateness = lateness
        self.deadline_s = deadline_s

    # -- when ----------------------------------------------------------------------------------------
    def newly_unavailable(self, keys: list[str], view: RunView) -> bool:
        """Whether ``keys`` (unavailable type keys) hold one no failover re-plan has answered yet."""
        return bool(set(keys) - view.choices.replanned_around)

    def failover_due(self, outlook: LaneOutlook, view: RunView) -> bool:
        """Whether a planned type of the remaining work turned unavailable since the last failover re-plan
        (cheap: the stages only; the backend's blocked zones are looked up in memory)."""
        stages = [view.plan.stage(i) for c in outlook.remainder(view, None, timed=False) for i in c.positions]
        return bool(stages) and self.newly_unavailable(self.runplan.unavailable(stages, self.services.backend), view)

    # -- at a boundary -------------------------------------------------------------------------------
    def at_boundary(self, g: int, lane: int, outlook: LaneOutlook, view: RunView) -> list[int]:
        """The re-plan before stage ``g`` of lane ``lane``; the positions it changed (RunStopped on ``stop``)."""
        chains = outlook.remainder(view, (outlook.lanes[lane], g))
        at = next(k for k, c in enumerate(chains) if c.positions and c.positions[0] == g)
        rest = parallel_remainder([(c.positions, c.wait_s) for c in chains], at)
        asked = self._ask(g, chains, rest, outlook, view)
        if self.newly_unavailable(list(asked.request.unavailable), view):
            return self._around(g, asked)
        return self._decide(g, asked)

    def after_failover(self, outlook: LaneOutlook, view: RunView) -> list[int]:
        """Re-plan every lane's remaining stages without the types failover found unavailable, now: the chain
        that can start first goes first and the others' offsets count from then (the re-planner's "now", so its
        remaining deadline is shortened by that wait, journaled as ``starts_in_s``)."""
        chains = [c for c in outlook.remainder(view, None) if c.positions]
        if not chains:
            return []
        first = min(range(len(chains)), key=lambda k: (max(0.0, chains[k].wait_s), k))
        shift = max(0.0, chains[first].wait_s)
        shifted = [Chain(c.lane, c.positions, c.wait_s - shift, c.kept) for c in chains]
        rest = parallel_remainder([(c.positions, c.wait_s) for c in shifted], first)
        g = rest.positions[0]
        asked = self._ask(g, shifted, rest, outlook, view, starts_in_s=round(shift, 3))
        request = replace(
            asked.request,
            running=dict(asked.request.bracket_running[0]),
            remaining_deadline_s=max(1.0, asked.request.remaining_deadline_s - shift),
        )
        return self._around(g, replace(asked, request=request))

    # -- the question ----------------------------------------------------------------------------------
    def _ask(
        self, g: int, chains: list[Chain], rest: Remainder, outlook: LaneOutlook, view: RunView, **fields: Any
    ) -> Asked:
        elapsed = view.elapsed()
        ratio = outlook.slowdown(view)
        remaining_pred = outlook.remaining_pred_s(chains, ratio, view)
        at_risk = elapsed + remaining_pred > self.deadline_s
        decision = dict(
            stage=g,
            elapsed_s=elapsed,
            predicted_remaining_s=remaining_pred,
            slowdown=ratio,
            at_risk=at_risk,
            bracket=view.plan.stage(g).bracket,
            stages=list(rest.positions),
            offsets_s=[round(o, 3) for o in rest.offsets_s],
            **fields,
        )
        first_of = {c.positions[0]: c for c in chains if c.positions}
        measured = self.fleet.measured
        request = ReplanRequest(
            spec=self.services.spec,
            plan=view.plan.plan,
            next_stage=g,
            elapsed_s=elapsed,
            spent_usd=bill_run(view.state, now=view.now()).total_usd,
            remaining_deadline_s=max(1.0, self.deadline_s - elapsed),
            epoch_seconds=dict(measured.epoch_seconds),
            setup_seconds=list(measured.setup_seconds),
            startup_s=dict(measured.startup_seconds),
            at_risk=at_risk,
            iteration_latencies=dict(measured.iteration_latencies),
            running=outlook.instance_counts([g], view),
            unavailable=self._unavailable(rest.positions, view),
            stages=rest.positions,
            offsets_s=rest.offsets_s,
            bracket_running=tuple(first_of[i].kept for i in rest.positions if i in first_of),
            survivors=measured_survivors(
                view.state,
                list(view.plan.plan.stages),
                rest.positions,
                (self.services.spec.metric.name, self.services.spec.metric.mode),
                self.runplan.planned_type,
            ),
        )
        return Asked(request, decision, remaining_pred)

    def _unavailable(self, positions: tuple[int, ...], view: RunView) -> tuple[str, ...]:
        """The type keys a proposal must not use: the remaining stages' planned types failover found unavailable,
        and every type an earlier failover re-plan answered (the remaining stages no longer use it, and a proposal
        must not bring it back)."""
        keys = self.runplan.unavailable([view.plan.stage(i) for i in positions], self.services.backend)
        return tuple(dict.fromkeys([*keys, *sorted(view.choices.replanned_around)]))

    def _answer(self, request: ReplanRequest) -> tuple[ReplanAnswer, str]:
        """The re-planner's answer (an empty one when there is none, it failed or proposed nothing) and a note."""
        if self.replanner is None:
            return ReplanAnswer(None), "no re-planner available"
        try:
            answer = self.replanner(request)
        except Exception as exc:  # noqa: BLE001 - a failing re-plan keeps the current plan
            return ReplanAnswer(None), f"re-planner failed: {exc}"
        if answer is None:
            return ReplanAnswer(None), "re-planner proposed nothing"
        if not isinstance(answer, ReplanAnswer):
            answer = ReplanAnswer(answer)
        return answer, "" if answer.proposal is not None else "re-planner proposed nothing"

    # -- deciding -------------------------------------------------------------------------------------
    def _decide(self, g: int, asked: Asked) -> list[int]:
        """Ask the re-planner, let the lateness policy decide from both outlooks, journal it, take the proposal
        when it says so, and stop the run (RunStopped) on ``stop``."""
        request = asked.request
        answer, note = self._answer(request)
        candidate = answer.proposal
        rest = [self.runplan.stage(i) for i in request.positions()]
        problem = None
        if candidate is not None:
            problem = proposal_problem(
                candidate.stages, rest, unavailable=request.unavailable, key_of=self.runplan.planned_key
            )
        if problem is not None:
            candidate, note = None, problem
        standing = Standing(request.at_risk, asked.remaining_pred_s, answer.current_p_meet, answer.current_jct_p50_s)
        judged = judge_proposal(self.lateness, rest, candidate, standing, self.deadline_s - request.elapsed_s)
        verdict = judged.verdict
        reason = f"{note}; {verdict.reason}" if note else verdict.reason
        self.services.journal.record(
            J.Replan(
                **asked.decision,
                action=verdict.action.value,
                accepted=verdict.take_proposal,
                reason=reason,
                **judged.figures,
            )
        )
        changed = self._take(g, request, candidate.stages) if verdict.take_proposal and candidate is not None else []
        if verdict.action is Action.STOP:
            hint = "--on-late finish" if self.lateness.on_late == "stop" else "--overrun none"
            raise RunStopped(
                f"{verdict.reason} (before stage {g}); every instance was terminated; to go on "
                f"anyway: rubberband run --resume {self.services.run_dir} {hint}"
            )
        return changed

    def _around(self, g: int, asked: Asked) -> list[int]:
        """Re-plan the request's stages without the unavailable types (the re-planner, else stand-ins); journaled
        (``replan`` with ``trigger: failover``, ``unavailable``, ``source``)."""
        request = asked.request
        rest = [self.runplan.stage(i) for i in request.positions()]
        unavailable = list(request.unavailable)
        names = ", ".join(k.rsplit(":", 1)[-1] for k in unavailable)
        decision = {**asked.decision, "trigger": "failover", "unavailable": unavailable}
        stages, note = self._proposed_around(request, rest, unavailable, decision)
        if stages is None:
            stages, substitutions = stand_in_stages(
                rest,
                unavailable,
                type_of=self.runplan.planned_type,
                stand_in=lambda itype, spot: self.runplan.stand_in(itype, spot, unavailable, self.services.backend),
            )
            if not substitutions:
                self.services.journal.record(
                    J.Replan(
                        **decision,
                        accepted=False,
                        source="substitution",
                        reason=f"failover: {names} unavailable and no available type can stand in"
                        f"{'; ' + note if note else ''}",
                    )
                )
                return []
            decision.update(
                source="substitution",
                substitutions=substitutions,
                proposal_cost_usd=sum(s.predicted_cost_usd or 0.0 for s in stages),
            )
        reason = f"failover: {names} unavailable in every zone; remaining stages re-planned without it"
        self.services.journal.record(
            J.Replan(
                **decision,
                accepted=True,
                reason=reason + (f" ({note})" if note else ""),
                current_cost_usd=sum(s.predicted_cost_usd or 0.0 for s in rest),
            )
        )
        return self._take(g, request, stages)

    def _proposed_around(
        self, request: ReplanRequest, rest: list[StagePlan], unavailable: list[str], decision: dict[str, Any]
    ) -> tuple[list[StagePlan] | None, str]:
        """The re-planner's stages without the unavailable types (None: no re-planner, or an unusable proposal)
        and a note; ``decision`` gets the proposal's figures."""
        if self.replanner is None:  # without one: stand-ins, and no note
            return None, ""
        answer, note = self._answer(request)  # failed or proposed nothing: stand-ins, and why
        candidate = answer.proposal
        if candidate is None:
            return None, note
        problem = proposal_problem(candidate.stages, rest, unavailable=unavailable, key_of=self.runplan.planned_key)
        if problem is not None:
            return None, f"re-planner's {problem}"
        decision.update(
            source="replanner",
            proposal_cost_usd=candidate.predicted.cost_usd.mean,
            proposal_p_meet=candidate.predicted.p_meet_deadline,
        )
        return list(candidate.stages), note

    def _take(self, g: int, request: ReplanRequest, stages: list[StagePlan]) -> list[int]:
        """The plan with ``stages`` at the request's positions: followed and journaled (``plan_changed``)."""
        changed = list(self.runplan.stages)
        for i, stage in zip(request.positions(), stages):
            changed[i] = stage
        plan: Plan = self.runplan.plan.model_copy(update={"stages": changed})
        positions = self.runplan.follow(plan)
        self.services.journal.record(J.PlanChanged(stage=g, plan=plan.model_dump(mode="json"), changed=positions))
        return positions
