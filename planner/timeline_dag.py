"""The representative sample's timeline, rebuilt as an explicit task DAG whose critical path is the JCT.

:meth:`Simulator.trace <rubberband.planner.simulator.Simulator.trace>` replays one sample with ``record=True``;
:func:`build_timeline` turns its per-stage records into a networkx DAG (the start, each instance's request and
readiness, each task's dispatch and training, each stage's barrier; edges weighted by the time between them) and
reads the plan's :class:`~rubberband.plan.Timeline` off the longest paths.
"""

from __future__ import annotations

from typing import Hashable, Protocol, Sequence

import networkx as nx

from rubberband.catalog import BillingRule, InstanceType
from rubberband.plan import Timeline, TimelineInstance, TimelineTask
from rubberband.planner.plan_space import Layout, StageConfig
from rubberband.planner.schedule import Stage
from rubberband.planner.stage_state import StageRecord


class BilledJob(Protocol):
    """What the timeline reads of the simulator that played the sample: the job's stages and its billing."""

    @property
    def stages(self) -> Sequence[Stage]: ...

    def rule(self, cloud: str) -> BillingRule: ...

    def termination_s(self, itype: InstanceType) -> float: ...

    def price_hr(self, itype: InstanceType, market: str | None = None) -> float: ...


def build_timeline(
    sim: BilledJob, configs: tuple[StageConfig, ...], records: list[StageRecord]
) -> tuple[Timeline, nx.DiGraph, float]:
    """Turn the recorded sample into an explicit DAG and read the timeline off it."""
    dag = _TimelineDag(sim)
    for idx, (config, rec) in enumerate(zip(configs, records)):
        if rec.trace is None:
            raise AssertionError("a stage record without its trace (Simulator.trace plays them with record=True)")
        dag.add_stage(idx, config, rec.trace)
    return dag.timeline(len(configs))


class _TimelineDag:
    """The representative sample's task DAG, built stage by stage from the traces :meth:`Simulator.trace` records:
    nodes for the start, each instance's request and readiness, each task's dispatch and training, each stage's
    barrier; edges weighted by the time between them, so that the longest path to a node is when it happens."""

    def __init__(self, sim: BilledJob) -> None:
        self.sim = sim
        self.dag = nx.DiGraph()
        self.dag.add_node("start")
        self.instances: list[dict] = []
        self.tasks: list[TimelineTask] = []
        self.task_nodes: list[tuple[tuple, float]] = []
        self.prev_ids: list[int] = []  # instance ids of the previous stage, in sorted-release order
        self.prev_barrier: Hashable = "start"
        self.prev_first_task: Hashable | None = None
        self.trial_ids: dict[int, list[int]] = {}

    def add_stage(self, idx: int, config: StageConfig, tr: dict) -> None:
        """Stage ``idx``'s instances (carried over or requested) and its tasks on their slots, up to its barrier."""
        ids = self._instances(idx, config, tr)
        lay: Layout = tr["layout"]
        if lay.span == 1:  # slot → instances
            slot_insts = [[ids[j // lay.per_instance]] for j in range(lay.slots)]
        else:
            slot_insts = [ids[j * lay.span : (j + 1) * lay.span] for j in range(lay.slots)]
        self.prev_first_task = self._tasks(idx, config, tr, slot_insts)
        self.prev_ids = ids
        self.prev_barrier = ("barrier", idx)

    def _instances(self, idx: int, config: StageConfig, tr: dict) -> list[int]:
        """The ids of stage ``idx``'s instances: the carried ones keep theirs (ready at the barrier, or when up if
        still starting), new ones are requested (from the start, or ahead, timed from the previous stage's first
        task) and come up after their start-up."""
        dag, instances, carry = self.dag, self.instances, tr["carry"]
        ids = [0] * config.instances
        carried = [self.prev_ids[i] for i in tr["carried_from_prev"]] if carry else []
        for i in range(config.instances):
            if i < carry:
                ids[i] = carried[i]
                instances[ids[i]]["last_stage"] = idx
                dag.add_edge(self.prev_barrier, ("ready", ids[i], idx), weight=0.0)
                # one still starting at the barrier is ready when it is up
                dag.add_edge(("ready", ids[i], instances[ids[i]]["ready_stage"]), ("ready", ids[i], idx), weight=0.0)
                instances[ids[i]]["ready_stage"] = idx
            else:
                ids[i] = len(instances)
                instances.append(
                    {
                        "id": ids[i],
                        "config": config,
                        "first_stage": idx,
                        "last_stage": idx,
                        "ready_stage": idx,
                        "requested": float(tr["request"][i]),
                        "ready": float(tr["ready"][i]),
                    }
                )
                if self.prev_first_task is None:
                    dag.add_edge("start", ("request", ids[i]), weight=float(tr["request"][i]))
                else:  # requested ahead, timed from the previous stage's first task (serially on local)
                    dag.add_edge(
                        self.prev_first_task, ("request", ids[i]), weight=float(tr["request"][i]) - tr["prev_anchor"]
                    )
                dag.add_edge(
                    ("request", ids[i]), ("ready", ids[i], idx), weight=float(tr["ready"][i] - tr["request"][i])
                )
            instances[ids[i]]["released"] = float(tr["release"][i])
        return ids

    def _tasks(self, idx: int, config: StageConfig, tr: dict, slot_insts: list[list[int]]) -> Hashable | None:
        """Stage ``idx``'s tasks in start order, each on its slot's instances after the previous barrier (its
        slot's first) or its slot's previous task; promoted trials keep their ids (the best of the previous stage,
        in order). Returns the stage's first task node (None: it has none)."""
        dag, stage = self.dag, self.sim.stages[idx]
        barrier = ("barrier", idx)
        starts = []
        for j in range(len(slot_insts)):
            t = tr["slot_ready"][j]
            for k in range(int(tr["counts"][j])):
                starts.append((float(t), j, k))
                t = t + tr["dur"][j]
        starts.sort()
        ids_in = self.trial_ids.get(stage.bracket) if stage.index > 0 else None
        first_trial = sum(s.trials for s in self.sim.stages[:idx] if s.bracket < stage.bracket and s.index == 0)
        first_task = None
        for order, (t0, j, k) in enumerate(starts):
            trial = ids_in[order] if ids_in else first_trial + order
            # a task node starts the trial's work on its slot; when the placement changed at this
            # promotion, a transition node (checkpoint restore onto the new instances) precedes training
            node = ("task", idx, j, k)
            train = ("train", idx, j, k)
            if first_task is None:
                first_task = node
            d = float(tr["dur"][j])
            move = float(tr["transition"])
            dag.add_edge(node, train, weight=move, kind="transition" if move > 0 else "dispatch")
            if k == 0:
                dag.add_edge(self.prev_barrier, node, weight=0.0)
                for iid in slot_insts[j]:
                    dag.add_edge(("ready", iid, idx), node, weight=0.0)
            else:
                dag.add_edge(("train", idx, j, k - 1), node, weight=d - move)
            if k == int(tr["counts"][j]) - 1:
                dag.add_edge(train, barrier, weight=d - move)
            self.tasks.append(
                TimelineTask(
                    trial=trial,
                    stage=stage.index,
                    bracket=stage.bracket,
                    instance_ids=[f"i{x}" for x in slot_insts[j]],
                    workers=config.workers,
                    start_s=t0,
                    end_s=t0 + d,
                )
            )
            self.task_nodes.append((node, d))
        self.trial_ids[stage.bracket] = [t.trial for t in self.tasks[-len(starts) :]]
        return first_task

    def timeline(self, stages: int) -> tuple[Timeline, nx.DiGraph, float]:
        """(timeline, DAG, critical path) once all ``stages`` are added: every node at its longest path from the
        start, the tasks and instances read off it, the last barrier's time the critical path."""
        dag, sim = self.dag, self.sim
        times: dict = {}
        for node in nx.topological_sort(dag):
            preds = list(dag.predecessors(node))
            times[node] = max((times[u] + dag.edges[u, node]["weight"] for u in preds), default=0.0)
        for t, (node, d) in zip(self.tasks, self.task_nodes):
            t.start_s = times[node]
            t.end_s = times[node] + d
        out_instances = []
        for inst in self.instances:
            inst_config: StageConfig = inst["config"]
            itype = inst_config.instance_type
            rule = sim.rule(itype.cloud)
            life = inst["released"] - inst["requested"] + sim.termination_s(itype)
            out_instances.append(
                TimelineInstance(
                    id=f"i{inst['id']}",
                    instance_type=itype.name,
                    cloud=itype.cloud,
                    first_stage=inst["first_stage"],
                    last_stage=inst["last_stage"],
                    requested_s=inst["requested"],
                    ready_s=inst["ready"],
                    released_s=inst["released"],
                    cost_usd=rule.cost(life, sim.price_hr(itype, inst_config.market)),
                )
            )
        critical = times[("barrier", stages - 1)]
        return Timeline(instances=out_instances, tasks=self.tasks), dag, critical
