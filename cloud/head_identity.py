"""The head instance's cloud identity, whatever the cloud: what it is called and how a launch waits for a new one.

The head runs the executor and the watchdog, which start workers, terminate them and clean up the run; on a real
account it can only do that with an identity of its own (nothing in user-data ever carries a credential). Each
cloud's package makes, checks and deletes its kind (``cloud/aws/identity.py``: an IAM role and instance profile;
``cloud/gcp/identity.py``: a service account with a role bound for the run), behind its descriptor's head mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rubberband.errors import CloudError


@dataclass(frozen=True)
class HeadIdentity:
    """The identity a run's head starts with: an instance profile name (AWS) or service account email (GCP)."""

    cloud: str
    name: str
    created: bool = False  # rubberband created it for this run (and deletes it at the end)


#: How long a new instance profile may take to reach EC2 (IAM is eventually consistent).
PROPAGATION_S = 90.0


def launch_with_new_identity(
    launch: Callable[[], Any],
    *,
    new: bool,
    timeout_s: float = PROPAGATION_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """``launch()``, retried while EC2 does not know a just-created instance profile yet (it answers
    ``InvalidParameterValue ... iamInstanceProfile`` for some seconds after IAM created it)."""
    deadline = clock() + timeout_s
    while True:
        try:
            return launch()
        except CloudError as exc:
            propagating = new and exc.code == "InvalidParameterValue" and "iaminstanceprofile" in exc.message.lower()
            if not propagating or clock() >= deadline:
                raise
            sleep(5.0)
