"""Where trial configurations come from: the spec's fixed ones first, then a sampler.

A :class:`ConfigSource` is told every rung result as soon as it is known — each trial's result at a rung the
moment the trial ends it (it goes on for now; ASHA stops it there and then, or the rung's decision does), and
each rung's decision when the rung ends: trials that are not promoted end there (Optuna: *pruned*), those of a
bracket's last rung complete.

When it is asked depends on whether it learns (:func:`learns_from_results`):

* a sampler that learns (``tpe``) is asked for each trial's configuration right before the trial starts, on the
  slot it takes: later waves of a bracket and the brackets of a parallel Hyperband running beside it are asked
  after the results that came in before them (the first trials on a run's first slots are asked blind). The
  start times are the plan's either way: asking happens on a free slot, it never waits for one.
* the others (``random``, ``qmc``) draw independently of results: a bracket's configurations are asked when it
  opens, in trial order, so a run draws the same configurations whatever the order its brackets fill slots in.

ASHA asks for each new trial as it fills a slot, whatever the sampler.

* ``random`` (the default): numpy, seeded; imports nothing else.
* ``tpe`` / ``qmc``, or any sampler with a ``storage``: Optuna's ask/tell API on an in-memory
  study, or on the user's storage URL (a study they keep; each trial carries a
  ``rubberband_trial`` user attribute ``<run id>/<trial id>``, so a resumed run finds its own).
  TPE samples from every result heard so far: finished trials as Optuna has them, and a trial still
  running with its newest rung result as if it had stopped there (Optuna's TPE ranks such trials by how far
  they got, then by value) — so a bracket's rung-0 results inform the asks that follow them. TPE with
  Hyperband is what users know as BOHB. Needs the ``optuna`` extra.

On resume the source is rebuilt from the journal: every created trial is restored in creation
order, then every completed rung is told again; a resumed run keeps every journaled configuration.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol

import numpy as np

from rubberband import install_hint
from rubberband.errors import SpecError
from rubberband.spec import ChoiceParam, IntParam, JobSpec, LogUniformParam, UniformParam, sample_config

#: The user attribute that ties an Optuna trial to a rubberband run's trial.
TRIAL_ATTR = "rubberband_trial"


class ConfigSource(Protocol):
    """Proposes configurations and learns from rung results (see the module docstring)."""

    def propose(self, trial_id: str) -> dict[str, Any]:
        """The hyperparameters of a new trial (without the spec's fixed ``config``)."""

    def restore(self, trial_id: str, config: dict[str, Any]) -> None:
        """Take back a trial an earlier executor of the run created with ``config``."""

    def rung_finished(self, epochs: int, metrics: dict[str, float | None], promoted: list[str] | None) -> None:
        """A rung ended at ``epochs``: ``metrics`` per trial; ``promoted`` go on (None: the bracket's last rung)."""


def learns_from_results(spec: JobSpec) -> bool:
    """Whether the spec's sampler learns from results: its trials are then asked as they start (module docstring)."""
    return spec.search.sampler == "tpe"


def trial_id_for(bracket: int, index: int) -> str:
    """The id of a bracket's ``index``-th trial (its journal and checkpoint name)."""
    return f"b{bracket}-t{index:03d}"


def first_config(spec: JobSpec) -> dict[str, Any]:
    """The first configuration a fresh random search proposes: the spec's first fixed one, else a seeded sample."""
    return RandomSource(spec).propose("profile")


class RandomSource:
    """Fixed configurations, then uniform samples of the search space from one seeded numpy generator.

    Every trial consumes one full draw (a fixed configuration's values override it), so a resumed
    run that restores k trials proposes exactly what the uninterrupted run would have.
    """

    def __init__(self, spec: JobSpec) -> None:
        seed = spec.search.seed if spec.search.seed is not None else spec.seed
        self._space = spec.search_space
        self._fixed = list(spec.trials or [])
        self._rng = np.random.default_rng(seed)
        self._count = 0

    def propose(self, trial_id: str) -> dict[str, Any]:
        config = sample_config(self._space, self._rng)
        if self._count < len(self._fixed):
            config.update(self._fixed[self._count])
        self._count += 1
        return config

    def restore(self, trial_id: str, config: dict[str, Any]) -> None:
        self.propose(trial_id)

    def rung_finished(self, epochs: int, metrics: dict[str, float | None], promoted: list[str] | None) -> None:
        return None


def _import_optuna(sampler: str):
    try:
        import optuna
    except ImportError:
        raise SpecError(
            f"spec field 'search': sampler {sampler} needs Optuna, which is not installed; "
            f"{install_hint('optuna')} (or use sampler: random)"
        ) from None
    return optuna


def _distributions(optuna, space: dict[str, Any]) -> dict[str, Any]:
    dist = optuna.distributions
    out = {}
    for name, param in space.items():
        if isinstance(param, UniformParam):
            out[name] = dist.FloatDistribution(param.low, param.high)
        elif isinstance(param, LogUniformParam):
            out[name] = dist.FloatDistribution(param.low, param.high, log=True)
        elif isinstance(param, IntParam):
            out[name] = dist.IntDistribution(param.low, param.high)
        elif isinstance(param, ChoiceParam):
            out[name] = dist.CategoricalDistribution(param.values)
    return out


class OptunaSource:
    """Optuna's ask/tell: each proposal is ``study.ask``; each rung's metric ``trial.report(value, epochs)``."""

    def __init__(self, spec: JobSpec, *, run_key: str) -> None:
        optuna = _import_optuna(spec.search.sampler if spec.search.sampler != "random" else "random with a storage")
        self._optuna = optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        search = spec.search
        seed = search.seed if search.seed is not None else spec.seed
        samplers = optuna.samplers
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature warnings are not the user's business
            if search.sampler == "tpe":
                sampler = samplers.TPESampler(seed=seed)
            elif search.sampler == "qmc":
                sampler = samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False)
            else:
                sampler = samplers.RandomSampler(seed=seed)
            direction = "maximize" if spec.metric.mode == "max" else "minimize"
            self._direction = direction
            try:
                self._study = optuna.create_study(
                    storage=search.storage,
                    sampler=sampler,
                    direction=direction,
                    study_name=search.study_name or (spec.name if search.storage else None),
                    load_if_exists=True,
                )
            except Exception as exc:  # noqa: BLE001 - a bad URL surfaces as many driver-specific errors
                raise SpecError(
                    f"spec field 'search.storage': cannot open Optuna storage {search.storage!r} "
                    f"({type(exc).__name__}: {exc}); fix the URL (e.g. sqlite:///study.db)"
                ) from None
        self._space = _distributions(optuna, spec.search_space)
        self._fixed = list(spec.trials or [])
        self._run_key = run_key
        self._seed = seed
        self._learns = learns_from_results(spec)
        self._count = 0
        self._params: dict[str, dict[str, Any]] = {}  # trial id -> its sampled parameters
        self._completed: dict[str, float] = {}  # trial id -> its final value
        self._trials: dict[str, Any] = {}  # trial id -> optuna Trial still running
        self._reported: dict[str, dict[int, float]] = {}

    # -- proposing -------------------------------------------------------------------------
    def _ask(self, trial_id: str, params: dict[str, Any] | None, *, learned: bool = False) -> dict[str, Any]:
        fixed = {k: v for k, v in (params or {}).items() if k in self._space}
        if learned:  # TPE: from every result heard so far, the fixed values kept
            fixed = {**self._learned(), **fixed}
        if fixed:
            self._study.enqueue_trial(fixed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self._study.ask(self._space)
        trial.set_user_attr(TRIAL_ATTR, f"{self._run_key}/{trial_id}")
        self._trials[trial_id] = trial
        self._reported[trial_id] = {}
        self._params[trial_id] = dict(trial.params)
        config = dict(params or {})
        config.update({name: trial.params[name] for name in self._space})
        return config

    def propose(self, trial_id: str) -> dict[str, Any]:
        fixed = self._fixed[self._count] if self._count < len(self._fixed) else None
        self._count += 1
        return self._ask(trial_id, fixed, learned=self._learns)

    def _learned(self) -> dict[str, Any]:
        """TPE's proposal from every result heard so far (see the module docstring): a fresh in-memory study of
        them, sampled with a seed of its own per ask (the ``count``-th of the run), so a run is reproducible."""
        optuna = self._optuna
        frozen = optuna.trial.create_trial
        states = optuna.trial.TrialState
        seed = None if self._seed is None else (self._seed * 1_000_003 + self._count) % 2**32
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), direction=self._direction)
            for trial_id, values in self._reported.items():
                params = self._params.get(trial_id)
                if not values or params is None:
                    continue
                done = self._completed.get(trial_id)
                model.add_trial(
                    frozen(
                        params=params,
                        distributions=self._space,
                        intermediate_values=values,
                        state=states.PRUNED if done is None else states.COMPLETE,
                        value=done,
                    )
                )
            return dict(model.ask(self._space).params)

    def restore(self, trial_id: str, config: dict[str, Any]) -> None:
        self._count += 1
        key = f"{self._run_key}/{trial_id}"
        for frozen in self._study.get_trials(deepcopy=False):  # a kept study already has it
            if frozen.user_attrs.get(TRIAL_ATTR) == key:
                self._reported[trial_id] = dict(frozen.intermediate_values)
                self._params[trial_id] = dict(frozen.params)
                if frozen.state == self._optuna.trial.TrialState.COMPLETE and frozen.value is not None:
                    self._completed[trial_id] = float(frozen.value)
                if not frozen.state.is_finished():
                    self._trials[trial_id] = self._optuna.trial.Trial(self._study, frozen._trial_id)
                return
        self._ask(trial_id, config)

    # -- learning --------------------------------------------------------------------------
    def rung_finished(self, epochs: int, metrics: dict[str, float | None], promoted: list[str] | None) -> None:
        states = self._optuna.trial.TrialState
        for trial_id, value in metrics.items():
            trial = self._trials.get(trial_id)
            if trial is None:  # finished in a kept study before a resume
                continue
            reported = self._reported.setdefault(trial_id, {})
            if value is not None and math.isfinite(value) and epochs not in reported:
                trial.report(float(value), epochs)
                reported[epochs] = float(value)
            if promoted is not None and trial_id in promoted:
                continue
            del self._trials[trial_id]
            last = reported[max(reported)] if reported else None
            if promoted is None and value is not None and math.isfinite(value):
                self._study.tell(trial, float(value), skip_if_finished=True)
                self._completed[trial_id] = float(value)
            elif last is not None:
                self._study.tell(trial, state=states.PRUNED, skip_if_finished=True)
            else:
                self._study.tell(trial, state=states.FAIL, skip_if_finished=True)


def make_config_source(spec: JobSpec, *, run_key: str = "run") -> ConfigSource:
    """The spec's configuration source (raises :class:`SpecError` if it needs Optuna and Optuna is missing)."""
    if spec.search.uses_optuna:
        return OptunaSource(spec, run_key=run_key)
    return RandomSource(spec)


def check_search(spec: JobSpec) -> None:
    """Fail fast (before planning or starting anything) when the spec's sampler cannot be built here."""
    if spec.search.uses_optuna:
        _import_optuna(spec.search.sampler if spec.search.sampler != "random" else "random with a storage")
