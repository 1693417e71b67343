"""Bad input, generated: specs, profiles, plan files, catalogs and journals broken one field at a time.

Every command that reads them must end with exit code 2, one line naming the field, no traceback and
nothing written. The CLI runs in-process here (``rubberband.cli.run``, the function ``main`` calls) with
bounded examples; ``test_bad_input_e2e.py`` runs a few of the same cases through the real entry point.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import EXAMPLES, run_cli_here

SETTINGS = settings(
    max_examples=int(os.environ.get("RUBBERBAND_FUZZ_EXAMPLES", "30")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- the CLI, in-process ---------------------------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str

    def refused(self) -> str:
        """Assert a clean refusal (exit 2, one line, no traceback); return that line."""
        assert "Traceback" not in self.err + self.out, self.err[-3000:]
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert self.code == 2, f"exit {self.code}: {self.err[-2000:]}"
        assert len(lines) == 1 and lines[0].startswith("rubberband: error: "), self.err[-2000:]
        return lines[0]


def invoke(
    *args: Any,
    env: dict[str, str | None] | None = None,
    cwd: Path | None = None,
    entry: Callable[[list[str]], int] | None = None,
) -> Result:
    """The CLI in this process (conftest.run_cli_here, ``entry`` standing for the entry point), 200 columns wide,
    with ``env`` over this process's environment (a None value unsets the variable)."""
    whole = {**os.environ, "COLUMNS": "200"}
    for key, value in (env or {}).items():
        if value is None:
            whole.pop(key, None)
        else:
            whole[key] = value
    result = run_cli_here(*args, env=whole, cwd=cwd, entry=entry)
    return Result(result.returncode, result.stdout, result.stderr)


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    """A fresh directory per example (hypothesis runs many examples in one test)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as name:
        yield Path(name)


# -- valid documents to break --------------------------------------------------------------------------------

GOOD_PROFILE = EXAMPLES / "profiles" / "quickstart_local.json"


def good_spec() -> dict:
    spec = yaml.safe_load((EXAMPLES / "quickstart_local.yaml").read_text())
    spec["profile"] = str(GOOD_PROFILE)
    spec["budget"] = 5.0
    return spec


def good_profile() -> dict:
    return json.loads(GOOD_PROFILE.read_text())


@pytest.fixture(scope="module")
def good_plan(tmp_path_factory) -> tuple[Path, Path]:
    """(spec path, plan path) of a valid local job and its plan."""
    base = tmp_path_factory.mktemp("goodplan")
    spec_path = base / "job.yaml"
    spec_path.write_text(yaml.safe_dump(good_spec()))
    result = invoke("plan", spec_path, "--samples", "10", "--out", base / "plan.json")
    assert result.code == 0, result.err
    return spec_path, base / "plan.json"


# -- one field broken ------------------------------------------------------------------------------------------

Path_ = tuple  # a path into a document: keys and list indexes


def paths(doc: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every node's path (not the root)."""
    out: list[Path_] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.append(prefix + (key,))
            out.extend(paths(value, prefix + (key,)))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):  # a few items of long lists (latencies) are enough
            out.append(prefix + (i,))
            out.extend(paths(value, prefix + (i,)))
    return out


def get(doc: Any, path: Path_) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def free(path: Path_, free_prefixes: tuple[Path_, ...]) -> bool:
    """Inside a free-form part (any value is valid there)."""
    return any(path[: len(p)] == p for p in free_prefixes)


@dataclass
class Break:
    doc: Any
    field: str  # what the error line must name
    how: str


@st.composite
def broken(draw, doc: Any, free_prefixes: tuple[Path_, ...] = (), required: tuple[Path_, ...] = ()) -> Break:
    """``doc`` broken in one field so that it is surely invalid: a value of the wrong type, an unknown key,
    or a required field removed. ``field`` is the top-level field the error must name."""
    doc = copy.deepcopy(doc)
    how = draw(st.sampled_from(["wrong type", "unknown key", "missing"] if required else ["wrong type", "unknown key"]))
    if how == "missing":
        path = draw(st.sampled_from(required))
        del get(doc, path[:-1])[path[-1]]
        return Break(doc, str(path[-1]), how)
    candidates = [p for p in paths(doc) if not free(p, free_prefixes)]
    if how == "unknown key":
        parents = [()] + [p for p in candidates if isinstance(get(doc, p), dict)]
        parent = draw(st.sampled_from(parents))
        key = draw(
            st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12).filter(
                lambda k: k not in get(doc, parent) and k.lower() not in ("deadline", "budget")
            )
        )
        get(doc, parent)[f"x{key}"] = {"rb_unknown": 1}  # a dict: not a valid value of any typed field either
        return Break(doc, f"x{key}" if not parent else str(parent[0]), how)
    path = draw(st.sampled_from(candidates))
    value = get(doc, path)
    get(doc, path[:-1])[path[-1]] = [[1], {"a": None}] if isinstance(value, dict) else {"rb_wrong": [1]}
    return Break(doc, str(path[0]), how)


# -- specs -----------------------------------------------------------------------------------------------------

SPEC_FREE = (("config",),)
SPEC_REQUIRED = (
    ("name",),
    ("train",),
    ("metric",),
    ("metric", "name"),
    ("search_space",),
    ("scheduler",),
    ("scheduler", "max_epochs"),
    ("deadline",),
)

# Out of range (and malformed) values of single fields: (path, value, what the error line names).
SPEC_OUT_OF_RANGE = [
    (("scheduler", "eta"), 1, "scheduler.eta"),
    (("scheduler", "trials"), 0, "scheduler.trials"),
    (("scheduler", "trials"), 10**12, "scheduler.trials"),
    (("scheduler", "max_epochs"), 10**9, "scheduler.max_epochs"),
    (("scheduler", "min_epochs"), 0, "scheduler.min_epochs"),
    (("scheduler", "kind"), "bohb", "scheduler.kind"),
    (("confidence",), 1.5, "confidence"),
    (("confidence",), 0, "confidence"),
    (("budget",), -1, "budget"),
    (("deadline",), "-5m", "deadline"),
    (("deadline",), "soon", "deadline"),
    (("deadline",), float("inf"), "deadline"),
    (("deadline",), float("nan"), "deadline"),
    (("deadline",), 10**400, "deadline"),
    (("deadline",), "1e999", "deadline"),
    (("name",), "bad name!", "name"),
    (("name",), "ünïcødé✓", "name"),
    (("train",), "no_colon", "train"),
    (("metric", "mode"), "median", "metric.mode"),
    (("resources", "clouds"), [], "resources.clouds"),
    (("resources", "clouds"), ["azure"], "resources.clouds"),
    (("resources", "max_workers_per_trial"), 10**30, "resources.max_workers_per_trial"),
    (("search_space", "lr", "low"), 0, "search_space.lr"),
    (("search_space", "lr", "high"), 1e-9, "search_space.lr"),
    (("search_space", "lr", "type"), "gaussian", "search_space.lr"),
    (("search_space", "lr", "high"), float("inf"), "search_space.lr"),  # planned, then an OverflowError mid-run
    (("confidence",), float("nan"), "confidence"),
    (("seed",), -1, "seed"),
    (("seed",), 2**64, "seed"),
    (("scheduler", "eta"), 10**6, "scheduler.eta"),
]

SPEC_COMMANDS = ["plan", "run", "dry-run", "profile"]


def spec_command(which: str, spec: Path, work: Path, good_plan: tuple[Path, Path]) -> tuple[list, list[Path]]:
    """argv for a command reading ``spec``, and the paths it must not create."""
    out = work / "out"
    if which == "plan":
        return [
            "plan",
            spec,
            "--profile",
            GOOD_PROFILE,
            "--samples",
            "10",
            "--out",
            out / "plan.json",
            "--report",
            out / "report",
        ], [out]
    if which == "run":
        return ["run", spec, "--plan", good_plan[1], "--run-dir", out / "run", "--yes"], [out]
    if which == "dry-run":
        return ["run", spec, "--dry-run", "--cloud", "aws", "--plan", good_plan[1]], [out]
    return ["profile", spec, "--cloud", "local", "--out", work / "p.json"], [work / "p.json"]


def write_text(work: Path, name: str, text: str) -> Path:
    path = work / name
    path.write_text(text)
    return path


@SETTINGS
@given(data=st.data(), which=st.sampled_from(SPEC_COMMANDS))
def test_a_spec_broken_in_one_field_is_refused_by_every_command(data, which, good_plan):
    bad = data.draw(broken(good_spec(), SPEC_FREE, SPEC_REQUIRED))
    with workdir() as work:
        spec = write_text(work, "job.yaml", yaml.safe_dump(bad.doc, allow_unicode=True))
        argv, absent = spec_command(which, spec, work, good_plan)
        line = invoke(*argv).refused()
        assert bad.field in line, (bad.how, line)
        assert not any(p.exists() for p in absent)


@pytest.mark.parametrize("path, value, field", SPEC_OUT_OF_RANGE)
def test_a_spec_field_out_of_range_is_named(path, value, field, good_plan, tmp_path):
    doc = good_spec()
    get(doc, path[:-1])[path[-1]] = value
    spec = write_text(tmp_path, "job.yaml", yaml.safe_dump(doc, allow_unicode=True))
    for which in SPEC_COMMANDS:
        argv, absent = spec_command(which, spec, tmp_path, good_plan)
        line = invoke(*argv).refused()
        assert f"'{field}" in line, (which, line)
        assert not any(p.exists() for p in absent)


@SETTINGS
@given(cut=st.integers(min_value=0), garbage=st.sampled_from(["", ":", "\t", "- [", "{{", "\x00", "é: [1, 2"]))
def test_malformed_yaml_is_refused(cut, garbage, good_plan):
    from rubberband.errors import RubberbandError
    from rubberband.spec import load_spec

    text = yaml.safe_dump(good_spec())
    cut %= len(text)
    with workdir() as work:
        spec = write_text(work, "job.yaml", text[:cut] + garbage)
        try:  # a cut at a line end that drops only optional fields leaves a valid spec: planning it is right
            load_spec(spec)
            valid = True
        except RubberbandError:
            valid = False
        argv, absent = spec_command("plan", spec, work, good_plan)
        result = invoke(*argv)
        if valid:
            assert result.code in (0, 3), result.err[-2000:]  # planned (or an infeasible deadline, said cleanly)
            return
        line = result.refused()
        assert "job.yaml" in line
        assert not any(p.exists() for p in absent)


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@SETTINGS
@given(data=st.data(), value=ANY_VALUE, delete=st.booleans())
def test_any_value_in_any_spec_field_plans_or_is_refused_cleanly(data, value, delete, good_plan):
    """Whatever one field holds (unicode, huge numbers, inf, nothing), `plan` either plans or refuses in one
    line: never a traceback, never a half-written output."""
    doc = good_spec()
    path = data.draw(st.sampled_from([p for p in paths(doc) if not free(p, SPEC_FREE)]))
    if delete:
        del get(doc, path[:-1])[path[-1]]
    else:
        get(doc, path[:-1])[path[-1]] = value
    with workdir() as work:
        spec = write_text(work, "job.yaml", yaml.safe_dump(doc, allow_unicode=True))
        result = invoke("plan", spec, "--profile", GOOD_PROFILE, "--samples", "10", "--out", work / "plan.json")
        assert "Traceback" not in result.err
        if result.code != 0:
            assert result.code in (2, 3), result.err[-2000:]
            assert len(result.err.strip().splitlines()) == 1, result.err[-2000:]
            assert not (work / "plan.json").exists()


# -- profiles --------------------------------------------------------------------------------------------------

PROFILE_FREE = (("machine",), ("fitted",))
PROFILE_REQUIRED = (
    ("workload",),
    ("workload", "dataset_size"),
    ("workload", "name"),
    ("measurements",),
    ("measurements", 0, "workers"),
    ("measurements", 0, "iteration_latencies_s"),
)


@SETTINGS
@given(data=st.data())
def test_a_profile_broken_in_one_field_is_refused(data, good_plan):
    bad = data.draw(broken(good_profile(), PROFILE_FREE, PROFILE_REQUIRED))
    with workdir() as work:
        profile = write_text(work, "profile.json", json.dumps(bad.doc, ensure_ascii=False))
        result = invoke("plan", good_plan[0], "--profile", profile, "--samples", "10", "--out", work / "plan.json")
        line = result.refused()
        assert bad.field in line, (bad.how, line)
        assert not (work / "plan.json").exists()


@pytest.mark.parametrize(
    "path, value",
    [
        (("workload", "dataset_size"), 0),
        (("workload", "batch_size_per_worker"), -3),
        (("workload", "dataset_size"), float("inf")),
        (("measurements", 0, "iteration_latencies_s"), [float("nan")]),
        (("measurements", 0, "workers"), 0),
        (("measurements", 0, "iteration_latencies_s"), []),
        (("measurements", 0, "iteration_latencies_s"), [-1.0]),
        (("measurements", 0, "source"), "guessed"),
        (("schema_version",), 99),
        (("workload", "restart_overhead_s"), -1.0),
        (("measurements", 0, "nodes"), 5),
        # infinities the fit or the planner met as IndexError / "Residuals are not finite" tracebacks
        (("startup", 0, "samples_s"), [float("inf")]),
        (("measurements", 0, "iteration_latencies_s"), [float("inf")]),
        (("workload", "restart_overhead_s"), float("inf")),
    ],
)
def test_a_profile_field_out_of_range_is_named(path, value, good_plan, tmp_path):
    doc = good_profile()
    get(doc, path[:-1])[path[-1]] = value
    profile = write_text(tmp_path, "profile.json", json.dumps(doc))
    line = invoke("plan", good_plan[0], "--profile", profile, "--out", tmp_path / "plan.json").refused()
    assert str(path[0]) in line
    assert not (tmp_path / "plan.json").exists()


@SETTINGS
@given(cut=st.integers(min_value=1))
def test_a_truncated_profile_or_plan_is_refused(cut, good_plan):
    with workdir() as work:
        text = GOOD_PROFILE.read_text().rstrip()
        profile = write_text(work, "profile.json", text[: cut % (len(text) - 1)])
        result = invoke("plan", good_plan[0], "--profile", profile, "--out", work / "plan.json")
        assert "profile" in result.refused() and not (work / "plan.json").exists()
        text = good_plan[1].read_text().rstrip()
        plan = write_text(work, "plan.json", text[: cut % (len(text) - 1)])
        assert "plan" in invoke("report", plan, "--out", work / "report").refused()
        assert not (work / "report").exists()


# -- plan files ------------------------------------------------------------------------------------------------

PLAN_FREE = (("spec",),)


@SETTINGS
@given(data=st.data(), which=st.sampled_from(["run", "report"]))
def test_a_plan_file_broken_in_one_field_is_refused(data, which, good_plan):
    spec_path, plan_path = good_plan
    bad = data.draw(broken(json.loads(plan_path.read_text()), PLAN_FREE))
    with workdir() as work:
        plan = write_text(work, "plan.json", json.dumps(bad.doc))
        if which == "run":
            line = invoke("run", spec_path, "--plan", plan, "--run-dir", work / "run", "--yes").refused()
        else:
            line = invoke("report", plan, "--out", work / "run").refused()
        assert bad.field in line, (bad.how, line)
        assert not (work / "run").exists()


@pytest.mark.parametrize(
    "spec_change, plan_change, says",
    [
        ({"clouds": ["aws"]}, None, "resources.clouds (aws) does not allow"),
        ({"instance_types": ["local.cpu4"]}, None, "resources.instance_types (local.cpu4) does not allow"),
        ({"regions": ["elsewhere"]}, None, "resources.regions (elsewhere) does not allow"),
        (None, {"instances": 1_000_000_000}, "more instances than the plan's largest stage can use"),
    ],
)
def test_a_plan_the_spec_rules_out_is_refused_before_anything_starts(spec_change, plan_change, says, good_plan):
    """`run --plan` with a plan made for another spec (another cloud, types or regions), or with a stage of a
    billion instances, exits 2 in one line naming the stage and the spec field, and starts nothing: such a plan
    used to run (a billion instances filled 20 GB before it was killed)."""
    spec_path, plan_path = good_plan
    with workdir() as work:
        spec = yaml.safe_load(spec_path.read_text())
        spec["resources"] = {**spec["resources"], **(spec_change or {})}
        plan = json.loads(plan_path.read_text())
        plan["stages"][0].update(plan_change or {})
        spec_file = write_text(work, "job.yaml", yaml.safe_dump(spec))
        line = invoke(
            "run",
            spec_file,
            "--plan",
            write_text(work, "plan.json", json.dumps(plan)),
            "--run-dir",
            work / "run",
            "--yes",
        ).refused()
        assert "stage 0" in line and says in line and "re-plan" in line, line
        assert not (work / "run").exists()


def test_a_static_plan_keeps_its_largest_stages_instances_through_the_later_ones(good_plan):
    """The instance bound is the plan's largest stage: a static plan (the planner's own choice where resizing saves
    nothing) holds the first stage's cluster to the end, its last stage's one trial on every instance."""
    from rubberband.executor.plan_checks import check_plan_matches
    from rubberband.plan import load_plan
    from rubberband.spec import load_spec

    spec, plan = load_spec(good_plan[0]), load_plan(good_plan[1])
    largest = max(s.trials * s.workers_per_trial for s in plan.stages)
    assert largest > plan.stages[-1].trials * plan.stages[-1].workers_per_trial
    static = plan.model_copy(update={"stages": [s.model_copy(update={"instances": largest}) for s in plan.stages]})
    check_plan_matches(spec, static)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "is not UTF-8 text"),
        ("name: caf\u00e9\n".encode("latin-1"), "is not UTF-8 text"),
        (("a: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested too deeply"),
        (BOMB.encode(), "more than 100000 values once its YAML aliases are expanded"),
    ],
    ids=["binary", "latin-1", "nested", "alias-bomb"],
)
def test_a_spec_that_is_not_yaml_text_or_too_big_is_refused_in_one_line(content, says):
    """A binary or Latin-1 file, YAML nested thousands deep, and nine lines of nested aliases (a billion values,
    which filled 6 GB in a minute) are each one line, exit 2: they raised UnicodeDecodeError and RecursionError
    tracebacks, or ran until killed."""
    with workdir() as work:
        spec = work / "job.yaml"
        spec.write_bytes(content)
        line = invoke("plan", spec, "--out", work / "plan.json").refused()
        assert says is None or says in line, line
        assert not (work / "plan.json").exists()


def test_output_paths_are_checked_before_anything_is_written(good_plan):
    """A second output that cannot be written no longer leaves the first written (`plan --out A --report B`
    wrote A, then failed with a traceback), and a path through a file is one line, exit 2, wherever it is given."""
    spec_path, plan_path = good_plan
    with workdir() as work:
        (work / "afile").write_text("")
        (work / "folder").mkdir()
        cases = [
            (("--out", work / "plan.json", "--report", work / "afile" / "rep"), "is a file, not a folder"),
            (("--out", work / "folder"), "is a folder; give a file name"),
            (("--out", work / "afile" / "plan.json"), "is a file, not a folder"),
            (("--profile", work / "afile" / "p.json", "--out", work / "plan.json"), "Not a directory"),
            (("--seed", "-1", "--out", work / "plan.json"), "--seed"),
        ]
        for flags, says in cases:
            assert says in invoke("plan", spec_path, *flags).refused()
            assert not (work / "plan.json").exists()
        line = invoke(
            "run", spec_path, "--plan", plan_path, "--cloud", "sim", "--yes", "--run-dir", work / "afile"
        ).refused()
        assert "afile" in line and "File exists" in line
        # and a fresh folder below a missing one is still made
        assert invoke("plan", spec_path, "--samples", "10", "--out", work / "new" / "sub" / "plan.json").code == 0


# -- catalogs --------------------------------------------------------------------------------------------------

AWS_CSV = (Path(__file__).resolve().parents[1] / "rubberband" / "catalogs" / "aws.csv").read_text()


def aws_job(work: Path) -> tuple[Path, Path]:
    """A spec for aws and a profile whose devices cover its instance types."""
    doc = good_spec()
    doc["resources"] = {"clouds": ["aws"], "instance_types": ["g4dn.xlarge"]}
    profile = good_profile()
    profile.update(reference_device="CPU", device_speed={"CPU": 1.0, "T4": 4.0})
    return (write_text(work, "job.yaml", yaml.safe_dump(doc)), write_text(work, "profile.json", json.dumps(profile)))


@st.composite
def broken_csv(draw) -> tuple[str, str]:
    """(catalog text, what the error names): one cell, the header or the date line broken."""
    lines = AWS_CSV.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("InstanceType,"))
    header = lines[header_at].split(",")
    how = draw(st.sampled_from(["cell", "header", "date"]))
    if how == "date":
        return "\n".join(line for line in lines if not line.startswith("# date:")) + "\n", "date"
    if how == "header":
        column = draw(st.sampled_from(header))
        lines[header_at] = ",".join(c for c in header if c != column)
        return "\n".join(lines) + "\n", "column"
    row = draw(st.integers(header_at + 1, len(lines) - 1))
    column = draw(st.sampled_from(["Price", "SpotPrice", "vCPUs", "MemoryGiB", "AcceleratorCount", "InstanceType"]))
    value = draw(
        st.sampled_from(
            {
                "Price": ["", "-1", "abc", "1e999", "nan", "३x"],
                "SpotPrice": ["-2", "x", "inf"],
                "vCPUs": ["many", "-4"],
                "MemoryGiB": ["lots", "-1"],
                "AcceleratorCount": ["two", "-1", "1.5"],
                "InstanceType": [""],
            }[column]
        )
    )
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    return "\n".join(lines) + "\n", f":{row + 1}"


@SETTINGS
@given(bad=broken_csv(), which=st.sampled_from(["show", "plan"]))
def test_a_catalog_broken_in_one_field_is_refused(bad, which):
    text, names = bad
    with workdir() as work:
        (work / "catalogs").mkdir()
        write_text(work / "catalogs", "aws.csv", text)
        env = {"RUBBERBAND_CATALOG_DIR": str(work / "catalogs")}
        if which == "show":
            line = invoke("catalog", "show", "--cloud", "aws", env=env).refused()
        else:
            spec, profile = aws_job(work)
            line = invoke("plan", spec, "--profile", profile, "--out", work / "plan.json", env=env).refused()
            assert not (work / "plan.json").exists()
        assert "aws.csv" in line and names in line, line


# -- flags -----------------------------------------------------------------------------------------------------


@SETTINGS
@given(eta=st.integers(), r=st.integers(), big_r=st.integers(), trials=st.one_of(st.none(), st.integers()))
def test_schedule_flags_are_checked(eta, r, big_r, trials):
    args = ["schedule", "--eta", eta, "-r", r, "-R", big_r] + ([] if trials is None else ["--trials", trials])
    result = invoke(*args)
    assert "Traceback" not in result.err
    # without --trials SHA derives η^s_max from R and η (one survivor)
    valid = eta >= 2 and 1 <= r <= big_r and (trials is None or trials >= 1)
    if not valid:
        result.refused()


# -- journals (run --resume) ---------------------------------------------------------------------------------


def write_journal(run_dir: Path, spec_path: Path, plan_path: Path, *, finished: bool = True) -> list[dict]:
    """A run's journal: started, three instances requested (one ready), a trial with an epoch and a checkpoint."""
    from rubberband.executor import journal as J
    from rubberband.plan import load_plan
    from rubberband.spec import load_spec

    spec, plan = load_spec(spec_path), load_plan(plan_path)
    journal = J.Journal(run_dir)
    t = iter(range(1000, 2000))  # fixed times: the same journal, byte for byte, every example
    journal.record(
        J.RunStarted(
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=spec.deadline_s,
            pid=1,
            t=next(t),
        )
    )
    for i in range(3):
        journal.record(J.InstanceRequested(id=f"i{i}", instance_type="local.cpu2", price_hr=0.1, stage=0, t=next(t)))
    journal.record(J.InstanceReady(id="i0", t=next(t)))
    journal.record(J.TrialCreated(trial_id="t0", bracket=0, index=0, config={"lr": 0.01}, t=next(t)))
    journal.record(J.Epoch(trial_id="t0", epoch=0, metrics={"score": 0.5}, t=next(t)))
    journal.record(J.Checkpoint(trial_id="t0", epoch=0, path="ckpt/t0", t=next(t)))
    if finished:
        journal.record(J.RunFinished(reason="done", t=next(t)))
    return journal.events()


@st.composite
def corrupted(draw, text: bytes) -> bytes:
    """The journal cut short (a crash mid-write), one byte changed, or one event's field given a wrong type."""
    how = draw(st.sampled_from(["truncate", "byte", "field"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text) - 1))]
    if how == "byte":
        at = draw(st.integers(0, len(text) - 1))
        return text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1 :]
    lines = text.split(b"\n")
    at = draw(st.integers(0, len(lines) - 2))
    event = json.loads(lines[at])
    key = draw(st.sampled_from(sorted(event)))
    event[key] = draw(st.sampled_from([None, "x", [1], {"a": 1}, -1, 1e308]))
    lines[at] = json.dumps(event).encode()
    return b"\n".join(lines)


@SETTINGS
@given(data=st.data())
def test_a_damaged_journal_folds_or_is_refused_and_keeps_every_instance(data, good_plan):
    """Resuming reads the journal with ``read_state``: whatever the damage, it folds (skipping a torn line) or
    raises a one-line RunDirError naming the line; it changes nothing in the file, and every instance whose
    line is intact is still in the state (the run's record of what it started is never lost)."""
    from rubberband.errors import RunDirError
    from rubberband.executor import journal as J

    with workdir() as work:
        run_dir = work / "run"
        original = write_journal(run_dir, *good_plan)
        path = run_dir / J.JOURNAL_NAME
        damaged = data.draw(corrupted(path.read_bytes()))
        path.write_bytes(damaged)
        try:
            state = J.read_state(run_dir)
        except RunDirError as exc:
            assert "\n" not in str(exc) and "journal" in str(exc)
        else:
            intact = [e for e in J.iter_events(path) if e in original and e["type"] == J.INSTANCE_REQUESTED]
            assert {e["id"] for e in intact} <= set(state.instances)
        assert path.read_bytes() == damaged


@pytest.mark.parametrize("damage", ["torn first line", "damaged spec", "damaged instance", "garbage"])
def test_resume_on_a_damaged_journal_exits_2_in_one_line(damage, good_plan, tmp_path):
    from rubberband.executor import journal as J

    run_dir = tmp_path / "run"
    write_journal(run_dir, *good_plan, finished=False)
    path = run_dir / J.JOURNAL_NAME
    lines = path.read_text().splitlines()
    if damage == "torn first line":
        lines[0] = lines[0][:50]
    elif damage == "damaged spec":
        first = json.loads(lines[0])
        first["spec"]["scheduler"] = "sha"
        lines[0] = json.dumps(first)
    elif damage == "damaged instance":
        event = json.loads(lines[2])
        event["price_hr"] = {"usd": 1}
        lines[2] = json.dumps(event)
    else:
        lines = ["\x00\x01 not json"] * 3
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    line = invoke("run", "--resume", run_dir).refused()
    assert "journal" in line
    if damage == "damaged instance":
        assert f"{path}:3" in line
    assert path.read_bytes() == before


def test_a_torn_last_line_is_skipped_and_the_run_resumes_from_the_rest(good_plan, tmp_path):
    """The common crash: the executor died mid-write. The torn line is skipped; what came before stands."""
    from rubberband.executor import journal as J

    run_dir = tmp_path / "run"
    write_journal(run_dir, *good_plan, finished=True)
    path = run_dir / J.JOURNAL_NAME
    path.write_bytes(path.read_bytes()[:-7])  # the run_finished line, torn
    state = J.read_state(run_dir)
    assert not state.finished and set(state.instances) == {"i0", "i1", "i2"}
    J.Journal(run_dir).record(J.RunResumed(pid=2))  # a resumed executor starts a fresh line
    assert [e["type"] for e in J.iter_events(path)][-1] == J.RUN_RESUMED


# -- paths -----------------------------------------------------------------------------------------------------


def test_run_directories_are_made_absolute(tmp_path, monkeypatch):
    """`run --run-dir run1` and `--resume run1` (relative) name the same absolute directory: Ray's temp dirs
    under it must be absolute (the real run with a relative --run-dir is in test_executor_e2e)."""
    from rubberband.commands.run import resolve_run_dir

    (tmp_path / "run1").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_run_dir("run1") == tmp_path / "run1"
    monkeypatch.setenv("RUBBERBAND_RUNS_DIR", "runs")
    (tmp_path / "runs" / "r2").mkdir(parents=True)
    assert resolve_run_dir("r2") == tmp_path / "runs" / "r2"


# -- the test seams (injected by the tests' entry point, never taken from the command line or the environment) ----


def harness(*args: Any) -> Result:
    """The CLI through the tests' entry point (tests/cli_harness.py), in-process."""
    from cli_harness import main

    return invoke(*args, entry=main)


def test_the_real_cli_takes_no_test_boot():
    """Played boots are an object only the suite's entry points pass in: the CLI has no option for them."""
    assert "--test-boot" in invoke("run", "--test-boot", "local", "--attach", "nowhere").refused()  # no such option


def test_the_environment_plays_no_boot(tmp_path, monkeypatch):
    """The played boot is an object passed in: the variable that used to switch it on does nothing any more."""
    from played_boots import PlayedBoots

    from rubberband.cloud.backend import BackendSeams
    from rubberband.executor.backends import make_backend

    monkeypatch.setenv("RUBBERBAND_TEST_BOOT", "local")
    assert make_backend("aws", tmp_path, ["us-east-1"]).boots is None
    player = PlayedBoots()
    assert make_backend("aws", tmp_path, ["us-east-1"], seams=BackendSeams(boots=player)).boots is player


@pytest.mark.parametrize(
    "seam, value, says",
    [
        ("--trial-runtime", "not a module", "trial runtime 'not a module' is not a module name"),
        ("--trial-runtime", "rubberband..trials", "is not a module name"),
        ("--metadata-url", "169.254.169.254", "metadata URL '169.254.169.254' is not an http(s)://HOST[:PORT]/PATH"),
        ("--metadata-url", "ftp://127.0.0.1/", "is not an http(s)://"),
        ("--metadata-url", "http://127.0.0.1:port/", "is not an http(s)://"),
    ],
)
def test_a_malformed_seam_is_refused_in_one_line_and_the_real_cli_takes_none(seam, value, says):
    assert says in harness(seam, value, "run", "--attach", "nowhere").refused()
    assert seam in invoke("run", seam, value, "--attach", "nowhere").refused()  # no such option


def test_an_injected_trial_runtime_reaches_the_executor(good_plan, tmp_path):
    """The runtime module passed in is the one the run loads (one that does not import: refused before anything
    starts); the variable that used to name it does nothing any more."""
    spec, plan = good_plan
    result = harness(
        "--trial-runtime", "no_such_trial_runtime", "run", spec, "--plan", plan, "--yes", "--run-dir", tmp_path / "run"
    )
    assert "trial runtime module 'no_such_trial_runtime' cannot be imported" in result.refused()
    assert not (tmp_path / "run").exists()


def test_no_production_module_names_a_test_seams_variable():
    """The variables that used to switch the test seams on are read nowhere (issue #13, point 5)."""
    repo = Path(__file__).resolve().parents[1]
    gone = ("RUBBERBAND_TEST_BOOT", "RUBBERBAND_TRIAL_RUNTIME", "RUBBERBAND_METADATA_URL")
    named = [
        f"{path.relative_to(repo)}: {name}"
        for folder in ("rubberband", "cloud", "executor", "planner", "profiler")
        for path in sorted((repo / folder).rglob("*.py"))
        for name in gone
        if name in path.read_text()
    ]
    assert named == []


def test_the_environment_redirects_no_notice_watcher(tmp_path, monkeypatch):
    """The metadata server is the backend's, passed in: the variable that used to redirect it does nothing."""
    from rubberband.cloud.backend import BackendSeams
    from rubberband.executor.backends import make_backend
    from rubberband.clouds import cloud
    from rubberband.executor.notices import NoticeWatchers

    monkeypatch.setenv("RUBBERBAND_METADATA_URL", "http://127.0.0.1:9/")
    backend = make_backend("aws", tmp_path, ["us-east-1"])
    assert backend.metadata_url is None
    assert NoticeWatchers("aws", backend.metadata_url).source.base_url == cloud("aws").notice_url
    url = "http://127.0.0.1:8/{instance}/"
    assert make_backend("gcp", tmp_path, ["us-central1"], seams=BackendSeams(metadata_url=url)).metadata_url == url
    assert NoticeWatchers("gcp", url).source.for_instance("vm-1").base_url == "http://127.0.0.1:8/vm-1/"
    assert (
        make_backend("local", tmp_path, seams=BackendSeams(metadata_url=url)).metadata_url is None
    )  # no notices locally


@pytest.mark.parametrize("content", [b"", b"\x91\x00binary", b"[]", b'{"actual": {"jct_s": "soon"}}', b'{"actual": {'])
def test_a_damaged_result_json_is_named_and_the_report_says_how_to_go_without_it(content, good_plan, tmp_path):
    """`rubberband report RUN_DIR` read result.json without a check: empty, binary, truncated or wrongly shaped, it
    was a JSONDecodeError, UnicodeDecodeError or TypeError traceback."""
    run_dir = tmp_path / "run"
    write_journal(run_dir, *good_plan, finished=True)
    (run_dir / "result.json").write_bytes(content)
    line = invoke("report", run_dir, "--out", tmp_path / "report").refused()
    assert "result.json is damaged" in line and "move it aside" in line
    assert not (tmp_path / "report").exists()
    (run_dir / "result.json").unlink()  # as the message says: the journal alone
    assert invoke("report", run_dir, "--out", tmp_path / "report").code == 0


def test_flags_that_would_be_ignored_or_misnamed_are_refused_in_one_line(good_plan, tmp_path):
    """`run --cloud SIM` named four choices and left out sim; `--resume D --run-dir E` silently continued in D; a
    profile of schema_version 3 said "this rubberband reads version 2" (it reads 1 and 2)."""
    spec_path, plan_path = good_plan
    line = invoke("run", spec_path, "--cloud", "SIM", "--yes").refused()
    assert "sim" in line and "'SIM'" in line
    line = invoke("run", "--resume", tmp_path, "--run-dir", tmp_path / "other").refused()
    assert "drop --run-dir" in line and not (tmp_path / "other").exists()
    doc = {**good_profile(), "schema_version": 3}
    line = invoke("plan", spec_path, "--profile", write_text(tmp_path, "p.json", json.dumps(doc))).refused()
    assert "reads versions 1 and 2" in line
