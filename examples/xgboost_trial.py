"""Tune XGBoost with successive halving: boosting rounds are the budget, the booster is the checkpoint.

A tabular trial as XGBoost users run one, with no torch anywhere in its worker. Each epoch adds
``rounds_per_epoch`` boosting rounds to the same ``xgboost.Booster`` (one ``Booster.update`` per round, so the
profiler times one round per iteration), reports the validation log-loss, and checkpoints the booster itself (a
plain pickle: rubberband writes torch's format only where the worker uses torch). A promoted trial continues its
ensemble from there in the next stage instead of starting over. The data is a classification table scikit-learn
generates (``make_classification``, fixed seed): nothing to download.
"""

from __future__ import annotations

import numpy as np


def _data(seed: int):
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    x, y = make_classification(
        n_samples=3000, n_features=20, n_informative=8, n_redundant=4, flip_y=0.03, random_state=seed
    )
    return train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)


def _logloss(p, y) -> float:
    """Mean binary log-loss of probabilities ``p`` against labels ``y`` (clipped away from 0 and 1)."""
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    return float(-np.mean(np.where(np.asarray(y) == 1, np.log(p), np.log(1 - p))))


def train(config, ctx):
    try:
        import xgboost as xgb
    except ImportError:
        raise ImportError("examples/xgboost_trial.py needs XGBoost: pip install 'rubberband-hpo[xgboost]'") from None

    x_train, x_val, y_train, y_val = _data(int(config.get("data_seed", 0)))
    dtrain, dval = xgb.DMatrix(x_train, label=y_train), xgb.DMatrix(x_val, label=y_val)
    state = ctx.load_checkpoint()
    if state is not None:
        booster = state["booster"]
    else:
        params = {
            "objective": "binary:logistic",
            "eta": config["eta"],
            "max_depth": int(config["max_depth"]),
            "subsample": config["subsample"],
            "lambda": config["reg_lambda"],
            "nthread": 1,  # one CPU per worker: trials packed on an instance must not fight for cores
            "seed": 0,
        }
        booster = xgb.Booster(params, [dtrain])
    rounds = int(config.get("rounds_per_epoch", 10))
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        for _ in ctx.batches(range(rounds)):  # one boosting round per iteration (what the profiler times)
            booster.update(dtrain, booster.num_boosted_rounds())
        ctx.report(epoch, val_logloss=_logloss(booster.predict(dval), y_val))
        ctx.save_checkpoint({"booster": booster})
