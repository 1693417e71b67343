"""Spot under a deadline, the executor's desk: the market of each request, and preemption notices.

* :meth:`SpotDesk.market` — spot or on-demand for instances of a spot stage requested now, as the planner's
  :class:`~rubberband.planner.policies.SpotPolicy` (Uniform Progress: stay on spot while the slack covers one more
  restart) decides from the run's :class:`~rubberband.planner.policies.SpotSituation`: time to the deadline, the
  work left at the simulator's quantile (the scheduler's :class:`~rubberband.executor.scheduling.Outlook`) and
  one restart's cost. Journaled (``spot``) on every preemption, notice or loss, and whenever the market changes:
  the journal's fold holds the run's market, so a resumed run buys as the one before decided;
* :meth:`SpotDesk.notices` — the notices the instances' watchers saw (and those asked for right away: a trial
  stopped on one), each journaled once (``notice``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rubberband.executor import journal as J
from rubberband.executor import spot as S
from rubberband.executor.actions import RequestInstances
from rubberband.executor.fleet import Fleet
from rubberband.executor.observations import NoticeSeen
from rubberband.executor.scheduling import Outlook, RunView
from rubberband.executor.services import Services
from rubberband.planner.policies import Market, SpotPolicy, SpotSituation


@dataclass(frozen=True)
class Verdict:
    """A market decision: the market chosen, whether the run was on spot before, and a note on why it differs
    from the policy's (the plan allows no on-demand fall-back)."""

    market: Market
    was_on_spot: bool
    note: str = ""


class SpotDesk:
    """The run's spot decisions and notices (see the module docstring). ``deadline_s``: the run's deadline."""

    def __init__(self, services: Services, fleet: Fleet, policy: SpotPolicy, deadline_s: float) -> None:
        self.services = services
        self.fleet = fleet
        self.policy = policy
        self.deadline_s = deadline_s

    def market(self, request: RequestInstances, outlook: Outlook, view: RunView) -> bool:
        """Spot (True) or on-demand for ``request``; only stages planned on spot ask the policy, and a replacement
        of an on-demand instance stays on-demand."""
        stage = view.plan.stage(request.stage)
        if S.stage_market(stage) is not Market.SPOT:
            return False
        replaced = self.fleet.entry(request.replaces) if request.replaces else None
        if replaced is not None and not replaced.spot:
            return False
        at = min(request.stage if request.at is None else request.at, len(view.plan.stages) - 1)
        situation = self._situation(at, request, outlook, view)
        market = self.policy.decide(situation)
        note = ""
        if market is Market.ON_DEMAND and not S.on_demand_allowed(stage):
            market, note = Market.SPOT, "; the plan allows no on-demand fall-back"
        was = view.choices.on_spot
        if request.trigger in ("preemption", "notice", "lost") or (market is Market.SPOT) != was:
            self._journal(request, at, situation, Verdict(market, was, note))
        return market is Market.SPOT

    def _situation(self, at: int, request: RequestInstances, outlook: Outlook, view: RunView) -> SpotSituation:
        """What the policy looks at, from now: time to the deadline, the run's predicted remaining time (plus a
        replacement's start-up when one is awaited), and one restart of the stage running."""
        stage = view.plan.stage(at)
        lead = self.fleet.lead_s(view.plan.stage_itype(stage))
        replacing = request.replaces is not None
        work = outlook.work_left_s(at, waiting=request.waiting, awaited_s=lead if replacing else 0.0, view=view)
        measured = self.fleet.measured
        key = f"{stage.instance_type}/{stage.workers_per_trial}"
        interval = (
            statistics.mean(measured.epoch_seconds[key])
            if measured.epoch_seconds.get(key)
            else outlook.per_trial_s(at, view) / max(1, stage.epochs_this_stage)
        )
        restart = S.restart_s(
            startup_s=lead,
            restore_s=statistics.mean(measured.setup_seconds) if measured.setup_seconds else 0.0,
            checkpoint_interval_s=interval,
        )
        return SpotSituation(
            time_left_s=self.deadline_s - view.elapsed(),
            work_left_s=work,
            restart_s=restart,
            on_spot=view.choices.on_spot,
        )

    def _journal(self, request: RequestInstances, at: int, situation: SpotSituation, verdict: Verdict) -> None:
        market, was, note = verdict.market, verdict.was_on_spot, verdict.note
        slack, restart = situation.slack_s, situation.restart_s
        if market is Market.SPOT:
            why = f"slack {slack:.0f} s after one more restart ({restart:.0f} s) exceeds the margin: spot"
        else:
            why = (
                f"slack {slack:.0f} s after one more restart ({restart:.0f} s) is at most the margin "
                f"({self.policy.margin_s:g} s): on-demand keeps the deadline"
            )
        self.services.journal.record(
            J.SpotDecision(
                stage=at,
                for_stage=request.stage,
                trigger=request.trigger,
                id=request.replaces,
                previous=(Market.SPOT if was else Market.ON_DEMAND).value,
                confidence=self.fleet.runplan.plan.confidence,
                quantile=S.DECISION_QUANTILE,  # of the predictions the decision saw (the simulator's)
                market=market.value,
                time_left_s=round(situation.time_left_s, 3),
                work_left_s=round(situation.work_left_s, 3),
                restart_s=round(situation.restart_s, 3),
                slack_s=round(slack, 3),
                margin_s=self.policy.margin_s,
                reason=why + note,
            )
        )

    def notices(self, ask: tuple[str, ...], view: RunView) -> list[NoticeSeen]:
        """Preemption notices that came (and those of ``ask``, asked now), each journaled once."""
        seen = []
        for ident, notice in self.fleet.watchers.found(ask).items():
            if notice is None or ident in view.choices.noticed:
                continue
            seen.append(self._take(ident, notice, view))
        return seen

    def _take(self, ident: str, notice: dict[str, Any], view: RunView) -> NoticeSeen:
        self.fleet.watchers.taken(ident)
        entry = self.fleet.entry(ident)
        stage = entry.assigned_stage if entry is not None else 0
        trials = tuple(sorted(r.trial_id for r in view.running() if ident in r.slot.instance_ids))
        self.services.journal.record(
            J.NoticeTaken(
                id=ident,
                stage=stage,
                cloud=notice.get("cloud"),
                action=notice.get("action"),
                notice_time=notice.get("time"),
                trials=list(trials),
                reason="preemption notice: its trials stop after their next checkpoint; replacement requested now",
            )
        )
        return NoticeSeen(ident, stage, trials)
