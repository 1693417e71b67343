"""Checkpoint files: atomic writes, the latest pointer, pruning, world-size independent content."""

from __future__ import annotations

import torch

from rubberband.executor.checkpoints import latest_epoch, load_latest, save_checkpoint


def test_save_load_prune(tmp_path):
    assert latest_epoch(tmp_path / "none") is None and load_latest(tmp_path / "none") is None
    model = torch.nn.Linear(3, 2)
    for epoch in range(4):
        save_checkpoint(tmp_path, epoch, {"model": model.state_dict(), "epoch_seen": epoch}, trial_id="t")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["epoch-2.pt", "epoch-3.pt", "latest"]  # the newest two are kept, no temp files
    loaded = load_latest(tmp_path)
    assert loaded.epoch == 3 and loaded.state["epoch_seen"] == 3
    assert torch.equal(loaded.state["model"]["weight"], model.state_dict()["weight"])


def test_pointer_to_missing_file_means_no_checkpoint(tmp_path):
    (tmp_path / "latest").write_text("epoch-5.pt\n")
    assert latest_epoch(tmp_path) is None
    (tmp_path / "latest").write_text("garbage")
    assert load_latest(tmp_path) is None


def test_a_worker_without_torch_pickles_its_state_and_either_kind_loads(tmp_path, monkeypatch):
    """A scikit-learn or XGBoost trial never imports torch: its checkpoint is a plain pickle (the model object as
    it is), and a torch one written later in the same directory still loads (each file says what it is)."""
    import sys
    from fractions import Fraction

    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch")  # as in a worker whose training never imported it
        save_checkpoint(tmp_path, 0, {"model": Fraction(3, 7), "trees": [1, 2]})
        loaded = load_latest(tmp_path)
        assert "torch" not in sys.modules
    assert loaded is not None and loaded.state == {"model": Fraction(3, 7), "trees": [1, 2]} and loaded.epoch == 0
    save_checkpoint(tmp_path, 1, {"w": torch.ones(2)})  # this process has torch: torch.save's archive
    again = load_latest(tmp_path)
    assert again is not None and again.epoch == 1 and torch.equal(again.state["w"], torch.ones(2))
