"""Hyperband brackets as parallel branches of one DAG, sharing instances.

Hyperband's brackets are independent successive-halving runs: nothing forces one to wait for
another. :class:`ParallelSimulator` plays a Hyperband plan with every bracket running at once
(bracket ``b`` starting ``offsets[b]`` seconds after the job starts; bracket 0 at 0), each
bracket on its own instances as :class:`~rubberband.planner.simulator.Simulator` plays one SHA
run (slots, waves, barriers, carry-over, ahead-of-time requests, early release: all per bracket).
The job ends when its last bracket ends: ``JCT = max_b(offset_b + JCT_b)``.

**Hand-overs.** Instances move between brackets: an instance one bracket releases (it is not
carried to that bracket's next stage) is handed to another bracket that requested an instance of
the same type, instead of being terminated while a new one boots. A released instance ``d``
(released at ``D``) can serve a request ``q`` (requested at ``Q``, its new instance up at ``R``)
of another bracket when ``Q − tail < D ≤ R`` (``tail``: the type's termination latency): it is
free before the new instance would be up, and keeping it costs less than the new instance's
bill from ``Q`` plus the released one's termination tail. The hand-over saves
``price × (D − Q + tail)`` per sample; the receiving stage keeps its simulated timing (the
handed-over instance idles from ``D`` to ``R``), so JCTs are never optimistic. Requests are served
in order of ``R`` by the latest-released free instance. The rule is applied per sample, i.e. it
knows each sample's release times: exact when releases come in the predicted order.

Hand-overs are matched in full evaluations only: the planner's screening (a prefix of the
samples, :class:`~rubberband.planner.search.Evaluator`) ranks candidates without them, which keeps
screening cheap; every plan the planner takes is confirmed with all samples, hand-overs included.

**One provisioner.** On a cloud that starts instances one after another (the local backend) the
executor's single provisioner serves every bracket's requests first come first served, so brackets
starting together come up one after another (the one predicted to end last first) and a bracket's
request waits for the start-ups submitted before it: :mod:`~rubberband.planner.provisioning`, played
to a fixed point in :meth:`ParallelSimulator._all`.

Random streams are keyed by bracket (bracket ``b`` uses seed ``seed + 7919·b``), so a change to
one bracket's configuration re-simulates only that bracket (each bracket's sub-simulator keeps its
own prefix cache). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Sequence

import networkx as nx
import numpy as np

from rubberband.catalog import SERIAL_PROVISIONING, BillingRule, InstanceType
from rubberband.plan import Timeline, TimelineInstance, TimelineTask
from rubberband.planner.bracket_ranges import bracket_ranges
from rubberband.planner.model import PerformanceModel
from rubberband.planner.policies import bracket_start_order
from rubberband.planner.provisioning import ProvisionQueue, fifo_starts
from rubberband.planner.schedule import Stage
from rubberband.planner.plan_space import HeadSpec, StageConfig, normalise, plan_key, prepare_plan
from rubberband.planner.simulator import (
    CATEGORIES,
    ReadsSettings,
    RunningState,
    SimResult,
    SimSettings,
    Simulator,
    WORKER_CATEGORIES,
    sum_samples,
)

BRACKET_MODES = ("parallel", "sequential")
#: Seed stride between brackets' random streams.
BRACKET_SEED_STRIDE = 7919


@dataclass(frozen=True)
class Remainder:
    """What is left to plan of a parallel-bracket run at one bracket's stage boundary.

    ``positions``: plan positions of the stages not started yet, bracket by bracket (each bracket's in
    order), the bracket at its boundary first; ``offsets_s``: per bracket of ``positions``, when its next
    stage can start, in seconds from now (0 for the first): re-planned with ``plan_stages(...,
    SearchOptions(brackets=BracketSetup(offsets=offsets_s)))``, the JCT of the remainder is ``max_b(offset_b +
    JCT_b)`` from now.
    """

    positions: tuple[int, ...]
    offsets_s: tuple[float, ...]


def parallel_remainder(parts: Sequence[tuple[Sequence[int], float]], boundary: int) -> Remainder:
    """The :class:`Remainder` of a parallel run from each bracket's part.

    ``parts``: per bracket, (plan positions of its stages not started yet, seconds from now until the
    next of them can start: a running bracket's current stage's remaining time, a bracket not started
    yet its start offset minus the time elapsed, the bracket at its boundary 0); ``boundary``: the
    index in ``parts`` of the bracket at its boundary. Brackets with nothing left drop out (a bracket
    in its last stage: nothing of it can be re-planned); the boundary's bracket goes first (it starts
    now, on the instances already running), the others by their start, earliest first.
    """
    if not parts[boundary][0]:
        raise ValueError("the bracket at its boundary must have a stage to start")
    order = sorted(
        (b for b, (positions, _) in enumerate(parts) if positions),
        key=lambda b: (b != boundary, max(0.0, parts[b][1]), b),
    )
    positions = tuple(g for b in order for g in parts[b][0])
    offsets = tuple(0.0 if b == boundary else max(0.0, float(parts[b][1])) for b in order)
    return Remainder(positions, offsets)


@dataclass(frozen=True)
class Handoff:
    """One instance moved from a stage of one bracket to a stage of another (representative sample)."""

    instance_type: str
    from_stage: int  # positions in the plan's stages
    to_stage: int
    at_s: float  # when the giving bracket released it
    instance_id: str = ""


@dataclass
class _BracketRun:
    """One bracket's simulated outcome (samples ``n``) with its instances' request/ready/release times."""

    result: SimResult
    # per type key: donors (release times, stage position) and requests (request, ready, stage position)
    donors: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    requests: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = field(default_factory=dict)
    queue: ProvisionQueue | None = None  # the provisioning queue it was simulated with (serial clouds)
    # per stage: (submitted, busy) of its new instances on a serial-provisioning cloud, else None
    provision: list | None = None

    @cached_property
    def worker_costs(self) -> np.ndarray:
        """The result's worker cost categories (:data:`WORKER_CATEGORIES`, rows) per sample, stacked once: a plan's
        brackets are combined by adding these (a run is combined into many plans while the search screens)."""
        return np.stack([self.result.breakdown[k] for k in WORKER_CATEGORIES])


@dataclass(frozen=True)
class BracketSetup:
    """How :class:`ParallelSimulator` runs Hyperband's brackets side by side.

    ``offsets`` (s): when each bracket starts after the job (bracket 0 at 0; None: all at once). ``states``:
    the instances each bracket's first stage finds running (re-planning a parallel run's remainder mid-run: every
    bracket's next stage may keep its instances; None: the simulation's ``start_state`` for the first bracket, a
    fresh start for the others). ``share``: instances one bracket releases are handed to another's requests."""

    offsets: Sequence[float] | None = None
    states: Sequence[RunningState | None] | None = None
    share: bool = True


class ParallelSimulator(ReadsSettings):
    """Simulates Hyperband plans with every bracket running at once (see the module docstring).

    Offers the parts of :class:`Simulator`'s interface the planner uses (``simulate``,
    ``head_for``, ``head_cost``, ``min_factor``, ``trace``, ``stages``, ``samples``, ...).
    """

    parallel = True
    #: Most bracket runs cached (the least recently used go first).
    CACHE_SIZE = 2048

    def __init__(
        self,
        stages: Sequence[Stage],
        model: PerformanceModel,
        settings: SimSettings | None = None,
        brackets: BracketSetup | None = None,
    ) -> None:
        self._setup(stages, model, settings or SimSettings(), brackets or BracketSetup())
        # each bracket's own simulator: its stages, its random streams, its start state; no head (the job's)
        self.subs = [
            Simulator(
                self.stages[lo:hi],
                model,
                replace(
                    self.settings,
                    seed=self.seed + BRACKET_SEED_STRIDE * b,
                    population_seed=self.population_seed,
                    start_state=self.bracket_states[b],
                    heads=None,
                ),
            )
            for b, (lo, hi) in enumerate(self.ranges)
        ]
        self._runs: OrderedDict = OrderedDict()

    def _setup(
        self, stages: Sequence[Stage], model: PerformanceModel, settings: SimSettings, brackets: BracketSetup
    ) -> None:
        """Everything but the brackets' simulators and their run cache (which :meth:`with_offsets` shares)."""
        self.stages = list(stages)
        self.model = model
        self.settings = settings
        self.brackets = brackets
        self.share = brackets.share
        # spot fall-back decisions aim at the job's deadline in every bracket (each bracket's clock starts
        # at its offset, so a later bracket's decisions are slightly optimistic; docs/spot.md)
        self.ranges = bracket_ranges(self.stages)
        self.offsets = tuple(float(o) for o in (brackets.offsets or [0.0] * len(self.ranges)))
        if len(self.offsets) != len(self.ranges) or self.offsets[0] != 0.0 or min(self.offsets) < 0:
            raise ValueError("one offset ≥ 0 per bracket is required, and bracket 0 starts at 0")
        # each bracket's instances already running; by default only the first bracket's
        states = (
            list(brackets.states)
            if brackets.states is not None
            else ([settings.start_state] + [None] * (len(self.ranges) - 1))
        )
        if len(states) != len(self.ranges):
            raise ValueError("one start state (or None) per bracket is required")
        self.bracket_states = tuple(states)
        # the whole job's simulator: heads, billing rules and bounds (never used to simulate a plan)
        self.main = Simulator(self.stages, model, settings)
        self.evaluations = 0

    def with_offsets(self, offsets: Sequence[float]) -> "ParallelSimulator":
        """The same job with other bracket start offsets (shares the brackets' simulations)."""
        other = ParallelSimulator.__new__(ParallelSimulator)
        other._setup(self.stages, self.model, self.settings, replace(self.brackets, offsets=offsets))
        other.subs, other._runs = self.subs, self._runs
        return other

    # -- Simulator's interface ------------------------------------------------------------------
    def head_for(self, configs: Sequence[StageConfig]) -> HeadSpec | None:
        return self.main.head_for(configs)

    def head_cost(self, configs: Sequence[StageConfig], jct: np.ndarray) -> np.ndarray:
        return self.main.head_cost(configs, jct)

    def min_factor(self) -> float:
        return self.main.min_factor()

    def rule(self, cloud: str) -> BillingRule:
        return self.main.rule(cloud)

    def termination_s(self, itype: InstanceType) -> float:
        return self.main.termination_s(itype)

    def price_hr(self, itype: InstanceType, market: str | None = None) -> float:
        return self.main.price_hr(itype, market)

    def prefix_bounds(self, configs: Sequence[StageConfig]) -> tuple[float, np.ndarray]:
        raise NotImplementedError("the exact optimum is searched for sequential brackets only")

    def simulate(self, configs: Sequence[StageConfig], samples: int | None = None) -> SimResult:
        """Simulate a full plan (one StageConfig per stage) with the first ``samples`` samples."""
        configs, n = prepare_plan(self.stages, configs, samples, self.samples)
        self.evaluations += 1
        return self._combine(configs, self._all(configs, n), n)

    def bracket_results(self, configs: Sequence[StageConfig]) -> list[SimResult]:
        """Each bracket's own result (all samples), JCTs from its own start."""
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        return [r.result for r in self._all(configs, self.samples)]

    def start_order(self, configs: Sequence[StageConfig]) -> list[int]:
        """The order in which brackets starting together request their instances (the executor's
        :func:`~rubberband.planner.policies.bracket_start_order`, from each bracket's offset plus its
        stages' median durations without the shared provisioning queue)."""
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        return self._order([self._bracket(b, configs, self.samples) for b in range(len(self.ranges))])

    # -- internals ------------------------------------------------------------------------------
    def _order(self, runs: list[_BracketRun]) -> list[int]:
        return bracket_start_order(
            {
                b: self.offsets[b] + sum(float(np.median(d)) for d in r.result.stage_durations)
                for b, r in enumerate(runs)
            }
        )

    def _all(self, configs: tuple[StageConfig, ...], n: int) -> list[_BracketRun]:
        """Every bracket's run. On a serial-provisioning cloud (the local backend) the brackets share the
        executor's one provisioner: each stage's new instances wait for the requests submitted before
        theirs (:func:`~rubberband.planner.provisioning.fifo_starts`; brackets starting together in
        :meth:`start_order`). A wait delays the bracket's later requests, so the queue is played to a fixed
        point: round ``j`` gets the first ``j`` batches in queue order right, so at most one round per batch."""
        keys = plan_key(configs)  # sliced per bracket for the run cache (built once per plan)
        runs = [self._bracket(b, configs, n, keys=keys) for b in range(len(self.ranges))]
        if not any(c.instance_type.cloud in SERIAL_PROVISIONING for c in configs):
            return runs
        rank = {b: i for i, b in enumerate(self._order(runs))}
        width = max(hi - lo for lo, hi in self.ranges) + 1
        queues: list[ProvisionQueue | None] = [None] * len(self.ranges)
        for _ in range(len(configs) + 1):
            batches = [(b, k, *p) for b, r in enumerate(runs) for k, p in enumerate(r.provision or []) if p is not None]
            if len(batches) < 2:
                break
            starts = fifo_starts(
                np.stack([self.offsets[b] + sub for b, _, sub, _ in batches], axis=1),
                np.stack([busy for _, _, _, busy in batches], axis=1),
                [rank[b] * width + k for b, k, _, _ in batches],
            )
            free: list[list] = [[None] * (hi - lo) for lo, hi in self.ranges]
            for j, (b, k, sub, _) in enumerate(batches):
                own = starts[:, j] - self.offsets[b]
                waits = own > sub + 1e-9
                if waits.any():  # a wait in some sample (else the stage is as simulated alone)
                    free[b][k] = np.where(waits, own, -np.inf)
            new = [None if all(f is None for f in fb) else ProvisionQueue(tuple(fb)) for fb in free]
            if all(ProvisionQueue.same(a, q) for a, q in zip(new, queues)):
                break
            queues = new
            runs = [self._bracket(b, configs, n, q, keys=keys) for b, q in enumerate(queues)]
        return runs

    def _bracket(
        self,
        b: int,
        configs: tuple[StageConfig, ...],
        n: int,
        queue: ProvisionQueue | None = None,
        keys: tuple | None = None,
    ) -> _BracketRun:
        lo, hi = self.ranges[b]
        sub_configs = configs[lo:hi]
        key: tuple = (b, n, plan_key(sub_configs) if keys is None else keys[lo:hi])
        if queue is not None:
            key += (queue.digest(hi - lo),)
        hit = self._runs.get(key)
        if hit is not None:
            self._runs.move_to_end(key)
            return hit
        sub = self.subs[b]
        result = sub.simulate(sub_configs, n, queue=queue)
        run = _BracketRun(result, queue=queue)
        if any(c.instance_type.cloud in SERIAL_PROVISIONING for c in sub_configs):
            tails = sub._tails(sub_configs)
            run.provision = [
                sub._prefix(sub_configs, k + 1, n, tails, queue).open.provision for k in range(len(sub_configs))
            ]
        if self.share and len(self.ranges) > 1 and n == self.samples:
            self._instances(b, sub, sub_configs, n, run)
        self._runs[key] = run
        while len(self._runs) > self.CACHE_SIZE:
            self._runs.popitem(last=False)
        return run

    def _instances(self, b: int, sub: Simulator, configs: tuple[StageConfig, ...], n: int, run: _BracketRun) -> None:
        """Record the bracket's new requests and final releases per instance type (own-start times)."""
        lo = self.ranges[b][0]
        tails = sub._tails(configs)
        records = [sub._prefix(configs, k + 1, n, tails, run.queue).open for k in range(len(configs))]
        for k, (config, rec) in enumerate(zip(configs, records)):
            if config.spot:
                continue  # spot instances are not handed over (their market's own preemptions and prices)
            tkey = config.instance_type.key
            prev = configs[k - 1] if k > 0 else None
            carry_in = (
                min(prev.instances, config.instances)
                if prev is not None and prev.instance_type.key == tkey and prev.market == config.market
                else 0
            )
            state = sub.start_state
            if k == 0 and state is not None and state.instance_type_key == tkey:
                carry_in = min(state.instances, config.instances)  # running already: not a request
            # bracket 0's first stage starts the job: nothing can be handed to it (keeps cost bounds rigorous)
            if not (k == 0 and b == 0) and carry_in < config.instances and rec.ready is not None:
                run.requests.setdefault(tkey, []).append(
                    (rec.request[:, carry_in:], rec.ready[:, carry_in:], np.full(config.instances - carry_in, lo + k))
                )
            nxt = configs[k + 1] if k + 1 < len(configs) else None
            carry_out = (
                min(nxt.instances, config.instances)
                if nxt is not None and nxt.instance_type.key == tkey and nxt.market == config.market
                else 0
            )
            released = config.instances - carry_out
            if released > 0:
                # the instances carried on are those that free last (the simulator's rule)
                rel = np.sort(rec.release, axis=1)[:, :released]
                run.donors.setdefault(tkey, []).append((rel, np.full(released, lo + k)))

    def _combine(self, configs: tuple[StageConfig, ...], runs: list[_BracketRun], n: int) -> SimResult:
        jct = np.max([o + r.result.jct for o, r in zip(self.offsets, runs)], axis=0)
        stage_durations = [d for r in runs for d in r.result.stage_durations]
        stage_costs = [c for r in runs for c in r.result.stage_costs]  # replaced, never modified in place
        breakdown = dict(zip(WORKER_CATEGORIES, sum_samples(r.worker_costs for r in runs)))
        by_type: dict[str, np.ndarray] = {}
        for r in runs:
            for k, v in r.result.by_type.items():
                by_type[k] = v + by_type.get(k, 0.0)
        if self.share and len(runs) > 1 and n == self.samples:
            for tkey, saved, startup, idle, per_stage in self._handoffs(configs, runs, n):
                name = next(c.instance_type.name for c in configs if c.instance_type.key == tkey)
                by_type[name] = by_type[name] - saved
                breakdown["startup"] = breakdown["startup"] - startup
                breakdown["idle"] = breakdown["idle"] + idle
                for stage, amount in per_stage.items():
                    stage_costs[stage] = stage_costs[stage] - amount
        breakdown["head"] = self.head_cost(configs, jct)
        head = self.head_for(configs)
        if head is not None:
            by_type[head.instance_type] = by_type.get(head.instance_type, 0.0) + breakdown["head"]
        cost = sum_samples(breakdown[k] for k in CATEGORIES)
        events: dict = {}
        for r in runs:
            for k, v in r.result.spot_events.items():
                events[k] = events.get(k, 0.0) + v
        return SimResult(
            configs=configs,
            jct=jct,
            cost=cost,
            stage_durations=stage_durations,
            stage_costs=stage_costs,
            breakdown=breakdown,
            by_type=by_type,
            samples=n,
            spot_events=events,
        )

    def _matching(self, configs, runs, rows: slice):
        """Per type: the matched hand-overs (vectorised over samples ``rows``)."""
        out = []
        for tkey in sorted({k for r in runs for k in r.requests}):
            donors = [
                (o + rel[rows], st, b)
                for b, (o, r) in enumerate(zip(self.offsets, runs))
                for rel, st in r.donors.get(tkey, [])
            ]
            requests = [
                (o + q[rows], o + rd[rows], st, b)
                for b, (o, r) in enumerate(zip(self.offsets, runs))
                for q, rd, st in r.requests.get(tkey, [])
            ]
            if not donors or not requests:
                continue
            D = np.concatenate([d[0] for d in donors], axis=1)
            d_stage = np.concatenate([d[1] for d in donors])
            d_bracket = np.concatenate([np.full(len(d[1]), d[2]) for d in donors])
            Q = np.concatenate([q[0] for q in requests], axis=1)
            R = np.concatenate([q[1] for q in requests], axis=1)
            q_stage = np.concatenate([q[2] for q in requests])
            q_bracket = np.concatenate([np.full(len(q[2]), q[3]) for q in requests])
            itype = next(c.instance_type for c in configs if c.instance_type.key == tkey)
            tail = self.termination_s(itype)
            # a request can only be served by another bracket's instance released while it boots:
            # pre-filter (request, donor) column pairs on their ranges over the samples
            overlap = (
                (D.max(axis=0)[:, None] > Q.min(axis=0)[None, :] - tail)
                & (D.min(axis=0)[:, None] <= R.max(axis=0)[None, :])
                & (d_bracket[:, None] != q_bracket[None, :])
            )
            useful = [
                (int(j), np.flatnonzero(overlap[:, j]))
                for j in np.argsort(R.mean(axis=0), kind="stable")
                if overlap[:, j].any()
            ]
            out.append((tkey, itype, D, d_stage, d_bracket, Q, R, q_stage, q_bracket, tail, useful))
        return out

    def _handoffs(self, configs, runs, n):
        """Per type: (saved $, startup $ saved, idle $ added, $ saved per receiving stage) per sample."""
        result = []
        for tkey, itype, D, d_stage, d_bracket, Q, R, q_stage, q_bracket, tail, useful in self._matching(
            configs, runs, slice(0, n)
        ):
            if not useful:
                continue
            price = self.price_hr(itype) / 3600.0
            S = D.shape[0]
            rows = np.arange(S)
            free = np.ones(D.shape, dtype=bool)
            saved = np.zeros(S)
            startup = np.zeros(S)
            idle = np.zeros(S)
            per_stage: dict[int, np.ndarray] = {}
            for j, cols in useful:
                Dc = D[:, cols]
                ok = free[:, cols] & (Dc > Q[:, j : j + 1] - tail) & (Dc <= R[:, j : j + 1])
                has = ok.any(axis=1)
                if not has.any():
                    continue
                k = cols[np.argmax(np.where(ok, Dc, -np.inf), axis=1)]
                free[rows[has], k[has]] = False
                d = D[rows, k]
                gain = np.where(has, (d - Q[:, j] + tail) * price, 0.0)
                saved += gain
                startup += np.where(has, (R[:, j] - Q[:, j]) * price, 0.0)
                idle += np.where(has, (R[:, j] - d - tail) * price, 0.0)
                stage = int(q_stage[j])
                per_stage[stage] = per_stage.get(stage, 0.0) + gain
            result.append((tkey, saved, startup, idle, per_stage))
        return result

    def handoffs(self, configs: Sequence[StageConfig], sample: int) -> list[tuple[str, int, int, float, float]]:
        """Hand-overs of one sample: (type key, from stage, to stage, when released, when the receiver's own
        instance would have been up)."""
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        runs = self._all(configs, self.samples)
        out = []
        for tkey, itype, D, d_stage, d_bracket, Q, R, q_stage, q_bracket, tail, useful in self._matching(
            configs, runs, slice(sample, sample + 1)
        ):
            free = np.ones(D.shape[1], dtype=bool)
            for j, _ in useful:
                ok = free & (D[0] > Q[0, j] - tail) & (D[0] <= R[0, j]) & (d_bracket != q_bracket[j])
                if not ok.any():
                    continue
                k = int(np.argmax(np.where(ok, D[0], -np.inf)))
                free[k] = False
                out.append((tkey, int(d_stage[k]), int(q_stage[j]), float(D[0, k]), float(R[0, j])))
        return out

    def trace(self, configs: Sequence[StageConfig], sample: int) -> tuple[Timeline, nx.DiGraph, float]:
        """Timeline of one sample: every bracket's (shifted by its offset), hand-overs merged.

        Instance ids are renumbered across the job; trial ids count on from the previous
        brackets' first stages. A handed-over instance keeps the giver's id, lives until the
        receiver releases it, and the receiver's own instance disappears.
        """
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        instances: list[TimelineInstance | None] = []  # None: a receiver's own instance, replaced by a hand-over
        tasks: list[TimelineTask] = []
        dag = nx.DiGraph()
        critical = 0.0
        trial_base = 0
        per_stage_release: dict[int, list[TimelineInstance]] = {}
        per_stage_new: dict[int, list[TimelineInstance]] = {}
        runs = self._all(configs, self.samples)
        for b, (lo, hi) in enumerate(self.ranges):
            sub = self.subs[b]
            off = self.offsets[b]
            tl, sub_dag, crit = sub.trace(configs[lo:hi], sample, queue=runs[b].queue)
            critical = max(critical, off + crit)
            rename = {}
            for inst in tl.instances:
                new_id = f"i{len(instances)}"
                rename[inst.id] = new_id
                moved = inst.model_copy(
                    update={
                        "id": new_id,
                        "first_stage": inst.first_stage + lo,
                        "last_stage": inst.last_stage + lo,
                        "requested_s": inst.requested_s + off,
                        "ready_s": inst.ready_s + off,
                        "released_s": inst.released_s + off,
                    }
                )
                instances.append(moved)
                per_stage_new.setdefault(moved.first_stage, []).append(moved)
                per_stage_release.setdefault(moved.last_stage, []).append(moved)
            for t in tl.tasks:
                tasks.append(
                    t.model_copy(
                        update={
                            "trial": t.trial + trial_base,
                            "start_s": t.start_s + off,
                            "end_s": t.end_s + off,
                            "instance_ids": [rename[i] for i in t.instance_ids],
                        }
                    )
                )
            trial_base += self.stages[lo].trials
            dag.update(nx.relabel_nodes(sub_dag, lambda node, b=b: (b, node)))
        moves: list[Handoff] = []
        if self.share and len(self.ranges) > 1:
            taken: set[str] = set()
            for tkey, from_stage, to_stage, at, _ in self.handoffs(configs, sample):
                giver = next(
                    (
                        i
                        for i in sorted(per_stage_release.get(from_stage, []), key=lambda x: -x.released_s)
                        if i.id not in taken and abs(i.released_s - at) < 1e-3
                    ),
                    None,
                )
                receiver = next((i for i in per_stage_new.get(to_stage, []) if i.id not in taken), None)
                if giver is None or receiver is None:
                    continue
                taken |= {giver.id, receiver.id}
                moves.append(Handoff(configs[to_stage].instance_type.name, from_stage, to_stage, at, giver.id))
                itype = configs[to_stage].instance_type
                life = receiver.released_s - giver.requested_s + self.termination_s(itype)
                merged = giver.model_copy(
                    update={
                        "last_stage": receiver.last_stage,
                        "released_s": receiver.released_s,
                        "cost_usd": self.rule(itype.cloud).cost(life, self.price_hr(itype)),
                    }
                )
                instances[int(giver.id[1:])] = merged
                instances[int(receiver.id[1:])] = None
                for t in tasks:
                    if receiver.id in t.instance_ids:
                        t.instance_ids = [giver.id if i == receiver.id else i for i in t.instance_ids]
        self.last_handoffs = moves
        return Timeline(instances=[i for i in instances if i is not None], tasks=tasks), dag, critical


def offset_candidates(
    sim: ParallelSimulator, configs: Sequence[StageConfig], result: SimResult, bracket: int
) -> list[float]:
    """Start offsets worth trying for ``bracket``: those that make its first instances come up
    when another bracket's stage ends (its instances are released then), without making it the
    last bracket to finish (median)."""
    runs = sim.bracket_results(configs)
    longest = float(np.median(result.jct))
    own = float(np.median(runs[bracket].jct))
    room = longest - own
    if room <= 0:
        return []
    lo = sim.ranges[bracket][0]
    first = configs[lo].instance_type
    ready = sim.main.model.startup(first.cloud, first.name).quantile(0.5) + sim.main.model.worker_start_s
    out = set()
    for b, r in enumerate(runs):
        if b == bracket:
            continue
        lo_b, hi_b = sim.ranges[b]
        end = sim.offsets[b]
        for k, d in enumerate(r.stage_durations):
            end += float(np.median(d))
            if configs[lo_b + k].instance_type.key != first.key:
                continue
            off = end - ready
            if 0 < off <= room:
                out.add(round(off, 1))
    return sorted(out)


def parallel_knapsack_plans(space, *, targets: int = 40) -> list[tuple[StageConfig, ...]]:
    """Deadline-independent pool plans for parallel brackets.

    Each bracket gets its own knapsack ladder (plans optimal under additive per-stage estimates
    for a ladder of time budgets, :func:`~rubberband.planner.search._knapsack`); for a ladder of
    job times ``T``, every bracket takes its cheapest ladder plan estimated to finish within ``T``
    (its fastest when none does) - over all types, and over each type the all-type ladders use
    alone (so that instances can be handed between brackets).
    """
    from rubberband.planner.search import PlanSpace, _knapsack

    ranges = bracket_ranges(space.stages)
    subs = []
    for lo, hi in ranges:
        sub = PlanSpace(space.stages[lo:hi], space.types, space.model, space.max_workers)
        for i in range(hi - lo):  # the same stages as the job's: share their (cached) options and estimates
            sub._options[i] = space.options(lo + i)
            sub._estimates[i] = space.estimates(lo + i)
        subs.append(sub)

    def ladder(sub, only):
        scored = []
        for plan in _knapsack(sub, only):
            est = [sub.stage_estimate(i, c) for i, c in enumerate(plan)]
            scored.append((sum(e[0] for e in est), sum(e[1] for e in est), plan))
        return scored

    ladders = {None: [ladder(sub, None) for sub in subs]}
    used = sorted({c.instance_type.key for lad in ladders[None] for _, _, plan in lad for c in plan})
    for key in used:
        ladders[key] = [ladder(sub, key) for sub in subs]
    out, seen = [], set()
    for only, per_bracket in ladders.items():
        if any(not lad for lad in per_bracket):
            continue
        times = sorted({t for lad in per_bracket for t, _, _ in lad})
        lo_t = max(min(t for t, _, _ in lad) for lad in per_bracket)
        times = [t for t in times if t >= lo_t]
        if len(times) > targets:
            times = [times[int(i * (len(times) - 1) / (targets - 1))] for i in range(targets)]
        for target in times:
            plan: list[StageConfig] = []
            for lad in per_bracket:
                fitting = [x for x in lad if x[0] <= target * (1 + 1e-9)]
                pick = min(fitting, key=lambda x: (x[1], x[0])) if fitting else min(lad, key=lambda x: x[0])
                plan.extend(pick[2])
            key = plan_key(plan)
            if key not in seen:
                seen.add(key)
                out.append(tuple(plan))
    return out


def optimise_offsets(
    sim: ParallelSimulator, configs: Sequence[StageConfig], result: SimResult, deadline_s: float, confidence: float
) -> tuple[ParallelSimulator, SimResult, int]:
    """Coordinate descent over bracket start offsets: for each bracket after the first, try the
    offsets of :func:`offset_candidates` and keep the cheapest that still meets the deadline.
    Returns the simulator with the chosen offsets, its result and the plans simulated."""
    best_sim, best = sim, result
    evaluated = 0
    for b in range(1, len(sim.ranges)):
        for off in offset_candidates(best_sim, configs, best, b):
            offsets = list(best_sim.offsets)
            offsets[b] = off
            trial_sim = best_sim.with_offsets(offsets)
            res = trial_sim.simulate(configs)
            evaluated += 1
            if res.meets(deadline_s, confidence) and res.cost_mean < best.cost_mean - 1e-9:
                best_sim, best = trial_sim, res
    return best_sim, best, evaluated
