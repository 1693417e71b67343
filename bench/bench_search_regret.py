"""Best-found regret of random search, TPE and BOHB (TPE + Hyperband) at equal budget, on recorded tables.

Each searcher is run by the unchanged executor on simulated time (``rubberband run --cloud sim``; see
``bench/bench_sim_executor.py``), ``--seeds`` times (the search's seed and the simulated cluster's: 0, 1, ...),
its metrics replayed from a recorded table instead of trained, so a run takes a second or so:

* ``nasbench201``: the 27 NAS-Bench-201 CIFAR-10 cells of ``examples/data/nasbench201_cifar10_slice.json``,
  replayed along ``examples/recorded.py``'s learning curve; the search space is the cell's six edges (an
  operation 0-4 each), and a sampled cell the slice lacks is its nearest recorded one (fewest differing edges,
  then the first by name). SHA: ``--trials`` (81), η 3, 1-9 epochs.
* ``sgd-digits``: scikit-learn's SGDClassifier on its bundled digits data, 384 configurations x 27 epochs of
  validation accuracy (``bench/data/sgd_digits_curves.json``, made offline by
  ``bench/data/make_sgd_digits_curves.py``); the space is the recorded grid (``alpha`` and ``eta0`` as indices
  into log-spaced values, the loss, averaging). SHA: ``--trials`` (81), η 3, 1-27 epochs.

Searchers: ``random`` and ``tpe`` under the table's SHA, ``bohb`` (TPE) and ``hyperband`` (random) under
Hyperband (η 3, the same epochs, brackets side by side). The budget is epochs trained (in full trainings: R
epochs each); at each point the incumbent is the configuration with the best result at the highest fidelity
reached so far, and its regret is the table's best final value less the incumbent's final value. Printed: median
and mean regret per searcher at fractions of the smallest total budget of the searchers (equal budget); drawn:
the median regret curves (``--out``, a PNG).

    python bench/bench_search_regret.py [--seeds 20] [--trials 81] [--tables nasbench201,sgd-digits] [--out regret.png]

Last measured (20 seeds, 81 trials, about 9 minutes on 2 shared cores): README's Benchmarks, docs/img/search_regret.png.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLES = REPO / "examples"
sys.path.insert(0, str(HERE))

from bench_sim_executor import run_simulated  # noqa: E402

#: searcher → (sampler, scheduler kind)
SEARCHERS = {"random": ("random", "sha"), "tpe": ("tpe", "sha"), "bohb": ("tpe", "hyperband"),
             "hyperband": ("random", "hyperband")}  # fmt: skip
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Table:
    """A recorded table a search is replayed on: its search space, R, the metric a configuration reports after
    a (0-based) epoch and after the whole training, and the best final value."""

    name: str
    space: dict[str, Any]
    max_epochs: int
    curve: Callable[[dict[str, Any], int], float]
    final: Callable[[dict[str, Any]], float]
    best: float
    worst: float


def nasbench201() -> Table:
    sys.path.insert(0, str(EXAMPLES))
    from recorded import accuracy, load_table  # the example's replay, unchanged

    rows = load_table("data/nasbench201_cifar10_slice.json")
    max_epochs = 9

    @functools.lru_cache(maxsize=None)
    def nearest(cell: str) -> str:
        return min(sorted(rows), key=lambda arch: sum(a != b for a, b in zip(arch, cell)))

    def arch(config: dict[str, Any]) -> str:
        return nearest("".join(str(config[f"edge{i}"]) for i in range(6)))

    space = {f"edge{i}": {"type": "choice", "values": [0, 1, 2, 3, 4]} for i in range(6)}
    return Table(
        "nasbench201",
        space,
        max_epochs,
        lambda config, epoch: accuracy(rows[arch(config)]["val_acc"], epoch, max_epochs),
        lambda config: rows[arch(config)]["val_acc"],
        max(row["val_acc"] for row in rows.values()),
        min(row["val_acc"] for row in rows.values()),
    )


def sgd_digits() -> Table:
    data = json.loads((HERE / "data" / "sgd_digits_curves.json").read_text())
    rows = data["rows"]

    def row(config: dict[str, Any]) -> list[float]:
        return rows[f"{config['alpha_i']}-{config['eta0_i']}-{config['loss']}-{int(config['average'])}"]

    space = {
        "alpha_i": {"type": "int", "low": 0, "high": len(data["alphas"]) - 1},
        "eta0_i": {"type": "int", "low": 0, "high": len(data["eta0s"]) - 1},
        "loss": {"type": "choice", "values": data["losses"]},
        "average": {"type": "choice", "values": [False, True]},
    }
    return Table(
        "sgd-digits",
        space,
        int(data["epochs"]),
        lambda config, epoch: row(config)[epoch],
        lambda config: row(config)[-1],
        max(r[-1] for r in rows.values()),
        min(r[-1] for r in rows.values()),
    )


TABLES: dict[str, Callable[[], Table]] = {"nasbench201": nasbench201, "sgd-digits": sgd_digits}


def write_spec(directory: Path, table: Table, searcher: str, seed: int, trials: int) -> Path:
    """The replay example's spec (its profile and local types) with the table's space, schedule and search."""
    sampler, kind = SEARCHERS[searcher]
    data = yaml.safe_load((EXAMPLES / "nasbench201.yaml").read_text())
    data.pop("trials")
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    data["name"] = f"regret-{table.name}-{searcher}"
    data["search_space"] = table.space
    data["config"]["max_epochs"] = table.max_epochs
    data["scheduler"] = {"kind": kind, "eta": 3, "min_epochs": 1, "max_epochs": table.max_epochs}
    if kind == "sha":
        data["scheduler"]["trials"] = trials
    data["search"] = {"sampler": sampler, "seed": seed}
    data["deadline"] = "3h"
    path = directory / f"{table.name}-{searcher}-{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def regret_curve(events: list[dict[str, Any]], table: Table, metric: str) -> list[float]:
    """Regret after each epoch trained (in journal order), of the best result at the highest rung reached so
    far (results at η's rungs: 1, 3, 9, ... epochs; before the first: the table's worst)."""
    configs = {e["trial_id"]: e["config"] for e in events if e["type"] == "trial_created"}
    rungs = {3**k for k in range(32) if 3**k <= table.max_epochs} | {table.max_epochs}
    best: tuple[int, float, str] | None = None
    out = []
    for e in events:
        if e["type"] != "epoch" or metric not in e["metrics"]:
            continue
        seen = (e["epoch"] + 1, float(e["metrics"][metric]), e["trial_id"])
        if seen[0] in rungs and (best is None or seen[:2] > best[:2]):
            best = seen
        out.append(table.best - (table.worst if best is None else table.final(configs[best[2]])))
    return out


def run_searcher(table: Table, searcher: str, seeds: int, trials: int, base: Path) -> list[list[float]]:
    """Regret curves of ``seeds`` runs of one searcher (a plan per searcher, made once, for seed 0's spec)."""
    from rubberband.executor import journal as J
    from rubberband.executor.run import Job
    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs
    from rubberband.spec import load_spec

    inputs = load_job_inputs(write_spec(base, table, searcher, 0, trials))
    plan = plan_from_inputs(inputs)
    curves = []
    for seed in range(seeds):
        spec = load_spec(write_spec(base, table, searcher, seed, trials))
        run_dir = Path(tempfile.mkdtemp(prefix=f"{table.name}-{searcher}-{seed}-", dir=base))
        run_simulated(Job(spec, plan, inputs.catalog, inputs.profile), seed, run_dir, curve=table.curve)
        events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
        curves.append(regret_curve(events, table, spec.metric.name))
        shutil.rmtree(run_dir, ignore_errors=True)
    return curves


def at(curve: list[float], budget: int) -> float:
    """Regret once ``budget`` epochs were trained (the run's last when it trained fewer)."""
    return curve[min(budget, len(curve)) - 1]


def summarise(table: Table, curves: dict[str, list[list[float]]]) -> list[dict[str, Any]]:
    """Median and mean regret per searcher at each fraction of the smallest mean total budget."""
    common = min(statistics.median(len(c) for c in runs) for runs in curves.values())
    rows = []
    for fraction in FRACTIONS:
        budget = max(1, int(round(fraction * common)))
        row: dict[str, Any] = {"table": table.name, "budget": budget, "full": budget / table.max_epochs}
        for searcher, runs in curves.items():
            values = [at(c, budget) for c in runs]
            row[searcher] = (statistics.median(values), statistics.fmean(values))
        rows.append(row)
    return rows


def draw(results: dict[str, tuple[Table, dict[str, list[list[float]]]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, (table, curves)) in zip(axes[0], results.items()):
        common = int(min(statistics.median(len(c) for c in runs) for runs in curves.values()))
        x = np.arange(1, common + 1) / table.max_epochs
        for (searcher, runs), style in zip(curves.items(), ("-", "--", "-.", ":")):
            ys = np.array([[at(c, b) for b in range(1, common + 1)] for c in runs])
            ax.plot(x, np.median(ys, axis=0), style, label=searcher)
            ax.fill_between(x, np.quantile(ys, 0.25, axis=0), np.quantile(ys, 0.75, axis=0), alpha=0.15)
        ax.set(title=f"{name} ({len(next(iter(curves.values())))} seeds)", xlabel="budget (full trainings)")
        ax.set(ylabel="regret (median, IQR shaded)")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(
    tables: list[str], searchers: list[str], seeds: int, *, trials: int = 81, out: Path | None = None
) -> list[dict[str, Any]]:
    """Every table x searcher, ``seeds`` runs each; the summary rows (and the PNG at ``out``)."""
    base = Path(tempfile.mkdtemp(prefix="bench-regret-"))
    results = {}
    try:
        for name in tables:
            table = TABLES[name]()
            curves = {s: run_searcher(table, s, seeds, trials, base) for s in searchers}
            results[name] = (table, curves)
            print(f"... {name} done", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if out is not None:
        draw(results, out)
    return [row for table, curves in results.values() for row in summarise(table, curves)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--searchers", default=",".join(SEARCHERS))
    parser.add_argument("--trials", type=int, default=81, help="SHA's trials")
    parser.add_argument("--out", type=Path, default=Path("regret.png"), help="the regret curves (PNG)")
    args = parser.parse_args(argv)
    tables = [t for t in args.tables.split(",") if t]
    searchers = [s for s in args.searchers.split(",") if s]
    unknown = [t for t in tables if t not in TABLES] + [s for s in searchers if s not in SEARCHERS]
    if unknown:
        parser.error(f"unknown table(s) or searcher(s) {unknown}: tables {list(TABLES)}, searchers {list(SEARCHERS)}")
    rows = run(tables, searchers, args.seeds, trials=args.trials, out=args.out)
    print(f"Regret (table best − incumbent's final value), median / mean over {args.seeds} seeds:\n")
    print("| table | budget (epochs) | full trainings | " + " | ".join(searchers) + " |")
    print("|---|---|---|" + "---|" * len(searchers))
    for row in rows:
        cells = " | ".join(f"{row[s][0]:.2f} / {row[s][1]:.2f}" for s in searchers)
        print(f"| {row['table']} | {row['budget']} | {row['full']:.1f} | {cells} |")
    print(f"\nregret curves: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
