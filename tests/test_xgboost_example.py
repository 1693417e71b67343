"""The XGBoost example runs through `rubberband run` on local Ray nodes and no trial worker imports torch.

The example's own training function runs unchanged inside a probe that adds one metric to each report: whether its
worker process has imported torch. Its checkpoints (the booster) are plain pickles, and promoted trials continue
their boosting from them: a survivor's booster holds every round of every stage it ran.
"""

from __future__ import annotations

import json
import pickle
import zipfile

import pytest
from executor_helpers import cli_env

from torch_probe import probed_example

pytestmark = pytest.mark.e2e
xgboost = pytest.importorskip("xgboost", reason="the XGBoost example needs pip install -e '.[xgboost]'")


def test_the_xgboost_example_runs_without_torch_in_its_workers(cli, tmp_path):
    spec = probed_example("xgboost_trial", tmp_path / "code")
    run_dir = tmp_path / "run"
    result = cli("run", spec, "--yes", "--overrun", "none", "--run-dir", run_dir, env=cli_env(tmp_path), timeout=300)
    assert result.returncode in (0, 4), result.stderr[-3000:]  # met, or late on a loaded machine: it ran to its end
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines() if line.strip()]
    reports = [e for e in events if e["type"] == "epoch"]
    assert len(reports) >= 9 + 3 + 1, "every trial of every stage reported"
    assert all(e["metrics"]["torch_loaded"] == 0.0 for e in reports), reports[:3]
    best = json.loads((run_dir / "result.json").read_text())["best"]
    assert best["metric"] < 0.4 and best["rung"]["epochs"] == 9  # boosted trees on a separable generated table
    assert not zipfile.is_zipfile(best["checkpoint"])  # the booster as a plain pickle, not torch's archive
    with open(best["checkpoint"], "rb") as handle:
        booster = pickle.load(handle)["state"]["booster"]  # rubberband's envelope around the state
    assert booster.num_boosted_rounds() == 9 * 10  # continued across stages (10 rounds an epoch), not restarted
