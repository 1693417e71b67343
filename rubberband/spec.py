"""The job spec: what to tune, how (SHA / Hyperband), by when and where.

Loaded from YAML and validated with pydantic; every problem becomes a one-line
:class:`~rubberband.errors.SpecError` naming the field, its YAML line and the fix.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rubberband.clouds import CLOUDS as KNOWN_CLOUDS
from rubberband.clouds import DEFAULT_CLOUD
from rubberband.credentials import URL_LOGIN_RE, refuse_requirement_credentials
from rubberband.errors import InputError, SpecError
from rubberband.units import parse_duration

CLOUDS = tuple(KNOWN_CLOUDS)


def _known_cloud(name: str) -> str:
    if name not in KNOWN_CLOUDS:
        raise ValueError(f"unknown cloud {name!r}; use {', '.join(KNOWN_CLOUDS)}")
    return name


#: A cloud catalogs/clouds.yaml knows.
KnownCloud = Annotated[str, AfterValidator(_known_cloud)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class UniformParam(_Strict):
    type: Literal["uniform"]
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> "UniformParam":
        if not self.low < self.high:
            raise ValueError("low must be smaller than high")
        return self


class LogUniformParam(_Strict):
    type: Literal["loguniform"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "LogUniformParam":
        if not self.low < self.high:
            raise ValueError("low must be smaller than high")
        return self


class IntParam(_Strict):
    type: Literal["int"]
    low: int
    high: int

    @model_validator(mode="after")
    def _ordered(self) -> "IntParam":
        if not self.low <= self.high:
            raise ValueError("low must not exceed high")
        return self


class ChoiceParam(_Strict):
    type: Literal["choice"]
    values: list[Any] = Field(min_length=1)


Param = Annotated[Union[UniformParam, LogUniformParam, IntParam, ChoiceParam], Field(discriminator="type")]


class Metric(_Strict):
    name: str = Field(min_length=1)
    mode: Literal["min", "max"]


class SchedulerSpec(_Strict):
    """Successive halving (``sha``), Hyperband (``hyperband``, brackets derived from R and η) or ASHA
    (``asha``: asynchronous successive halving, Ray Tune's ``ASHAScheduler``, one bracket of ``trials``
    with rungs at min_epochs·η^k up to max_epochs, planned as an elastic cluster that shrinks rung by rung).

    ``brackets`` (Hyperband): ``parallel`` runs the brackets side by side, sharing instances
    (default); ``sequential`` runs them one after another. SHA and ASHA ignore it.
    """

    kind: Literal["sha", "hyperband", "asha"] = "sha"
    # Upper bounds keep a typo (trials: 1000000000000) from planning for hours; raise them if a real job needs it.
    trials: int | None = Field(default=None, ge=1, le=100_000)
    eta: int = Field(default=3, ge=2, le=1000)
    min_epochs: int = Field(default=1, ge=1, le=1_000_000)
    max_epochs: int = Field(ge=1, le=1_000_000)
    brackets: Literal["parallel", "sequential"] = "parallel"

    @model_validator(mode="after")
    def _consistent(self) -> "SchedulerSpec":
        if self.min_epochs > self.max_epochs:
            raise ValueError("min_epochs must not exceed max_epochs")
        if self.kind in ("sha", "asha") and self.trials is None:
            raise ValueError(f"trials is required for kind: {self.kind}")
        return self


class SearchSpec(_Strict):
    """How configurations are proposed: ``random`` (numpy, the default) or Optuna's ``tpe`` / ``qmc``.

    A sampler is told every rung result as it comes in; ``tpe`` (which learns from them) is asked
    for each configuration as its trial starts, ``random`` / ``qmc`` for a bracket's when it opens
    (TPE with Hyperband is BOHB; see :mod:`rubberband.search`). ``storage`` (an Optuna storage URL) keeps the
    study; it needs Optuna even with ``sampler: random``.
    """

    sampler: Literal["random", "tpe", "qmc"] = "random"
    seed: int | None = None  # default: the spec's seed
    storage: str | None = Field(default=None, min_length=1)
    study_name: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _named_study_needs_storage(self) -> "SearchSpec":
        if self.study_name is not None and self.storage is None:
            raise ValueError("study_name needs a storage URL (e.g. storage: sqlite:///study.db)")
        return self

    @property
    def uses_optuna(self) -> bool:
        return self.sampler != "random" or self.storage is not None


class TrackingSpec(_Strict):
    """Where each trial is also logged, for the tools people already watch (rubberband.executor.tracking).

    ``tensorboard: true`` writes TensorBoard event files under ``RUN_DIR/tensorboard/<trial>`` (the
    ``tensorboard`` extra: tensorboardX, no torch); ``mlflow: URI`` logs each trial as an MLflow run of the
    experiment ``mlflow_experiment`` (default: the spec's name) at that tracking URI (the ``mlflow`` extra).
    Both are off unless named. The URI is written into the run's journal with the spec, so it must carry no
    login: MLflow reads ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``.
    """

    tensorboard: bool = False
    mlflow: str | None = Field(default=None, min_length=1)
    mlflow_experiment: str | None = Field(default=None, min_length=1)

    @field_validator("mlflow")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _URI_RE.match(value):
            raise ValueError(
                f"{value!r} is not a tracking URI; write e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db"
            )
        if URL_LOGIN_RE.search(value):
            raise ValueError(
                "the URI carries a login, which would be written into the run's journal; remove it and set "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead"
            )
        return value

    @model_validator(mode="after")
    def _experiment_needs_uri(self) -> "TrackingSpec":
        if self.mlflow_experiment is not None and self.mlflow is None:
            raise ValueError("mlflow_experiment needs a tracking URI (e.g. mlflow: http://127.0.0.1:5000)")
        return self

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.mlflow is not None


#: A URI's scheme and the rest, without spaces (http://host:5000, sqlite:///mlflow.db, databricks, file:///runs).
_URI_RE = re.compile(r"^(databricks(-uc)?|[A-Za-z][A-Za-z0-9+.-]*:\S+)$")


class ResourceSpec(_Strict):
    clouds: list[KnownCloud] = Field(default_factory=lambda: [DEFAULT_CLOUD], min_length=1)
    regions: list[str] | None = None
    instance_types: list[str] | None = None
    spot: bool = False
    #: slack kept in reserve beyond one restart before a spot trial moves to on-demand (SpotPolicy.margin_s):
    #: a larger margin gives up on spot earlier, trading cost for deadline safety
    spot_margin_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    max_workers_per_trial: int = Field(default=8, ge=1, le=1024)

    @field_validator("spot_margin_s", mode="before")
    @classmethod
    def _margin(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected a duration such as 5m, 90s or seconds")
        return parse_duration(value) if isinstance(value, str) and value.strip() not in ("0", "") else value


class JobSpec(_Strict):
    """A validated job spec. Paths are absolute after :func:`load_spec`."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    train: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    metric: Metric
    search_space: dict[str, Param] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    scheduler: SchedulerSpec
    #: fixed configurations, run first (before any sampled one); with no search_space, the only ones
    trials: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    search: SearchSpec = Field(default_factory=SearchSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    deadline_s: float
    confidence: float = Field(default=0.95, gt=0, lt=1)
    budget_usd: float | None = Field(default=None, gt=0)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    profile: str | None = None
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    #: The training code's own packages (PEP 508 strings, e.g. "transformers==4.46.0"), installed on every
    #: cloud worker at boot next to the pinned Ray and torch (docs/clouds.md).
    requirements: list[str] = Field(default_factory=list)
    base_dir: str = "."

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        from packaging.requirements import InvalidRequirement, Requirement

        for item in value:
            try:
                Requirement(item)
            except InvalidRequirement as exc:
                raise ValueError(
                    f"{item!r} is not a PEP 508 requirement ({str(exc).splitlines()[0]}); write "
                    f"e.g. 'transformers==4.46.0'"
                ) from None
            if item.strip().startswith("-"):
                raise ValueError(f"{item!r}: pip options are not allowed, only package requirements")
            try:
                refuse_requirement_credentials(item)
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("deadline_s", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> float:
        return parse_duration(value)

    @property
    def train_module(self) -> str:
        return self.train.split(":", 1)[0]

    @property
    def train_function(self) -> str:
        return self.train.split(":", 1)[1]

    def profile_path(self) -> Path | None:
        if self.profile is None:
            return None
        path = Path(self.profile)
        return path if path.is_absolute() else Path(self.base_dir) / path

    def sha256(self) -> str:
        """Stable digest of the spec's content (not its location), to tie plans and runs to it."""
        payload = self.model_dump(mode="json", exclude={"base_dir"})
        # fields added later leave the digests of specs written before them as they were
        defaults = (
            ("trials", None),
            ("search", SearchSpec().model_dump(mode="json")),
            ("tracking", TrackingSpec().model_dump(mode="json")),
            ("requirements", []),
        )
        for name, default in defaults:
            if payload.get(name) == default:
                del payload[name]
        if payload["resources"].get("spot_margin_s") == 0:
            del payload["resources"]["spot_margin_s"]
        if payload["scheduler"].get("brackets") == "parallel":
            del payload["scheduler"]["brackets"]
        text = yaml.safe_dump(payload, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


# -- loading ---------------------------------------------------------------------------------

_FIELD_ALIASES = {"deadline": "deadline_s", "budget": "budget_usd"}


def _line_index(node: yaml.Node, prefix: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path of a composed YAML document (YAML field names) to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            out[path] = key_node.start_mark.line + 1
            _line_index(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[prefix + (i,)] = item.start_mark.line + 1
            _line_index(item, prefix + (i,), out)
    return out


def _describe(error: dict, lines: dict[tuple, int], source: str) -> str:
    loc = [str(p) for p in error["loc"] if not (isinstance(p, str) and p in _TAGS)]
    yaml_loc = tuple(_YAML_NAMES.get(p, p) if i == 0 else p for i, p in enumerate(loc))
    line = None
    for cut in range(len(yaml_loc), 0, -1):
        key = tuple(int(p) if p.isdigit() else p for p in yaml_loc[:cut])
        if key in lines:
            line = lines[key]
            break
    field = ".".join(yaml_loc) or "(top level)"
    where = f"{source}:{line}" if line else source
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field; remove it or check its spelling"
    elif error["type"] == "missing":
        message = "required field is missing; add it"
    elif error["type"] == "union_tag_invalid":
        message = "type must be one of uniform, loguniform, int, choice"
    elif error["type"] in ("bool_parsing", "bool_type"):
        message = "must be true or false"
    elif error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = "must be a mapping of fields (name: value); see the README's job spec"
    elif error["type"] == "literal_error" and "expected" in error.get("ctx", {}):
        message = f"must be one of {error['ctx']['expected']}"
    return f"{where}: spec field '{field}': {message}"


_TAGS = {"uniform", "loguniform", "int", "choice"}
_YAML_NAMES = {v: k for k, v in _FIELD_ALIASES.items()}


def parse_spec(
    data: Any, *, source: str = "<spec>", base_dir: str | Path = ".", lines: dict[tuple, int] | None = None
) -> JobSpec:
    """Validate an already-parsed spec mapping; raise :class:`SpecError` on the first problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a YAML mapping of fields (name, train, metric, ...)")
    data = {_FIELD_ALIASES.get(k, k): v for k, v in data.items()}
    if "deadline_s" not in data:
        raise SpecError(f"{source}: spec field 'deadline': required field is missing; add e.g. deadline: 2h")
    data["base_dir"] = str(Path(base_dir).resolve())
    sched = data.get("scheduler")
    if (
        isinstance(sched, dict)
        and sched.get("kind", "sha") in ("sha", "asha")
        and "trials" not in sched
        and isinstance(data.get("trials"), list)
    ):
        # (A)SHA over exactly the listed configurations
        data["scheduler"] = {**sched, "trials": len(data["trials"])}
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_describe(exc.errors()[0], lines or {}, source)) from None
    problem = _scheduler_problem(spec) or _search_problem(spec)
    if problem is not None:
        loc, message = problem
        raise SpecError(_describe({"loc": loc, "msg": message, "type": "value_error"}, lines or {}, source))
    return spec


def _scheduler_problem(spec: JobSpec) -> tuple[tuple, str] | None:
    """(field location, message) where the scheduler cannot run on the spec's resources, or None.

    ASHA is planned and run on on-demand instances only: its phases release instances as the rung ladder
    empties, with no spot model or fall-back policy behind them (SHA's spot stages have both)."""
    if spec.scheduler.kind == "asha" and spec.resources.spot:
        return ("resources", "spot"), (
            "scheduler.kind asha runs on on-demand instances; set resources.spot: false or use kind: sha"
        )
    return None


def _first_stage_trials(sched: SchedulerSpec) -> int:
    """How many trials the schedule starts (every bracket's first stage)."""
    from rubberband.planner.schedule import stages_for

    stages = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    return sum(s.trials for s in stages if s.index == 0)


def _outside(param: Any, value: Any) -> str | None:
    """Why ``value`` is not in ``param``'s domain, or None."""
    if isinstance(param, ChoiceParam):
        return None if value in param.values else f"{value!r} is not one of {param.values}"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(param, IntParam) and not (numeric and float(value).is_integer()):
        return f"{value!r} is not an integer"
    if not numeric:
        return f"{value!r} is not a number"
    if not param.low <= value <= param.high:
        return f"{value!r} is outside [{param.low}, {param.high}]"
    return None


_OPTUNA_CHOICE_TYPES = (type(None), bool, int, float, str)


def _search_problem(spec: JobSpec) -> tuple[tuple, str] | None:
    """(field location, message) of the first inconsistency between search_space, trials and search."""
    if not spec.search_space and spec.trials is None:
        return ("search_space",), "required field is missing; add it (or list fixed configurations under trials:)"
    for i, fixed in enumerate(spec.trials or []):
        for name, value in fixed.items():
            if spec.search_space and name not in spec.search_space:
                return ("trials", str(i), name), (
                    "not in search_space; add it there or remove it from this configuration"
                )
            if name in spec.search_space:
                why = _outside(spec.search_space[name], value)
                if why is not None:
                    return ("trials", str(i), name), f"{why} (search_space.{name}); fix the value"
    if spec.trials is not None:
        needed = _first_stage_trials(spec.scheduler)
        if len(spec.trials) > needed:
            return ("trials",), (
                f"lists {len(spec.trials)} configurations but the {spec.scheduler.kind} schedule "
                f"starts only {needed} trials; remove some or raise scheduler.trials"
            )
        if not spec.search_space and len(spec.trials) < needed:
            return ("trials",), (
                f"lists {len(spec.trials)} configurations but the {spec.scheduler.kind} schedule "
                f"starts {needed} trials; list more, or add a search_space to sample the rest"
            )
    if spec.search.uses_optuna:
        for name, param in spec.search_space.items():
            if isinstance(param, ChoiceParam) and not all(isinstance(v, _OPTUNA_CHOICE_TYPES) for v in param.values):
                return ("search_space", name, "values"), (
                    "Optuna samplers take only strings, numbers, booleans "
                    "or null as choices; use those or sampler: random"
                )
    return None


#: Values (mapping entries, list items, scalars) a spec may hold once its YAML aliases are expanded: a job spec holds
#: hundreds; nine lines of nested aliases ("billion laughs") hold a billion and used to fill the memory.
MAX_SPEC_VALUES = 100_000


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` holds with every alias expanded, counted once per distinct node (``sizes``)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes) for item in node.value)
    sizes[id(node)] = size = min(size, MAX_SPEC_VALUES + 1)
    return size


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML job spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist; pass the path of a YAML job spec") from None
    except UnicodeDecodeError:
        raise SpecError(f"spec file {path} is not UTF-8 text; pass a YAML job spec saved as UTF-8") from None
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror}") from None
    try:
        node = yaml.compose(text)
        if node is not None and _expanded_size(node, {}) > MAX_SPEC_VALUES:
            raise SpecError(
                f"{path}: the spec holds more than {MAX_SPEC_VALUES} values once its YAML aliases are expanded; "
                f"write it out without nested aliases"
            )
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{where}: not valid YAML ({problem}); fix the syntax") from None
    except RecursionError:
        raise SpecError(f"{path}: the spec is nested too deeply to read; a job spec is a few levels deep") from None
    lines = _line_index(node) if node is not None else {}
    return parse_spec(data, source=str(path), base_dir=path.parent, lines=lines)


def sample_config(space: dict[str, Any], rng) -> dict[str, Any]:
    """Draw one configuration from the search space with a numpy ``Generator``."""
    config: dict[str, Any] = {}
    for name, param in space.items():
        if isinstance(param, UniformParam):
            config[name] = float(rng.uniform(param.low, param.high))
        elif isinstance(param, LogUniformParam):
            config[name] = float(math.exp(rng.uniform(math.log(param.low), math.log(param.high))))
        elif isinstance(param, IntParam):
            config[name] = int(rng.integers(param.low, param.high + 1))
        else:
            config[name] = param.values[int(rng.integers(len(param.values)))]
    return config
