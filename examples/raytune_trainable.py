"""A Ray Tune function trainable, written for Ray Tune, that rubberband runs unchanged.

With Ray Tune (``python examples/raytune_trainable.py``, needs ``pip install 'ray[tune]'``) it is
tuned by the ``__main__`` block below; with rubberband the spec names it,
``train: raytune_trainable:train_fn`` (``examples/raytune.yaml``), and ``rubberband run`` calls it
through the Ray Tune adapter (``rubberband/raytune.py``, ``docs/raytune.md``): each
``tune.report`` is one epoch, its checkpoint becomes the trial's rubberband checkpoint, and the
trial is stopped at the end of its rung.

The workload is the synthetic one (sleep, known winner): ``score`` peaks at ``lr = best_lr``. An
epoch sleeps ``epoch_s`` times the configuration's speed factor ``exp(speed_sigma · z)``, ``z`` a
standard normal seeded by the configuration's ``lr`` (``speed_sigma: 0``, the default, makes every
configuration equally fast): configurations differ in speed, as when width or depth are tuned.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time

from ray import tune


def speed_factor(config):
    """The configuration's slowdown (1 = ``epoch_s``), the same wherever and whenever it runs."""
    sigma = float(config.get("speed_sigma", 0.0))
    return math.exp(sigma * random.Random(repr(float(config["lr"]))).gauss(0.0, 1.0)) if sigma > 0 else 1.0


def train_fn(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "state.json")) as f:
                start = json.load(f)["epoch"] + 1
    for epoch in range(start, config.get("max_epochs", 100)):
        time.sleep(config["epoch_s"] * speed_factor(config))
        score = 1.0 - (math.log10(config["lr"]) - math.log10(config["best_lr"])) ** 2 - 0.05 / (epoch + 1)
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "state.json"), "w") as f:
                json.dump({"epoch": epoch}, f)
            tune.report({"score": score, "epoch": epoch}, checkpoint=tune.Checkpoint.from_directory(directory))


if __name__ == "__main__":  # the same trainable, tuned by Ray Tune itself
    from ray.tune.schedulers import HyperBandScheduler

    tuner = tune.Tuner(
        train_fn,
        param_space={"lr": tune.loguniform(1e-4, 1.0), "best_lr": 0.01, "epoch_s": 0.5, "max_epochs": 9},
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            num_samples=9,
            reuse_actors=True,
            scheduler=HyperBandScheduler(time_attr="training_iteration", max_t=9, reduction_factor=3),
        ),
    )
    print(tuner.fit().get_best_result().config)
