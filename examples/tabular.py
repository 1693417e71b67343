"""Tune scikit-learn's HistGradientBoostingClassifier with successive halving: boosting rounds are the budget.

A tabular trial as most HPO users run one: no torch anywhere. Each epoch adds ``rounds_per_epoch`` trees to the
same model (``warm_start``), reports validation accuracy, and checkpoints the model object itself (a plain pickle:
rubberband writes torch's format only where the worker uses torch), so a promoted trial continues its ensemble in
the next stage instead of starting over. The data is scikit-learn's own breast-cancer table: nothing to download.
"""

from __future__ import annotations


def _data(seed: int):
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    return train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)


def train(config, ctx):
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError:
        raise ImportError("examples/tabular.py needs scikit-learn: pip install 'rubberband-hpo[examples]'") from None

    x_train, x_val, y_train, y_val = _data(int(config.get("data_seed", 0)))
    state = ctx.load_checkpoint()
    model = (
        state["model"]
        if state is not None
        else HistGradientBoostingClassifier(
            learning_rate=config["lr"],
            max_leaf_nodes=int(config["max_leaf_nodes"]),
            l2_regularization=config["l2"],
            warm_start=True,
            early_stopping=False,
            random_state=0,
        )
    )
    rounds = int(config.get("rounds_per_epoch", 10))
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        for done in ctx.batches(range(rounds)):  # one boosting round per iteration (what the profiler times)
            model.set_params(max_iter=rounds * epoch + done + 1)  # warm start: only the new round is fitted
            model.fit(x_train, y_train)
        ctx.report(epoch, val_acc=float(model.score(x_val, y_val)))
        ctx.save_checkpoint({"model": model})
