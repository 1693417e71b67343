import dataclasses
import heapq

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rubberband.planner.schedule import Stage, sha_stages
from rubberband.planner.list_schedule import list_schedule, list_schedule_bisect
from rubberband.planner.plan_space import StageConfig, efficient_counts, layout, useful_instances
from rubberband.planner.simulator import SimSettings, Simulator
from planner_helpers import ideal_model, itype

GPU1 = itype("gpu1", gpus=1, price=3.6)
GPU4 = itype("gpu4", gpus=4, price=14.4)
OTHER = itype("other1", gpus=1, price=1.8)


def test_closed_form_without_noise_startup_or_scaling_loss():
    """Zero noise, zero start-up, perfect scaling: JCT and cost have a closed form."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10)  # 100 it/epoch/worker → 50 s/epoch at w=1
    stages = sha_stages(9, 3, 2, 18)  # (9 trials, 2 ep), (3, 6), (1, 18)
    configs = [StageConfig(GPU1, 3, 1), StageConfig(GPU1, 3, 1), StageConfig(GPU4, 1, 2)]
    sim = Simulator(stages, model, SimSettings(samples=50, seed=1))
    res = sim.simulate(configs)
    epoch = {1: 50.0, 2: 25.0}
    d0 = 3 * 2 * epoch[1]  # 3 waves of 2 epochs
    d1 = 1 * 4 * epoch[1]  # one wave of 4 more epochs
    d2 = 1 * 12 * epoch[2]  # 12 more epochs at 2 workers on one node
    assert np.allclose(res.jct, d0 + d1 + d2)
    assert np.allclose(res.stage_durations[0], d0) and np.allclose(res.stage_durations[2], d2)
    # gpu1 × 3 live through stages 0-1, then gpu4 × 1 through stage 2 (released at its end)
    expected = 3 * (d0 + d1) * 3.6 / 3600 + d2 * 14.4 / 3600
    assert np.allclose(res.cost, expected)
    # 2 of the gpu4's 4 GPUs idle in the last stage; nothing else is overhead
    assert np.allclose(res.breakdown["idle"], d2 * 14.4 / 3600 * 0.5)
    assert np.allclose(res.breakdown["startup"] + res.breakdown["billing_minimum"] + res.breakdown["transfer"], 0)
    assert np.ptp(res.jct) < 1e-9 and np.ptp(res.cost) < 1e-12


def test_billing_minimum_applies_to_short_lived_instances():
    model = ideal_model(t_iter=0.1, dataset=100, batch=10)  # 1 s per epoch
    stages = [Stage(0, 0, 2, 5, 5)]
    res = Simulator(stages, model, SimSettings(samples=10)).simulate([StageConfig(GPU1, 2, 1)])
    assert np.allclose(res.jct, 5.0)
    assert np.allclose(res.cost, 2 * 60 * 3.6 / 3600)  # two instances, 60 s minimum each
    assert np.allclose(res.breakdown["billing_minimum"], 2 * 55 * 3.6 / 3600)


def test_waves_release_instances_early():
    model = ideal_model(t_iter=1.0, dataset=100, batch=10)  # 10 s/epoch
    stages = [Stage(0, 0, 5, 10, 10)]  # 5 trials × 100 s on 3 instances: 2 waves, one instance idle in wave 2
    sim = Simulator(stages, model, SimSettings(samples=5))
    configs = [StageConfig(GPU1, 3, 1)]
    res = sim.simulate(configs)
    assert np.allclose(res.jct, 200.0)
    assert np.allclose(res.cost, (200 + 200 + 100) * 3.6 / 3600)
    timeline, dag, critical = sim.trace(configs, 0)
    released = sorted(i.released_s for i in timeline.instances)
    assert released == pytest.approx([100.0, 200.0, 200.0])
    assert critical == pytest.approx(200.0)
    assert len(timeline.tasks) == 5


def test_carried_instances_are_not_provisioned_twice_and_new_ones_are_requested_ahead():
    model = ideal_model(t_iter=1.0, dataset=100, batch=10, startup=30.0, restart=5.0)
    stages = sha_stages(4, 2, 10, 40)  # (4, 10 ep), (2, 20), (1, 40)
    sim = Simulator(stages, model, SimSettings(samples=4))
    carried = [StageConfig(GPU1, 4, 1), StageConfig(GPU1, 2, 1), StageConfig(OTHER, 1, 1)]
    timeline, dag, critical = sim.trace(carried, 0)
    gpu1 = [i for i in timeline.instances if i.instance_type == "gpu1"]
    assert len(gpu1) == 4  # not 4 + 2
    assert sorted(i.last_stage for i in gpu1) == [0, 0, 1, 1]
    other = [i for i in timeline.instances if i.instance_type == "other1"]
    assert len(other) == 1
    stage1_end = 30 + 100 + 100  # on AWS the Ray head is the executor's machine: instances are requested at 0
    # requested at the predicted stage-1 end minus the start-up, so it is ready just in time
    assert other[0].requested_s == pytest.approx(stage1_end - 30.0)
    assert other[0].ready_s == pytest.approx(stage1_end)
    res = sim.simulate(carried)
    assert np.allclose(res.jct, stage1_end + 200.0 + 5.0)  # restart overhead on the type change
    assert critical == pytest.approx(res.jct[0])
    # start-up is paid once per physical instance
    assert res.breakdown["startup"][0] == pytest.approx(4 * 30 * 3.6 / 3600 + 30 * 1.8 / 3600)


def test_local_runs_boot_the_head_first_and_nodes_one_after_another():
    """The local provider starts its head, then one node at a time: the k-th node is ready after k start-ups."""
    local = itype("local.cpu1", cloud="local", gpus=1, price=0.05)
    base = ideal_model(t_iter=1.0, dataset=100, batch=10, startup=10.0)
    model = dataclasses.replace(base, startup_by_cloud={"local": base.startup_by_cloud["aws"]})
    sim = Simulator(sha_stages(3, 3, 1, 1), model, SimSettings(samples=2))  # one stage: 3 trials of 1 epoch (10 s)
    timeline, _, _ = sim.trace([StageConfig(local, 3, 1)], 0)
    instances = sorted(timeline.instances, key=lambda i: i.ready_s)
    # after the head's 10 s, each node's `ray start` begins (and its billing starts, as the local
    # provider journals it) when the one before is up
    assert [i.requested_s for i in instances] == pytest.approx([10.0, 20.0, 30.0])
    assert [i.ready_s for i in instances] == pytest.approx([20.0, 30.0, 40.0])
    # trials go to the first free slot: 20–30 and 30–40 on the first node, 30–40 on the second
    assert sim.simulate([StageConfig(local, 3, 1)]).jct == pytest.approx([40.0, 40.0])


def test_trace_dag_critical_path_matches_vectorised_jct_under_noise():
    model = ideal_model(
        t_iter=0.3, dataset=1000, batch=10, sigma=0.1, startup_samples=[40, 60, 90, 130], restart=5.0, eval_s=2.0
    )
    stages = sha_stages(27, 3, 1, 9)
    configs = [StageConfig(GPU1, 10, 1), StageConfig(GPU4, 2, 2), StageConfig(GPU4, 1, 4)]
    sim = Simulator(stages, model, SimSettings(samples=64, seed=7))
    res = sim.simulate(configs)
    i = res.representative_index()
    timeline, dag, critical = sim.trace(configs, i)
    assert critical == pytest.approx(res.jct[i])
    assert max(t.end_s for t in timeline.tasks) == pytest.approx(res.jct[i])
    assert sum(inst.cost_usd for inst in timeline.instances) == pytest.approx(res.cost[i], rel=1e-6)
    assert len(timeline.tasks) == sum(s.trials for s in stages)


def test_common_random_numbers_and_determinism():
    model = ideal_model(t_iter=0.3, dataset=1000, batch=10, sigma=0.1, startup_samples=[40, 60, 90, 130])
    stages = sha_stages(9, 3, 1, 9)
    a = Simulator(stages, model, SimSettings(samples=200, seed=3))
    b = Simulator(stages, model, SimSettings(samples=200, seed=3))
    plan = [StageConfig(GPU1, 9, 1), StageConfig(GPU1, 3, 1), StageConfig(GPU1, 1, 1)]
    ra, rb = a.simulate(plan), b.simulate(plan)
    assert np.array_equal(ra.jct, rb.jct) and np.array_equal(ra.cost, rb.cost)
    # screening sees a prefix of the same samples
    assert np.array_equal(a.simulate(plan, samples=50).jct, ra.jct[:50])
    c = Simulator(stages, model, SimSettings(samples=200, seed=4)).simulate(plan)
    assert not np.array_equal(c.jct, ra.jct)


def _heap_schedule(ready, dur, trials):
    heap = [(r, j) for j, r in enumerate(ready)]
    heapq.heapify(heap)
    counts = [0] * len(ready)
    last = list(ready)
    for _ in range(trials):
        t, j = heapq.heappop(heap)
        counts[j] += 1
        last[j] = t + dur[j]
        heapq.heappush(heap, (t + dur[j], j))
    return counts, last


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 20), st.integers(0, 2**31), st.booleans())
def test_vectorised_list_scheduling_equals_heap(slots, trials, seed, ties):
    rng = np.random.default_rng(seed)
    if ties:
        ready = rng.integers(0, 3, (4, slots)).astype(float) * 10
        dur = np.full((4, slots), 10.0)
    else:
        ready = rng.uniform(0, 100, (4, slots))
        dur = rng.uniform(5, 50, (4, slots))
    for schedule in (list_schedule, list_schedule_bisect):  # the bisection: what very large stages take
        counts, last_end = schedule(ready, dur, trials)
        for s in range(4):
            c, last = _heap_schedule(list(ready[s]), list(dur[s]), trials)
            assert list(counts[s]) == c
            for j in range(slots):
                if c[j]:
                    assert last_end[s, j] == pytest.approx(last[j])


def test_a_stage_too_large_to_hold_every_start_is_scheduled_in_linear_memory():
    """100 000 trials on 11 112 slots that came up one after another (the spec's largest SHA stage on a
    local cluster): the dense schedulers would need ~33 GiB; the bisection gives the same counts as on a
    case small enough to compare, and sums to the trials here."""
    from rubberband.planner.list_schedule import DENSE_STARTS_LIMIT, list_schedule_partition, start_rows

    slots, trials = 11_112, 100_000
    ready = np.tile(np.arange(slots) * 6.0, (10, 1))
    dur = np.full((10, slots), 1.7)
    assert 10 * start_rows(ready, dur, trials) * slots > DENSE_STARTS_LIMIT
    counts, ends = list_schedule(ready, dur, trials)
    assert counts.shape == (10, slots) and np.all(counts.sum(axis=1) == trials)
    small = (ready[:, :300], dur[:, :300], 2_000)
    assert np.array_equal(list_schedule_bisect(*small)[0], list_schedule_partition(*small)[0])


def test_slot_layouts_and_efficient_counts():
    assert layout(4, 3, 2).slots == 6 and layout(4, 3, 3).slots == 3
    assert layout(1, 8, 4).slots == 2 and layout(1, 8, 4).span == 4
    assert useful_instances(9, 4, 2) == 5 and useful_instances(3, 1, 2) == 6
    assert efficient_counts(9, 1, 1) == [1, 2, 3, 5, 9]
    assert efficient_counts(3, 1, 2) == [2, 4, 6]


def test_request_offsets_match_the_simulated_requests():
    model = ideal_model(t_iter=0.2, dataset=1000, batch=10, sigma=0.05, startup_samples=[30, 60, 90], restart=4.0)
    stages = sha_stages(9, 3, 1, 9)
    configs = [StageConfig(GPU1, 5, 1), StageConfig(GPU4, 1, 2), StageConfig(OTHER, 2, 2)]
    sim = Simulator(stages, model, SimSettings(samples=16, seed=1))
    offsets = sim.request_offsets(configs)
    timeline, _, _ = sim.trace(configs, 3)
    for stage in (1, 2):
        first = min(t.start_s for t in timeline.tasks if t.stage == stage - 1)
        new = [i for i in timeline.instances if i.first_stage == stage]
        assert new and all(i.requested_s == pytest.approx(first + offsets[stage]) for i in new)
    assert offsets[0] is None


def test_dag_has_explicit_transitions_only_where_the_placement_changes():
    model = ideal_model(t_iter=0.2, dataset=1000, batch=10, restart=7.0, ckpt_gb=2.0)
    stages = sha_stages(9, 3, 1, 9)
    configs = [StageConfig(GPU1, 9, 1), StageConfig(GPU1, 3, 1), StageConfig(GPU4, 1, 2)]
    sim = Simulator(stages, model, SimSettings(samples=4))
    _, dag, critical = sim.trace(configs, 0)
    moves = [(u, w) for u, w, a in dag.edges(data=True) if a.get("kind") == "transition"]
    assert len(moves) == 1 and moves[0][0][1] == 2  # only the last stage's single trial moves
    assert dag.edges[moves[0]]["weight"] == pytest.approx(7.0 + 2.0)  # restart + 2 GB at 1 GB/s
    res = sim.simulate(configs)
    assert critical == pytest.approx(res.jct[0])
    assert res.breakdown["transfer"][0] == pytest.approx(2.0 * 0.01)


def test_list_schedule_by_counting_matches_the_partition_exactly():
    """The counting list scheduler picks the same starts as the partition (ties to the lower slot),
    on tie-heavy integer inputs, spread start-ups and large many-wave stages alike."""
    from rubberband.planner.list_schedule import list_schedule, list_schedule_partition

    rng = np.random.default_rng(7)
    cases = []
    for _ in range(1500):
        S, slots, trials = 16, int(rng.integers(1, 9)), int(rng.integers(1, 40))
        ready = rng.integers(0, 4, (S, slots)).astype(float) * rng.choice([0.5, 1.0, 7.0])
        dur = rng.integers(1, 4, (S, slots)).astype(float) * rng.choice([0.5, 1.0, 3.0])
        if rng.random() < 0.5:  # spread start-ups, stragglers
            ready = ready + 50 * rng.random((S, slots))
            dur = dur * np.exp(0.5 * rng.standard_normal((S, slots)))
        cases.append((ready, dur, trials))
    for slots, trials in [(35, 243), (6, 243), (81, 243), (27, 81), (1, 27)]:
        ready = 100 + 20 * rng.random((200, slots))
        cases.append((ready, 300 * np.exp(0.03 * rng.standard_normal((200, slots))) + 10, trials))
    for ready, dur, trials in cases:
        counts, ends = list_schedule(ready, dur, trials)
        ref_counts, ref_ends = list_schedule_partition(ready, dur, trials)
        assert np.array_equal(counts, ref_counts) and np.array_equal(ends, ref_ends)
        assert np.all(counts.sum(axis=1) == trials)
