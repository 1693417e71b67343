"""Planning as the commands use it: load-once inputs in, a timed plan out.

The planner itself is pure (no clock); this is the one place that measures how long it took, and
the one place that tells it which head instance a run pays for (:func:`billed_heads`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rubberband.inputs import JobInputs
from rubberband.plan import Plan

if TYPE_CHECKING:
    from rubberband.planner.plan_space import HeadSpec

HEAD_MODES: tuple[str, ...] = ("instance", "local")


def billed_heads(head: str = "instance", grace_s: float | None = None) -> dict[str, "HeadSpec"]:
    """The head instance a run pays for, per cloud, as the planner takes it.

    ``head="instance"`` (``rubberband run --cloud aws|gcp``'s default): each AWS/GCP run starts its
    own small CPU head (:func:`rubberband.catalog.head_type`), billed from its boot until the
    watchdog's results grace (``grace_s``, default :class:`~rubberband.cloud.bootstrap.WatchdogSettings`)
    after the job ends. ``head="local"``: the CLI machine is the head, nothing to bill. Local runs never
    have a billed head (no entry for ``local``).
    """
    if head == "local":
        return {}
    from rubberband.cloud.bootstrap import WatchdogSettings
    from rubberband.catalog import head_types
    from rubberband.planner.plan_space import HeadSpec

    grace = WatchdogSettings().done_grace_s if grace_s is None else float(grace_s)
    return {cloud: HeadSpec.of(itype, grace_s=grace) for cloud, itype in head_types().items()}


@dataclass(frozen=True)
class PlanningOptions:
    """How the planner searches, and how the run it plans will be executed (each default: the usual).

    ``samples`` Monte Carlo samples per plan and the ``seed`` (None: the spec's); ``include_exact``: also the exact
    search (branch and bound, small jobs only) for the plan's gap to it. ``head`` / ``head_grace_s``: how the run
    will be executed on AWS/GCP (:func:`billed_heads`), so the predictions include its head instance when it has
    one. ``brackets`` overrides the spec's ``scheduler.brackets``. ``spot_model``: the spot model file a
    ``resources.spot: true`` spec is planned with (None: the shipped default, fitted from the NSDI'24 "Can't Be
    Late" traces; docs/spot.md). ``fork_workers``: simulate the ASHA baseline in a forked child beside the search
    (rubberband/forked.py; the CLI's own process only), else after it in this process."""

    samples: int = 1000
    seed: int | None = None
    include_exact: bool = False
    head: str = "instance"
    head_grace_s: float | None = None
    brackets: str | None = None
    spot_model: str | None = None
    fork_workers: bool = False


def plan_from_inputs(
    inputs: JobInputs,
    *,
    deadline_s: float | None = None,
    confidence: float | None = None,
    cloud: str | None = None,
    options: PlanningOptions = PlanningOptions(),
) -> Plan:
    """Run the planner on a spec's inputs for ``deadline_s`` at ``confidence`` on ``cloud`` (each None: the
    spec's), as ``options`` says; fill in ``planner.seconds`` and ``profile_path``."""
    from rubberband.forked import beside_in_child
    from rubberband.planner import PlanOptions, SpotMarket, plan_job  # heavy imports only when planning
    from rubberband.planner.beside import in_turn

    market = None
    if inputs.spec.resources.spot:
        from rubberband.spotmodel import load_spot_model

        fitted = load_spot_model(options.spot_model)
        market = SpotMarket(
            fitted.market_model(), source=f"{options.spot_model or 'shipped default'} ({fitted.source})"
        )
    started = time.perf_counter()
    planning = PlanOptions(
        deadline_s=deadline_s,
        confidence=confidence,
        cloud=cloud,
        samples=options.samples,
        seed=options.seed,
        heads=billed_heads(options.head, options.head_grace_s),
        brackets=options.brackets,
        include_exact=options.include_exact,
        spot=market,
        beside=beside_in_child if options.fork_workers else in_turn,
    )
    plan = plan_job(inputs.spec, inputs.profile, inputs.catalog, planning)
    plan.planner.seconds = round(time.perf_counter() - started, 4)
    plan.profile_path = str(inputs.profile_path)
    return plan
