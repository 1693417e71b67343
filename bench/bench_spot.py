"""Spot under deadlines (issue 15): spot-aware plans vs on-demand and per-trial spot baselines, replayed on
held-out traces.

Traces: ``--traces`` (default ``../shared/spot-traces``, the NSDI'24 "Can't Be Late" traces, Wu et al.).
Every trace is split in time: the model is fitted on the first ``--fit-fraction`` of each trace (days
1–22 of the 45-day availability traces, 1–3.7 of the 7-day preemption traces) and the plans are
replayed on the rest, which no fit has seen (each replay sample starts at a random point of a random
held-out trace; every instance of a sample follows that trace: zone-wide correlation).

Workloads: the quickstart (examples/quickstart.yaml: SHA, 81 ResNet-50 trials, p3.2xlarge / g4dn.xlarge
/ g5.xlarge) and a Hyperband workload (the same job, Hyperband R=27, η=3, brackets in parallel).
Deadlines: 1.2×, 1.5× and 2× the shortest deadline an on-demand plan meets at the spec's confidence.

Rows per (workload, deadline):

* ``on-demand``: the best plan with ``resources.spot: false`` (no preemptions: its hit rate is the model's).
* ``spot-aware``: our plan (``resources.spot: true``, model fitted on the first part of the traces): per
  stage spot or on-demand, preemption-aware P(meet); replayed with its own SpotPolicy fall-back.
* ``all-spot naive``: the plan the old ``spot: true`` made (every stage at spot prices, preemptions
  ignored; on the one type the traces cover, p3.2xlarge), replayed restarting every preempted trial on
  spot and waiting for capacity however long it takes.
* ``UP per trial``: the same all-spot plan, each trial applying Uniform Progress on its own (the SpotPolicy
  fall-back to on-demand when its slack runs out), i.e. the NSDI'24 single-job policy per trial with no
  per-stage planning.

Columns: predicted (the planner's model) and held-out (trace replay) mean cost, held-out hit rate
P(JCT ≤ deadline), cost relative to on-demand, and the same replay on the fit period's traces (what the
model saw: separates the model's error from the held-out period being a different week). Goals: held-out hit rate ≥ p for the spot-aware plan,
and ≤ 0.5× the on-demand cost at 1.5×.

    python bench/bench_spot.py [--traces DIR] [--samples 300] [--replays 1000] [--fit-fraction 0.5] [--fit-last]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


class AlwaysSpot:
    """The naive restart: every preempted trial restarts on spot, and waits for capacity however long."""

    margin_s = 0.0

    def decide(self, situation):
        from rubberband.planner.policies import Market

        return Market.SPOT


def split(traces, fraction: float, last: bool = False):
    """(fit, held-out) copies of every trace, cut in time: the first ``fraction`` fits (``last``: the final
    ``fraction`` fits and the beginning is held out)."""
    fit, held = [], []
    for t in traces:
        cut = max(1, int(len(t.data) * (1 - fraction if last else fraction)))
        first, rest = t.data[:cut], t.data[cut:]
        fit.append(t.model_copy(update={"data": rest if last else first}))
        held.append(t.model_copy(update={"data": first if last else rest}))
    return fit, held


def with_spot(spec, spot: bool, types=None):
    res = spec.resources.model_copy(update={"spot": spot, **({"instance_types": types} if types else {})})
    return spec.model_copy(update={"resources": res})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(ROOT.parent.parent / "shared" / "spot-traces"))
    ap.add_argument("--samples", type=int, default=300, help="Monte Carlo samples per plan while planning")
    ap.add_argument("--replays", type=int, default=1000, help="held-out trace replays per plan")
    ap.add_argument("--fit-fraction", type=float, default=0.5)
    ap.add_argument("--workloads", default="quickstart,hyperband")
    ap.add_argument("--fit-last", action="store_true", help="fit on the end of each trace, replay its beginning")
    args = ap.parse_args()

    from rubberband.catalog import load_catalog
    from rubberband.errors import InfeasibleError
    from rubberband.plan import SpotInfo, SpotZoneInfo
    from rubberband.planner.api import PlanOptions, Replay, SpotMarket, plan_job, replay_plan
    from rubberband.planner.policies import SpotPolicy
    from rubberband.planner.spot import TraceScenario
    from rubberband.profile import load_profile
    from rubberband.spec import load_spec
    from rubberband.spotmodel import fit_traces, read_traces, scenario_traces

    traces_dir = Path(args.traces)
    if not traces_dir.is_dir():
        traces_dir = Path("/work/shared/spot-traces")
    all_traces = [t for t in read_traces(traces_dir) if t.cloud == "aws"]
    fit_part, held_part = split(all_traces, args.fit_fraction, args.fit_last)
    which = f"{'last' if args.fit_last else 'first'} {args.fit_fraction:.0%}"
    fitted = fit_traces(fit_part, source=f"{traces_dir} ({which} of each trace)")
    market = fitted.market_model()
    catalog = load_catalog(["aws"])
    base = load_spec(EXAMPLES / "quickstart.yaml")
    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    workloads = {
        "quickstart": base,
        "hyperband": base.model_copy(
            update={
                "scheduler": base.scheduler.model_copy(
                    update={"kind": "hyperband", "trials": None, "min_epochs": 1, "max_epochs": 27, "eta": 3}
                )
            }
        ),
    }

    def scenarios(plan, traces):
        out = {}
        for s in plan.stages:
            key = (s.cloud, s.region, s.instance_type)
            if s.spot and key not in out:
                pre, avail = scenario_traces(traces, s.cloud, s.instance_type, s.region, s.zone)
                out[key] = TraceScenario(pre, avail, seed=1, samples=args.replays)
        return out

    def replay(plan, policy=None):
        """(held-out mean cost, held-out hit rate, fit-period hit rate)."""
        held = replay_plan(
            plan,
            profile,
            catalog,
            samples=args.replays,
            replay=Replay(seed=1, spot_scenarios=scenarios(plan, held_part), spot_policy=policy),
        )
        seen = replay_plan(
            plan,
            profile,
            catalog,
            samples=args.replays,
            replay=Replay(seed=1, spot_scenarios=scenarios(plan, fit_part), spot_policy=policy),
        )
        return held.cost_mean, held.p_meet(plan.deadline_s), seen.cost_mean, seen.p_meet(plan.deadline_s)

    rows = []
    started = time.perf_counter()
    for name in args.workloads.split(","):
        spec = workloads[name]
        conf = spec.confidence
        try:
            plan_job(
                with_spot(spec, False), profile, catalog, PlanOptions(deadline_s=60.0, samples=args.samples, asha=False)
            )
            raise SystemExit("a 60 s deadline was feasible?")
        except InfeasibleError as exc:
            shortest = exc.shortest_jct_s
        for factor in (1.2, 1.5, 2.0):
            deadline = shortest * factor
            od = plan_job(
                with_spot(spec, False),
                profile,
                catalog,
                PlanOptions(deadline_s=deadline, samples=args.samples, asha=False),
            )
            od_cost = od.predicted.cost_usd.mean
            od_hit = od.predicted.p_meet_deadline
            rows.append(
                (name, factor, deadline, "on-demand", od_cost, od_cost, od_hit, od_cost, od_hit, conf, _stages(od))
            )
            aware = plan_job(
                with_spot(spec, True),
                profile,
                catalog,
                PlanOptions(
                    deadline_s=deadline, samples=args.samples, asha=False, spot=SpotMarket(market, source=fitted.source)
                ),
            )
            rows.append(
                (
                    name,
                    factor,
                    deadline,
                    "spot-aware",
                    aware.predicted.cost_usd.mean,
                    *replay(aware),
                    conf,
                    _stages(aware),
                )
            )
            try:
                legacy = plan_job(
                    with_spot(spec, True, ["p3.2xlarge"]),
                    profile,
                    catalog,
                    PlanOptions(deadline_s=deadline, samples=args.samples, asha=False),
                )
            except InfeasibleError:
                rows.append((name, factor, deadline, "all-spot naive", *[float("nan")] * 5, conf, "—"))
                continue
            zone = market.best_zone("aws", legacy.stages[0].region, "p3.2xlarge")
            info = SpotInfo(
                model_source="bench",
                zones=[
                    SpotZoneInfo(
                        cloud=zone.cloud,
                        instance_type=zone.instance_type,
                        region=zone.region,
                        zone=zone.zone,
                        preemption_rate_per_h=zone.preemption_rate_per_h,
                        p_unavailable=zone.p_unavailable,
                        unavailable_s=list(zone.unavailable_s),
                    )
                ],
            )
            spotted = legacy.model_copy(
                update={
                    "spot": info,
                    "stages": [s.model_copy(update={"spot": True, "zone": zone.zone}) for s in legacy.stages],
                }
            )
            for label, policy in (("all-spot naive", AlwaysSpot()), ("UP per trial", SpotPolicy())):
                rows.append(
                    (
                        name,
                        factor,
                        deadline,
                        label,
                        legacy.predicted.cost_usd.mean,
                        *replay(spotted, policy),
                        conf,
                        _stages(spotted),
                    )
                )
    elapsed = time.perf_counter() - started

    print(
        f"Spot bench: model fitted on the {which} of each AWS trace in {traces_dir}, "
        f"replayed {args.replays}× on the rest; planning with {args.samples} samples; {elapsed:.0f} s"
    )
    print(
        "zones used:",
        ", ".join(
            f"{z.instance_type} {z.zone} ({z.preemption_rate_per_h:.2f}/h, P(no capacity) {z.p_unavailable:.0%})"
            for z in fitted.zones
            if z.zone.endswith("*")
        ),
    )
    header = (
        f"{'workload':<11}{'deadline':>14}  {'plan':<15}{'pred $':>8}{'held-out $':>11}{'× OD':>7}"
        f"{'hit':>8}{'fit-period $':>13}{'hit':>8}{'p':>6}  stages"
    )
    print(header)
    print("-" * len(header))
    od_costs = {}
    for name, factor, deadline, label, pred, cost, hit, seen_cost, seen_hit, conf, stages in rows:
        if label == "on-demand":
            od_costs[(name, factor)] = cost
        ratio = cost / od_costs[(name, factor)] if od_costs.get((name, factor)) else float("nan")
        mark = "" if label == "on-demand" or hit >= conf else " <p"
        print(
            f"{name:<11}{factor:>5.1f}× {deadline / 60:5.1f}m  {label:<15}{pred:>8.2f}{cost:>11.2f}{ratio:>7.2f}"
            f"{hit:>8.1%}{seen_cost:>13.2f}{seen_hit:>8.1%}{conf:>6.2f}  {stages}{mark}"
        )
    for name, factor, _, label, _, cost, hit, _, _, conf, _ in rows:
        if label == "spot-aware" and factor == 1.5:
            print(
                f"goal at 1.5× ({name}): spot-aware / on-demand = {cost / od_costs[(name, factor)]:.2f} "
                f"(target ≤ 0.50); held-out hit rate {hit:.1%} (target ≥ {conf:.0%})"
            )
    return 0


def _stages(plan) -> str:
    """Compact per-stage shape: count × type and market, e.g. ``9p3s 9p3s 3g5``."""
    short = {"p3.2xlarge": "p3", "g4dn.xlarge": "g4dn", "g5.xlarge": "g5"}
    return " ".join(
        f"{s.instances}{short.get(s.instance_type, s.instance_type)}{'s' if s.spot else ''}" for s in plan.stages
    )


if __name__ == "__main__":
    sys.exit(main())
