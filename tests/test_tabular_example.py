"""The scikit-learn example runs through `rubberband run` on local Ray nodes and no trial worker imports torch.

The example's own training function runs unchanged inside a probe that adds one metric to each report: whether its
worker process has imported torch. Its checkpoints (the model object) are plain pickles, and promoted trials
continue their ensembles from them.
"""

from __future__ import annotations

import json
import zipfile

import pytest
from executor_helpers import cli_env

from torch_probe import probed_example

pytestmark = pytest.mark.e2e


def test_the_scikit_learn_example_runs_without_torch_in_its_workers(cli, tmp_path):
    spec = probed_example("tabular", tmp_path / "code")
    run_dir = tmp_path / "run"
    result = cli("run", spec, "--yes", "--overrun", "none", "--run-dir", run_dir, env=cli_env(tmp_path), timeout=300)
    assert result.returncode in (0, 4), result.stderr[-3000:]  # met, or late on a loaded machine: it ran to its end
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines() if line.strip()]
    reports = [e for e in events if "torch_loaded" in json.dumps(e)]
    assert len(reports) >= 9 + 3 + 1, "every trial of every stage reported"
    assert all('"torch_loaded": 0.0' in json.dumps(e) for e in reports), reports[:3]
    best = json.loads((run_dir / "result.json").read_text())["best"]
    assert best["metric"] > 0.9 and best["rung"]["epochs"] == 9  # a boosted ensemble on the breast-cancer table
    assert not zipfile.is_zipfile(best["checkpoint"])  # the model object as a plain pickle, not torch's archive
