"""Worker-side pieces that need no Ray: entry-point loading in a reused process, batch timing."""

from __future__ import annotations

import sys

import pytest
import torch

from executor_helpers import worker_context
from rubberband.executor.worker import load_entry_point


def test_same_module_name_from_two_code_dirs(tmp_path, monkeypatch):
    """A warm worker that ran one job's ``train.py`` loads another job's ``train.py`` afresh."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rb_job_mod.py").write_text(f"def train(config, ctx):\n    return {name!r}\n")
    try:
        assert load_entry_point("rb_job_mod:train", str(tmp_path / "one"))({}, None) == "one"
        assert load_entry_point("rb_job_mod:train", str(tmp_path / "two"))({}, None) == "two"
        with pytest.raises(AttributeError, match="has no function 'nope'"):
            load_entry_point("rb_job_mod:nope", str(tmp_path / "two"))
    finally:
        sys.modules.pop("rb_job_mod", None)


def test_batches_times_every_iteration_and_stops_at_max(tmp_path):
    ctx = worker_context(tmp_path, end_epoch=1, max_iterations=4)
    seen = list(ctx.batches([(torch.zeros(8, 3), torch.zeros(8)) for _ in range(10)]))
    assert len(seen) == 4 and len(ctx.iteration_latencies_s) == 4
    assert ctx.pass_lengths == [10] and ctx.batch_size_seen == 8 and ctx.first_iteration_at is not None
    assert list(ctx.batches(iter(range(2)))) == [0, 1] and ctx.pass_lengths[-1] is None
    ctx.report(0, acc=0.5)
    ctx.save_checkpoint({"w": torch.ones(2)})
    assert ctx.checkpoint_epoch == 0 and ctx.reports[0].metrics == {"acc": 0.5}
    assert torch.equal(ctx.load_checkpoint()["w"], torch.ones(2))  # world size 1: no broadcast needed
