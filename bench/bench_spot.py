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

Prices are zone-true: a spot stage pays each zone its requests try (in the executor's order) its own spot price,
weighted by how often capacity was found first there — in the period replayed (the held-out cost is weighted by
the held-out traces, the fit-period cost by the fitted ones); the plans were made with the fitted weights.
Both fit directions by default (``--direction first|last`` for one), each as a table, then the held-out cost
ratios of both side by side.

    python bench/bench_spot.py [--traces DIR] [--samples 300] [--replays 1000] [--fit-fraction 0.5]
                               [--direction both|first|last]
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
    ap.add_argument(
        "--direction",
        choices=("both", "first", "last"),
        default="both",
        help="fit on the first part of each trace and replay the rest (first), the other way round (last), or both",
    )
    ap.add_argument("--fit-last", action="store_true", help="same as --direction last")
    args = ap.parse_args()

    from rubberband.spotmodel import read_traces

    traces_dir = Path(args.traces)
    if not traces_dir.is_dir():
        traces_dir = Path("/work/shared/spot-traces")
    all_traces = [t for t in read_traces(traces_dir) if t.cloud == "aws"]
    direction = "last" if args.fit_last else args.direction
    lasts = {"both": (False, True), "first": (False,), "last": (True,)}[direction]
    summary = {}
    for last in lasts:
        rows = run(args, traces_dir, all_traces, last)
        summary[last] = rows
    print()
    print("Held-out cost / the on-demand plan's (hit rate), zone-true spot prices:")
    print_ratio_table(summary, args.fit_fraction)
    return 0


class Direction:
    """One fit direction: the model fitted on one part of each trace, the plans replayed on the other part (and on
    the fitted part), spot paid at zone-true prices."""

    def __init__(self, args, traces_dir: Path, all_traces, last: bool) -> None:
        from rubberband.catalog import load_catalog
        from rubberband.profile import load_profile
        from rubberband.spotmodel import fit_traces

        self.args = args
        self.fit_part, self.held_part = split(all_traces, args.fit_fraction, last)
        self.which = f"{'last' if last else 'first'} {args.fit_fraction:.0%}"
        self.fitted = fit_traces(self.fit_part, source=f"{traces_dir} ({self.which} of each trace)")
        self.market = self.fitted.market_model()
        self.held_market = fit_traces(self.held_part, source="held out").market_model()
        self.catalog = load_catalog(["aws"])
        self.profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")

    def tried(self, itype, model) -> tuple[list, float, float]:
        """The zones a spot request of ``itype`` tries, weighted as ``model`` finds capacity there: (tried, $/h,
        P(none of them))."""
        from rubberband.plan import TriedZone
        from rubberband.planner.spotzones import spot_offer

        offer = spot_offer(model, itype)
        assert offer is not None, itype.key
        zones = [TriedZone(zone=z.zone, price_hr=z.price_hr, p_first=round(z.p_first, 6)) for z in offer.zones]
        return zones, round(offer.price_hr, 6), offer.model.p_unavailable

    def priced(self, plan, model):
        """``plan`` with each spot type's zones weighted as ``model`` (the period replayed) finds capacity: the
        replayed cost pays each zone's own price as often as that period found capacity there first."""
        if plan.spot is None:
            return plan
        zones = []
        for z in plan.spot.zones:
            t, price, _ = self.tried(self.catalog.find(z.instance_type, cloud=z.cloud, region=z.region), model)
            zones.append(z.model_copy(update={"tried": t, "price_hr": price}))
        return plan.model_copy(update={"spot": plan.spot.model_copy(update={"zones": zones})})

    def scenarios(self, plan, traces):
        """Per spot type, its traces: the model entry's (REGION*: the region's zones together); a prior's, the
        region's traced types' (what the prior was pooled from)."""
        from rubberband.planner.spot import TraceScenario
        from rubberband.spotmodel import any_zone, scenario_traces

        out = {}
        for s in plan.stages:
            key = (s.cloud, s.region, s.instance_type)
            entry = plan.spot_entry(s)
            if entry is None or key in out:
                continue
            itype, zone = s.instance_type, entry.zone
            if entry.prior:
                itype = sorted({t.instance_type for t in traces if (t.cloud, t.region) == (s.cloud, s.region)})[0]
                zone = any_zone(s.region)
            pre, avail = scenario_traces(traces, s.cloud, itype, s.region, zone)
            out[key] = TraceScenario(pre, avail, seed=1, samples=self.args.replays)
        return out

    def replay(self, plan, policy=None) -> tuple[float, float, float, float]:
        """(held-out mean cost, held-out hit rate, fit-period mean cost, fit-period hit rate)."""
        from rubberband.planner.replay import Replay, replay_plan

        out = []
        for model, traces in ((self.held_market, self.held_part), (self.market, self.fit_part)):
            result = replay_plan(
                self.priced(plan, model),
                self.profile,
                self.catalog,
                samples=self.args.replays,
                replay=Replay(seed=1, spot_scenarios=self.scenarios(plan, traces), spot_policy=policy),
            )
            out += [result.cost_mean, result.p_meet(plan.deadline_s)]
        return out[0], out[1], out[2], out[3]

    def spotted(self, legacy):
        """The old all-spot plan (every stage on p3.2xlarge at spot prices) with the fitted model of its region and
        the zones its requests try, to replay with a per-trial policy."""
        from rubberband.plan import SpotInfo, SpotZoneInfo

        region = legacy.stages[0].region
        zone = self.market.best_zone("aws", region, "p3.2xlarge")
        zones, price, none = self.tried(self.catalog.find("p3.2xlarge", cloud="aws", region=region), self.market)
        info = SpotInfo(
            model_source="bench",
            zones=[
                SpotZoneInfo(
                    cloud=zone.cloud,
                    instance_type=zone.instance_type,
                    region=zone.region,
                    zone=zone.zone,
                    preemption_rate_per_h=zone.preemption_rate_per_h,
                    p_unavailable=none,
                    unavailable_s=list(zone.unavailable_s),
                    tried=zones,
                    price_hr=price,
                )
            ],
        )
        stages = [
            s.model_copy(update={"spot": True, "zone": zones[0].zone, "spot_price_hr": price}) for s in legacy.stages
        ]
        return legacy.model_copy(update={"spot": info, "stages": stages})

    def plans(self, name: str, spec, factor: float, deadline: float) -> list[tuple]:
        """The rows of one (workload, deadline): on-demand, spot-aware, and the all-spot plan replayed two ways."""
        from rubberband.errors import InfeasibleError
        from rubberband.planner.job import PlanOptions, SpotMarket, plan_job
        from rubberband.planner.policies import SpotPolicy

        conf, samples = spec.confidence, self.args.samples
        od = plan_job(
            with_spot(spec, False),
            self.profile,
            self.catalog,
            PlanOptions(deadline_s=deadline, samples=samples, asha=False),
        )
        od_cost, od_hit = od.predicted.cost_usd.mean, od.predicted.p_meet_deadline
        rows = [(name, factor, deadline, "on-demand", od_cost, od_cost, od_hit, od_cost, od_hit, conf, _stages(od))]
        market = SpotMarket(self.market, source=self.fitted.source)
        options = PlanOptions(deadline_s=deadline, samples=samples, asha=False, spot=market)
        aware = plan_job(with_spot(spec, True), self.profile, self.catalog, options)
        pred = aware.predicted.cost_usd.mean
        rows.append((name, factor, deadline, "spot-aware", pred, *self.replay(aware), conf, _stages(aware)))
        try:
            legacy = plan_job(
                with_spot(spec, True, ["p3.2xlarge"]),
                self.profile,
                self.catalog,
                PlanOptions(deadline_s=deadline, samples=samples, asha=False),
            )
        except InfeasibleError:
            return [*rows, (name, factor, deadline, "all-spot naive", *[float("nan")] * 5, conf, "—")]
        spotted = self.spotted(legacy)
        for label, policy in (("all-spot naive", AlwaysSpot()), ("UP per trial", SpotPolicy())):
            pred = legacy.predicted.cost_usd.mean
            rows.append((name, factor, deadline, label, pred, *self.replay(spotted, policy), conf, _stages(spotted)))
        return rows


def run(args, traces_dir: Path, all_traces, last: bool) -> list[tuple]:
    """One fit direction: plan on the fitted part of each trace, replay on the rest; prints its table, returns its
    rows."""
    from rubberband.errors import InfeasibleError
    from rubberband.planner.job import PlanOptions, plan_job
    from rubberband.spec import load_spec

    bench = Direction(args, traces_dir, all_traces, last)
    base = load_spec(EXAMPLES / "quickstart.yaml")
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
    rows = []
    started = time.perf_counter()
    for name in args.workloads.split(","):
        spec = workloads[name]
        try:
            plan_job(
                with_spot(spec, False),
                bench.profile,
                bench.catalog,
                PlanOptions(deadline_s=60.0, samples=args.samples, asha=False),
            )
            raise SystemExit("a 60 s deadline was feasible?")
        except InfeasibleError as exc:
            shortest = exc.shortest_jct_s
        for factor in (1.2, 1.5, 2.0):
            rows += bench.plans(name, spec, factor, shortest * factor)
    print_direction(bench, traces_dir, rows, time.perf_counter() - started)
    return rows


def print_direction(bench: Direction, traces_dir: Path, rows: list[tuple], elapsed: float) -> None:
    """One direction's table: its fitted regions, the zones p3.2xlarge's requests try and their weights in either
    period, and per (workload, deadline, plan) the predicted and replayed costs and hit rates."""
    args = bench.args
    print(
        f"Spot bench: model fitted on the {bench.which} of each AWS trace in {traces_dir}, "
        f"replayed {args.replays}× on the rest; planning with {args.samples} samples; {elapsed:.0f} s"
    )
    print(
        "regions fitted:",
        ", ".join(
            f"{z.instance_type} {z.zone} ({z.preemption_rate_per_h:.2f}/h, P(none of 1…{len(z.p_none_of)} zones) "
            + "/".join(f"{q:.0%}" for q in z.p_none_of)
            + ")"
            for z in bench.fitted.zones
            if z.zone.endswith("*")
        ),
    )
    p3 = bench.catalog.find("p3.2xlarge", cloud="aws", region="us-east-1")
    for label, model in (("fit period", bench.market), ("held out", bench.held_market)):
        zones, price, _ = bench.tried(p3, model)
        print(
            f"p3.2xlarge us-east-1 spot, zones tried ({label}): "
            + ", ".join(f"{z.zone} ${z.price_hr:.4f} ({z.p_first:.0%})" for z in zones)
            + f"; expected ${price:.4f}/h (the cheapest zone: ${p3.spot_price_hr:.4f}/h)"
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
    print()


def print_ratio_table(summary: dict[bool, list[tuple]], fraction: float) -> None:
    """Per plan (rows) and fit direction, the held-out cost over the on-demand plan's at each (workload, deadline)
    (columns), with the held-out hit rate."""
    columns = sorted({(r[0], r[1]) for rows in summary.values() for r in rows}, key=lambda c: (c[0] != "quickstart", c))
    head = f"{'plan':<15}{'fitted on':<12}" + "".join(f"{w[:10] + f' {f:.1f}×':>18}" for w, f in columns)
    print(head)
    print("-" * len(head))
    for label in ("spot-aware", "all-spot naive", "UP per trial"):
        for last, rows in summary.items():
            od = {(r[0], r[1]): r[5] for r in rows if r[3] == "on-demand"}
            mine = {(r[0], r[1]): r for r in rows if r[3] == label}
            cells = []
            for c in columns:
                r = mine.get(c)
                cells.append(f"{'—':>18}" if r is None or r[5] != r[5] else f"{r[5] / od[c]:>8.2f}× ({r[6]:>6.1%})")
            fitted = f"{'last' if last else 'first'} {fraction:.0%}"
            print(f"{label:<15}{fitted:<12}" + "".join(cells))


def _stages(plan) -> str:
    """Compact per-stage shape: count × type and market, e.g. ``9p3s 9p3s 3g5``."""
    short = {"p3.2xlarge": "p3", "g4dn.xlarge": "g4dn", "g5.xlarge": "g5"}
    return " ".join(
        f"{s.instances}{short.get(s.instance_type, s.instance_type)}{'s' if s.spot else ''}" for s in plan.stages
    )


if __name__ == "__main__":
    sys.exit(main())
