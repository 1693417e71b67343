"""Record a learning-curve table offline: scikit-learn's SGDClassifier on its bundled digits data set.

Every configuration of a grid (``alpha``, ``eta0`` as indices into log-spaced values, the ``loss``, and
``average``) is trained epoch by epoch (``partial_fit`` over the shuffled training split, a constant learning rate)
and its validation accuracy (%) recorded after each of ``--epochs`` epochs — a table a search can be replayed on
without training anything (``bench/bench_search_regret.py``). Deterministic: the split, the shuffles and the
models are seeded.

    python bench/data/make_sgd_digits_curves.py [--epochs 27] [--out bench/data/sgd_digits_curves.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ALPHAS = [float(a) for a in np.logspace(-6, -1, 8)]
ETA0S = [float(e) for e in np.logspace(-4, 0, 8)]
LOSSES = ["hinge", "log_loss", "modified_huber"]
AVERAGE = [False, True]


def key(alpha_i: int, eta0_i: int, loss: str, average: bool) -> str:
    """A row's name: the configuration's indices and choices."""
    return f"{alpha_i}-{eta0_i}-{loss}-{int(average)}"


def main(argv: list[str] | None = None) -> int:
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("sgd_digits_curves.json"))
    args = parser.parse_args(argv)
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)
    classes = np.unique(y)
    rows = {}
    grid = itertools.product(range(len(ALPHAS)), range(len(ETA0S)), LOSSES, AVERAGE)
    for alpha_i, eta0_i, loss, average in grid:
        model = SGDClassifier(
            loss=loss,
            alpha=ALPHAS[alpha_i],
            learning_rate="constant",
            eta0=ETA0S[eta0_i],
            average=average,
            random_state=0,
        )
        order = np.random.default_rng(0)
        curve = []
        for _ in range(args.epochs):
            shuffled = order.permutation(len(y_train))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model.partial_fit(x_train[shuffled], y_train[shuffled], classes=classes)
            curve.append(round(100.0 * float(model.score(x_val, y_val)), 4))
        rows[key(alpha_i, eta0_i, loss, average)] = curve
    table = {
        "source": "scikit-learn SGDClassifier on sklearn.datasets.load_digits (70/30 split, seed 0), "
        "validation accuracy (%) after each epoch; made by bench/data/make_sgd_digits_curves.py",
        "alphas": ALPHAS,
        "eta0s": ETA0S,
        "losses": LOSSES,
        "epochs": args.epochs,
        "rows": rows,
    }
    args.out.write_text(json.dumps(table, indent=0) + "\n")
    best = max(rows, key=lambda k: rows[k][-1])
    print(f"{len(rows)} configurations x {args.epochs} epochs -> {args.out} (best {best}: {rows[best][-1]:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
