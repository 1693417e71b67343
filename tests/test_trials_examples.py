"""The example workloads: their specs load, and the synthetic one's figures follow its config."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import EXAMPLES, examples_on_path

from rubberband.spec import load_spec, sample_config


@pytest.mark.parametrize("name, cloud", [("digits", "local"), ("synthetic", "local"), ("cifar_resnet", "aws")])
def test_example_specs_load(name, cloud):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    assert spec.train == f"{name}:train" and spec.resources.clouds == [cloud]
    assert (EXAMPLES / f"{spec.train_module}.py").exists()
    config = sample_config(spec.search_space, np.random.default_rng(0))
    assert set(config) == set(spec.search_space)


def test_synthetic_winner_is_known_from_the_config(synthetic):
    best = 0.01
    lrs = [0.0003, 0.002, 0.008, 0.05, 0.9]
    for epoch in (0, 3, 9):
        scores = [synthetic.score(lr, epoch, best, 0.05) for lr in lrs]
        assert lrs[int(np.argmax(scores))] == 0.008  # closest to best_lr in log space, at every epoch
    assert synthetic.score(best, 0, best, 0.05) < synthetic.score(best, 5, best, 0.05) <= 1.0


def test_synthetic_speed_and_scaling(synthetic):
    assert synthetic.iteration_seconds(1, 0.02, 0.002) == pytest.approx(0.02)
    assert synthetic.iteration_seconds(4, 0.02, 0.002) == pytest.approx(0.026)
    assert synthetic.iterations_per_epoch(1, 640, 32) == 20
    assert synthetic.iterations_per_epoch(3, 640, 32) == 7
    assert synthetic.settings({"lr": 0.1, "unrelated": 1})["lr"] == 0.1


def test_cifar_without_torchvision_says_what_it_needs(monkeypatch):
    """With torchvision missing, the CIFAR example raises a TrainingError naming it."""
    from rubberband.errors import TrainingError

    with examples_on_path():
        import cifar_resnet
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision -> ImportError
    with pytest.raises(TrainingError, match="needs torchvision"):
        cifar_resnet.datasets("/nonexistent", download=False)


def test_cifar_names_a_wrong_arch_before_it_needs_torchvision(monkeypatch):
    """The CIFAR example trains ResNet-18 or ResNet-50 (config ``arch``); any other name is a one-line
    TrainingError saying what to set, raised before torchvision or the dataset is needed."""
    from rubberband.errors import TrainingError

    with examples_on_path():
        import cifar_resnet
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(TrainingError, match="config arch 'vgg16' is not one of resnet18, resnet50"):
        cifar_resnet.resnet_cifar("vgg16")
