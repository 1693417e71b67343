"""bench/bench_search_regret.py, tiny: every table and searcher runs on simulated time and prints a row per
budget; the regret curves are drawn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")
pytest.importorskip("matplotlib")
pytest.importorskip("torch")  # the NAS-Bench-201 replay is examples/recorded.py's

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_the_regret_bench_runs_every_searcher_on_both_tables(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import bench_search_regret as bench
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "regret.png"
    assert bench.main(["--seeds", "1", "--trials", "9", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| nasbench201") or line.startswith("| sgd")]
    assert len(rows) == 2 * len(bench.FRACTIONS)
    for line in rows:
        regrets = [float(x) for cell in line.split("|")[4:-1] for x in cell.split("/")]
        assert len(regrets) == 2 * len(bench.SEARCHERS) and all(r >= 0 for r in regrets)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
