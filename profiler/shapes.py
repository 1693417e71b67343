"""Which trial shapes (workers × nodes) a profile measures on one instance type.

Pure: from the instance type and the requested worker counts to a list of shapes, or an
:class:`~rubberband.errors.InputError` naming the count that cannot be held. A count is
measured on one instance when it fits there, and across two instances when it can be split
over two (so the fitted model learns both the intra-node and the cross-node sync cost).
"""

from __future__ import annotations

from dataclasses import dataclass

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
