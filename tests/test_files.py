"""rubberband.files: atomic writes leave the old file or the new one, never a torn one or a stray temp file."""

from __future__ import annotations

import pytest

from rubberband.files import write_text_atomic


def test_write_replaces_whole_and_leaves_no_temp_file(tmp_path):
    path = write_text_atomic(tmp_path / "a" / "plan.json", "{}\n", make_parents=True)
    assert path.read_text() == "{}\n"
    write_text_atomic(path, '{"v": 2}\n')
    assert path.read_text() == '{"v": 2}\n' and [p.name for p in path.parent.iterdir()] == ["plan.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = write_text_atomic(tmp_path / "result.json", "old\n")

    def broken(self, text):
        raise OSError("disk full")

    monkeypatch.setattr(type(path), "write_text", broken)
    with pytest.raises(OSError):
        write_text_atomic(path, "new\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["result.json"]
