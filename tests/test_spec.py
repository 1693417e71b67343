import math
import textwrap

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.spec import load_spec, parse_spec, sample_config
from rubberband.units import format_usd_column, parse_duration, parse_overrun

GOOD = textwrap.dedent("""\
    name: resnet-cifar
    train: train_cifar:train
    metric: {name: val_acc, mode: max}
    search_space:
      lr: {type: loguniform, low: 0.0001, high: 0.1}
      momentum: {type: uniform, low: 0.8, high: 0.99}
      width: {type: int, low: 16, high: 64}
      depth: {type: choice, values: [18, 34]}
    scheduler: {kind: sha, trials: 81, eta: 3, min_epochs: 1, max_epochs: 27}
    deadline: 2h
    resources: {clouds: [aws], spot: false, max_workers_per_trial: 8}
    """)


def write(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_good_spec_loads(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.deadline_s == 7200 and spec.confidence == 0.95
    assert spec.train_module == "train_cifar" and spec.train_function == "train"
    assert spec.base_dir == str(tmp_path.resolve())
    assert len(spec.sha256()) == 64


@pytest.mark.parametrize(
    "value, seconds",
    [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45), (3600, 3600), ("3600", 3600), ("1.5h", 5400)],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5m", "0", "2 hours", "", "5m5"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("10%", 360.0),
        ("0%", 0.0),
        ("15m", 900.0),
        ("0", 0.0),
        ("0s", 0.0),
        ("none", math.inf),
        ("NONE", math.inf),
        ("150%", 5400.0),
    ],
)
def test_parse_overrun_of_a_one_hour_deadline(value, seconds):
    assert parse_overrun(value, 3600.0) == seconds


@pytest.mark.parametrize(
    "amounts, shown",
    [
        ([3.79, 0.9376, 0.0], ["$3.79", "$0.94", "$0.00"]),
        ([0.0038, 0.00172], ["$0.0038", "$0.0017"]),
        ([1234.5, 12.0], ["$1,234.50", "$12.00"]),
        ([], []),
    ],
)
def test_a_usd_column_shares_its_decimals(amounts, shown):
    assert format_usd_column(amounts) == shown


@pytest.mark.parametrize("bad", ["soon", "-5%", "%", "ten%", "-5m", ""])
def test_parse_overrun_rejects(bad):
    with pytest.raises(ValueError, match="share of the deadline"):
        parse_overrun(bad, 3600.0)


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ("deadline: 2h", "deadline: tomorrow", "'deadline'"),
        ("deadline: 2h", "", "'deadline'"),
        ("mode: max", "mode: maximum", "'metric.mode'"),
        ("type: loguniform, low: 0.0001", "type: loguniform, low: -1", "'search_space.lr.low'"),
        ("type: uniform, low: 0.8, high: 0.99", "type: uniform, low: 0.99, high: 0.8", "'search_space.momentum'"),
        ("type: choice", "type: normal", "'search_space.depth'"),
        ("eta: 3", "eta: 1", "'scheduler.eta'"),
        ("trials: 81, ", "", "'scheduler'"),
        ("clouds: [aws]", "clouds: [azure]", "'resources.clouds.0'"),
        ("train: train_cifar:train", "train: train_cifar", "'train'"),
        ("name: resnet-cifar", "name: resnet-cifar\ncolour: blue", "'colour'"),
    ],
)
def test_bad_specs_name_the_field_and_line(tmp_path, old, new, fragment):
    text = GOOD.replace(old, new)
    assert text != GOOD
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    message = str(info.value)
    assert fragment in message and "\n" not in message
    assert str(tmp_path / "job.yaml") in message


def test_bad_spec_reports_yaml_line(tmp_path):
    with pytest.raises(SpecError, match=r"job.yaml:3: spec field 'metric.mode'"):
        load_spec(write(tmp_path, GOOD.replace("mode: max", "mode: up")))


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(write(tmp_path, "name: [unclosed\n"))
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_sample_config_respects_space(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    rng = np.random.default_rng(0)
    for _ in range(50):
        config = sample_config(spec.search_space, rng)
        assert 1e-4 <= config["lr"] <= 0.1 and 0.8 <= config["momentum"] <= 0.99
        assert 16 <= config["width"] <= 64 and config["depth"] in (18, 34)


def test_spot_margin_is_a_duration_and_leaves_old_digests_alone(tmp_path):
    base = {
        "name": "j",
        "train": "m:f",
        "metric": {"name": "loss", "mode": "min"},
        "scheduler": {"kind": "sha", "trials": 9, "eta": 3, "min_epochs": 1, "max_epochs": 9},
        "search_space": {"lr": {"type": "uniform", "low": 0.0, "high": 1.0}},
        "deadline": "1h",
        "resources": {"clouds": ["local"]},
    }
    plain = parse_spec(base)
    margin = parse_spec({**base, "resources": {"clouds": ["local"], "spot_margin_s": "5m"}})
    assert plain.resources.spot_margin_s == 0.0 and margin.resources.spot_margin_s == 300.0
    zero = parse_spec({**base, "resources": {"clouds": ["local"], "spot_margin_s": 0}})
    assert zero.sha256() == plain.sha256() != margin.sha256()
    for bad in (-1, "soon", True):
        with pytest.raises(SpecError, match="resources.spot_margin_s"):
            parse_spec({**base, "resources": {"clouds": ["local"], "spot_margin_s": bad}})


def test_asha_specs_need_trials_and_on_demand_instances(tmp_path):
    asha = GOOD.replace("kind: sha", "kind: asha")
    spec = load_spec(write(tmp_path, asha))
    assert spec.scheduler.kind == "asha" and spec.scheduler.trials == 81
    with pytest.raises(SpecError, match=r"spec field 'scheduler': trials is required for kind: asha"):
        load_spec(write(tmp_path, asha.replace("trials: 81, ", "")))
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, asha.replace("spot: false", "spot: true")))
    message = str(info.value)
    assert message == (
        f"{tmp_path / 'job.yaml'}:11: spec field 'resources.spot': scheduler.kind asha runs on on-demand "
        f"instances; set resources.spot: false or use kind: sha"
    )
    # brackets is Hyperband's; ASHA takes it and ignores it
    assert load_spec(write(tmp_path, asha.replace("max_epochs: 27}", "max_epochs: 27, brackets: sequential}")))
    with pytest.raises(SpecError, match="'scheduler.kind': must be one of 'sha', 'hyperband' or 'asha'"):
        load_spec(write(tmp_path, GOOD.replace("kind: sha", "kind: bohb")))


def test_asha_over_listed_configurations_takes_their_number_as_trials():
    data = {
        "name": "j",
        "train": "m:f",
        "metric": {"name": "loss", "mode": "min"},
        "scheduler": {"kind": "asha", "eta": 3, "min_epochs": 1, "max_epochs": 9},
        "trials": [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}, {"lr": 0.4}],
        "deadline": "1h",
        "resources": {"clouds": ["local"]},
    }
    assert parse_spec(data).scheduler.trials == 4
