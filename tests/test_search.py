"""Search: fixed configurations in the spec, the random default and Optuna's samplers (ask/tell)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from rubberband import install_hint
from rubberband.errors import SpecError
from rubberband.search import OptunaSource, RandomSource, first_config, make_config_source, trial_id_for
from rubberband.spec import load_spec

BASE = textwrap.dedent("""\
    name: fixed
    train: t:train
    metric: {name: loss, mode: min}
    search_space:
      lr: {type: loguniform, low: 0.001, high: 1.0}
      depth: {type: choice, values: [2, 4]}
    scheduler: {kind: sha, trials: 9, eta: 3, min_epochs: 1, max_epochs: 3}
    deadline: 10m
    resources: {clouds: [local]}
    """)


def spec_from(tmp_path, text=BASE, **extra):
    for key, value in extra.items():
        text += f"{key}: {json.dumps(value)}\n"
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_spec(path)


# -- the spec ------------------------------------------------------------------------------------


def test_fixed_configurations_run_first_then_samples(tmp_path):
    spec = spec_from(tmp_path, trials=[{"lr": 0.1, "depth": 4}, {"lr": 0.01}])
    source = RandomSource(spec)
    configs = [source.propose(trial_id_for(0, i)) for i in range(4)]
    assert configs[0] == {"lr": 0.1, "depth": 4}
    assert configs[1]["lr"] == 0.01 and configs[1]["depth"] in (2, 4)  # the rest of a partial one is sampled
    assert all(0.001 <= c["lr"] <= 1.0 for c in configs[2:])
    assert first_config(spec) == {"lr": 0.1, "depth": 4}


def test_fixed_configurations_alone_set_the_sha_trials(tmp_path):
    text = BASE.replace("trials: 9, ", "").split("search_space:")[0] + textwrap.dedent("""\
        scheduler: {kind: sha, eta: 3, min_epochs: 1, max_epochs: 3}
        deadline: 10m
        trials: [{lr: 0.1}, {lr: 0.2}, {lr: 0.3}]
        """)
    spec = spec_from(tmp_path, text)
    assert spec.scheduler.trials == 3 and spec.search_space == {}
    source = make_config_source(spec)
    assert [source.propose(trial_id_for(0, i)) for i in range(3)] == [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]


def test_specs_without_the_new_fields_keep_their_digest(tmp_path):
    plain = spec_from(tmp_path)
    explicit = spec_from(tmp_path, search={"sampler": "random"})
    assert plain.sha256() == explicit.sha256()
    assert spec_from(tmp_path, search={"sampler": "tpe"}).sha256() != plain.sha256()


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"trials": [{"lr": 5.0}]}, "'trials.0.lr': 5.0 is outside [0.001, 1.0]"),
        ({"trials": [{"lr": 0.1}, {"width": 3}]}, "'trials.1.width': not in search_space"),
        ({"trials": [{"depth": 3}]}, "'trials.0.depth': 3 is not one of [2, 4]"),
        ({"trials": [{"lr": "fast"}]}, "'trials.0.lr': 'fast' is not a number"),
        ({"trials": [{"lr": 0.1}] * 10}, "'trials': lists 10 configurations but the sha schedule starts only 9"),
        ({"trials": []}, "'trials'"),
        ({"trials": [5]}, "'trials.0'"),
        ({"search": {"sampler": "cmaes"}}, "'search.sampler': must be one of 'random', 'tpe' or 'qmc'"),
        ({"search": {"study_name": "s"}}, "'search': study_name needs a storage URL"),
        ({"search": {"sampler": "tpe", "seeds": 3}}, "'search.seeds': unknown field"),
    ],
)
def test_bad_search_fields_are_named(tmp_path, extra, fragment):
    with pytest.raises(SpecError) as info:
        spec_from(tmp_path, **extra)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert "job.yaml:" in message


def test_fixed_configurations_alone_must_cover_the_schedule(tmp_path):
    text = BASE.split("search_space:")[0] + textwrap.dedent("""\
        scheduler: {kind: sha, trials: 9, eta: 3, min_epochs: 1, max_epochs: 3}
        deadline: 10m
        trials: [{lr: 0.1}]
        """)
    with pytest.raises(SpecError, match="'trials': lists 1 configurations but the sha schedule starts 9 trials"):
        spec_from(tmp_path, text)
    with pytest.raises(SpecError, match="'search_space': required field is missing"):
        spec_from(tmp_path, BASE.split("search_space:")[0] + "scheduler: {max_epochs: 3, trials: 3}\ndeadline: 1m\n")


def test_optuna_choices_must_be_scalars(tmp_path):
    text = BASE.replace("values: [2, 4]", "values: [[1, 2], [3]]")
    spec_from(tmp_path, text)  # fine for the random sampler
    with pytest.raises(SpecError, match="'search_space.depth.values': Optuna samplers take only"):
        spec_from(tmp_path, text, search={"sampler": "tpe"})


def test_random_restore_reproduces_the_uninterrupted_sequence(tmp_path):
    spec = spec_from(tmp_path, trials=[{"lr": 0.5}])
    straight = RandomSource(spec)
    expected = [straight.propose(trial_id_for(0, i)) for i in range(6)]
    resumed = RandomSource(spec)
    for i in range(4):
        resumed.restore(trial_id_for(0, i), expected[i])
    assert [resumed.propose(trial_id_for(0, i)) for i in (4, 5)] == expected[4:]


def test_missing_optuna_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    spec = spec_from(tmp_path, search={"sampler": "tpe"})
    with pytest.raises(SpecError) as info:
        make_config_source(spec)
    assert str(info.value) == (
        "spec field 'search': sampler tpe needs Optuna, which is not installed; "
        + install_hint("optuna")
        + " (or use sampler: random)"
    )
    assert isinstance(make_config_source(spec_from(tmp_path)), RandomSource)  # random needs nothing


@pytest.mark.e2e
def test_random_default_does_not_import_optuna(tmp_path):
    code = (
        "import sys; from rubberband.spec import load_spec; from rubberband.search import make_config_source; "
        f"make_config_source(load_spec({str(tmp_path / 'job.yaml')!r})).propose('x'); "
        "assert 'optuna' not in sys.modules"
    )
    spec_from(tmp_path)
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- Optuna ----------------------------------------------------------------------------------------

optuna = pytest.importorskip("optuna")


def _bracket(source, bracket: int, n: int) -> dict[str, dict]:
    return {trial_id_for(bracket, i): source.propose(trial_id_for(bracket, i)) for i in range(n)}


def _loss(config) -> float:
    return (config["lr"] - 0.01) ** 2 + (0.0 if config["depth"] == 4 else 0.1)


@pytest.mark.parametrize("sampler", ["tpe", "qmc", "random"])
def test_optuna_samplers_propose_in_the_space_and_start_with_fixed(tmp_path, sampler):
    storage = f"sqlite:///{tmp_path / 'study.db'}" if sampler == "random" else None
    spec = spec_from(
        tmp_path,
        trials=[{"depth": 2}],
        search={"sampler": sampler, "seed": 3, **({"storage": storage} if storage else {})},
    )
    source = make_config_source(spec)
    assert isinstance(source, OptunaSource)
    configs = list(_bracket(source, 0, 9).values())
    assert configs[0]["depth"] == 2
    assert all(0.001 <= c["lr"] <= 1.0 and c["depth"] in (2, 4) for c in configs)
    assert len({c["lr"] for c in configs}) == 9


def test_tpe_is_told_every_rung_and_learns_across_brackets(tmp_path):
    """Hyperband with TPE (BOHB): rungs report intermediate values; the losers are pruned; later brackets
    propose better configurations than the first, random-started one."""
    spec = spec_from(tmp_path, search={"sampler": "tpe", "seed": 0})
    source = make_config_source(spec)
    study = source._study
    first = _bracket(source, 0, 27)
    losses = {t: _loss(c) for t, c in first.items()}
    survivors = sorted(losses, key=losses.get)[:9]
    source.rung_finished(1, losses, survivors)
    assert sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials) == 18
    final = sorted(survivors, key=losses.get)[:3]
    source.rung_finished(3, {t: losses[t] for t in survivors}, final)
    source.rung_finished(9, {t: losses[t] for t in final}, None)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 3 and states.count(optuna.trial.TrialState.PRUNED) == 24
    best = study.best_trial
    assert best.intermediate_values == {1: best.value, 3: best.value, 9: best.value}
    assert best.user_attrs["rubberband_trial"].startswith("run/b0-t")
    second = _bracket(source, 1, 27)
    median = sorted(losses.values())[len(losses) // 2]
    later = [_loss(c) for c in second.values()]
    assert sum(v < median for v in later) > 18  # far more than half of them beat the first bracket's median


def test_tpe_learns_from_results_of_trials_still_running(tmp_path):
    """Each trial's rung result is told as it comes in, before the rung's decision: TPE's next asks already use
    them (a trial still running counts as stopped at its newest result), the study keeps it running, and the
    same seed asks the same configurations."""

    def asks(seed: int) -> tuple[list[float], list[float], object]:
        source = make_config_source(spec_from(tmp_path, search={"sampler": "tpe", "seed": seed}))
        first = _bracket(source, 0, 20)
        for trial_id, config in first.items():  # results in, no rung decided
            source.rung_finished(1, {trial_id: _loss(config)}, [trial_id])
        later = [_loss(source.propose(trial_id_for(0, 20 + i))) for i in range(20)]
        return [_loss(c) for c in first.values()], later, source._study

    first, later, study = asks(0)
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)
    median = sorted(first)[len(first) // 2]
    assert sum(v < median for v in later) >= 14
    assert asks(0)[1] == later and asks(1)[1] != later


def test_optuna_restore_rebuilds_the_study_and_a_kept_study_is_not_duplicated(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    spec = spec_from(tmp_path, search={"sampler": "tpe", "storage": storage, "study_name": "kept"})
    source = make_config_source(spec, run_key="r1")
    first = _bracket(source, 0, 9)
    losses = {t: _loss(c) for t, c in first.items()}
    survivors = sorted(losses, key=losses.get)[:3]
    source.rung_finished(1, losses, survivors)
    # the executor dies; a new one restores from the journal (configs, completed rungs)
    resumed = make_config_source(spec, run_key="r1")
    for trial_id, config in first.items():
        resumed.restore(trial_id, config)
    resumed.rung_finished(1, losses, survivors)
    resumed.rung_finished(3, {t: losses[t] for t in survivors}, None)
    study = optuna.load_study(study_name="kept", storage=storage)
    assert len(study.trials) == 9
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 3 + ["PRUNED"] * 6
    # in memory, a restore re-creates the trials with the same parameters
    memory = make_config_source(spec_from(tmp_path, search={"sampler": "tpe"}), run_key="r1")
    for trial_id, config in first.items():
        memory.restore(trial_id, config)
    memory.rung_finished(1, losses, survivors)
    assert [t.params for t in memory._study.trials] == [{"lr": c["lr"], "depth": c["depth"]} for c in first.values()]


def test_bad_storage_url_names_the_field(tmp_path):
    spec = spec_from(tmp_path, search={"sampler": "tpe", "storage": "nosuchdb://x"})
    with pytest.raises(SpecError, match="spec field 'search.storage': cannot open Optuna storage"):
        make_config_source(spec)


# -- a run on virtual time ----------------------------------------------------------------------------


def test_hyperband_run_with_tpe_asks_each_bracket_after_the_previous_results(tmp_path):
    """The executor on virtual time (the same loop and search as a real run): Hyperband (R=3, η=3: brackets of 3
    and 2 trials) with TPE in a kept sqlite study and one fixed configuration; the study ends with every trial
    told, each rung's metric as an intermediate value, and bracket 1's trials created only after bracket 0
    finished."""
    from executor_helpers import make_plan, write_job
    from sim_helpers import SimCase

    from rubberband.executor import journal as J

    spec_path = write_job(tmp_path / "job", epoch_s=0.3, max_epochs=3)
    data = json.loads(spec_path.read_text())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 3}
    data.update(
        trials=[{"quality": 0.01}], search={"sampler": "tpe", "seed": 1, "storage": storage, "study_name": "sleepy"}
    )
    spec_path.write_text(json.dumps(data))
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1)] * 3, durations=[3.0, 3.0, 3.0])
    out = SimCase(spec, plan).run(tmp_path / "run")
    assert out.result is not None and out.result.status == "finished", out.error
    events = out.events
    created = [i for i, e in enumerate(events) if e["type"] == J.TRIAL_CREATED]
    bracket0_done = next(i for i, e in enumerate(events) if e["type"] == J.STAGE_FINISHED and e["stage"] == 1)
    assert [events[i]["trial_id"] for i in created] == ["b0-t000", "b0-t001", "b0-t002", "b1-t000", "b1-t001"]
    assert all(i > bracket0_done for i in created[3:])
    assert events[created[0]]["config"]["quality"] == 0.01
    state = out.state

    study = optuna.load_study(study_name="sleepy", storage=storage)
    by_trial = {t.user_attrs["rubberband_trial"].split("/", 1)[1]: t for t in study.trials}
    assert sorted(by_trial) == sorted(state.trials)
    for trial_id, frozen in by_trial.items():
        assert frozen.params["quality"] == pytest.approx(state.trials[trial_id].config["quality"])
        for g, metric in state.trials[trial_id].finished_stages.items():
            assert frozen.intermediate_values[plan.stages[g].epochs] == pytest.approx(metric)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 3 + ["PRUNED"] * 2
    promoted = {e["trial_id"] for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 1}
    assert {t for t, frozen in by_trial.items() if frozen.state.name == "COMPLETE"} == promoted | {"b1-t000", "b1-t001"}


@pytest.mark.e2e
def test_run_without_optuna_stops_before_planning_with_one_line(tmp_path, cli):
    """The real CLI, where `import optuna` fails: exit 2, one line naming the field and the fix, no run dir."""
    import os

    from conftest import EXAMPLES

    blocker = tmp_path / "blocker" / "optuna"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named optuna')\n")
    text = (EXAMPLES / "quickstart_local.yaml").read_text() + "search: {sampler: tpe}\n"
    spec_path = EXAMPLES.parent / "examples" / f".test-no-optuna-{os.getpid()}.yaml"
    spec_path.write_text(text)  # beside the example, so its train module and profile resolve
    try:
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker"), "RUBBERBAND_RUNS_DIR": str(tmp_path / "runs")}
        done = cli("run", spec_path, "--yes", env=env)
    finally:
        spec_path.unlink()
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        (
            "rubberband: error: spec field 'search': sampler tpe needs Optuna, which is not installed; "
            + install_hint("optuna")
            + " (or use sampler: random)"
        )
    ]
    assert not (tmp_path / "runs").exists()
