"""Which trial shapes (workers × nodes) a profile measures on one instance type.

Pure: from the instance type and the requested worker counts to a list of shapes, or an
:class:`~rubberband.errors.InputError` naming the count that cannot be held. A count is
measured on one instance when it fits there, and across two instances when it can be split
over two (so the fitted model learns both the intra-node and the cross-node sync cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rubberband.catalog import InstanceType
from rubberband.errors import InputError

#: Profiles measure at most this many instances per trial shape.
MAX_NODES = 2


@dataclass(frozen=True)
class Shape:
    """A trial of ``workers`` data-parallel workers spread over ``nodes`` instances."""

    workers: int
    nodes: int

    def split(self) -> tuple[int, ...]:
        """Workers per instance, as even as possible (first instances get the extra one)."""
        base, extra = divmod(self.workers, self.nodes)
        return tuple(base + (1 if i < extra else 0) for i in range(self.nodes))

    def placement(self, resources: list[str]) -> tuple[str, ...]:
        """One instance resource per worker (rank 0 on the first instance)."""
        return tuple(r for r, n in zip(resources, self.split()) for _ in range(n))

    @property
    def label(self) -> str:
        return f"{self.workers} worker{'s' if self.workers > 1 else ''} on {self.nodes} node{'s' if self.nodes > 1 else ''}"


def parse_workers(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]`` (sorted, unique); InputError on anything else."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InputError(f"--workers {text!r}: give worker counts separated by commas, e.g. 1,2,4") from None
    if not values or values[0] < 1:
        raise InputError(f"--workers {text!r}: worker counts must be positive integers, e.g. 1,2,4")
    return values


def plan_shapes(instance_type: InstanceType, workers: list[int], *, cross_node: bool = True) -> list[Shape]:
    """The shapes to measure for ``workers`` on ``instance_type`` (one node, and two where possible)."""
    per_node = instance_type.workers
    shapes: list[Shape] = []
    for w in workers:
        if w > per_node * MAX_NODES:
            raise InputError(
                f"--workers: {w} workers do not fit on {MAX_NODES} {instance_type.name} instances "
                f"({per_node} worker{'s' if per_node > 1 else ''} each); use at most "
                f"{per_node * MAX_NODES} or a larger --instance-type"
            )
        if w <= per_node:
            shapes.append(Shape(w, 1))
        if cross_node and w >= 2 and -(-w // MAX_NODES) <= per_node:
            shapes.append(Shape(w, MAX_NODES))
    return shapes


def nodes_needed(shapes: list[Shape]) -> int:
    return max(s.nodes for s in shapes)


def type_to_profile(types: Sequence[InstanceType], max_workers: int) -> InstanceType:
    """The instance type a profile measures by default, from the spec's types of one cloud (in the spec's order).

    The first, unless a trial may be wider (``max_workers``) than it holds on one node and another type of its
    device holds more: then the narrowest of those that holds the widest such trial on one node. Its shapes then
    include that trial on one node as well as across two, so the plans' one-node sync cost is measured rather than
    taken from the fit's priors (21 real runs profiled on ``local.cpu1`` ran their 2-worker trials on one
    ``local.cpu2`` node 11 % slower than planned, and their 1-worker trials 8 % faster: bench/bench_real_runs.py).
    """
    first = types[0]
    same = [t for t in types if t.device == first.device]
    want = min(max_workers, max(t.workers for t in same))
    if first.workers >= want:
        return first
    holding = [t for t in same if t.workers >= want]
    return min(holding, key=lambda t: (t.workers, t.price_hr, t.name))
