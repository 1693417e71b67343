"""Where each bracket's stages lie in a job's stage list: the one fact about brackets that the plan search, the
parallel-bracket simulator and the executor's lanes all read (a module of its own, below all of them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bracket_ranges(stages: Sequence[Any]) -> list[tuple[int, int]]:
    """(first, end) positions in ``stages`` of each bracket: runs of the same ``bracket`` (planner stages and
    a plan's stages alike)."""
    out: list[tuple[int, int]] = []
    for i, st in enumerate(stages):
        if out and stages[out[-1][0]].bracket == st.bracket:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out
