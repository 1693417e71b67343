"""The run's head instance shape per cloud: data only, so that the dry run, the planner's head cost and the head
itself read one table without importing the head's machinery."""

from __future__ import annotations

from rubberband.catalog import InstanceType

#: The head's instance shape per cloud: 2 vCPUs, 8 GiB, on-demand ($/h in us-east-1 / us-central1).
HEAD_TYPES: dict[str, InstanceType] = {
    "aws": InstanceType("aws", "m6i.large", "", (), "CPU", 0, 2, 8, 0.096, None, host_type="m6i.large"),
    "gcp": InstanceType("gcp", "e2-standard-2", "", (), "CPU", 0, 2, 8, 0.067006, None, host_type="e2-standard-2"),
}
