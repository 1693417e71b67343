"""The deadline the executor works to: the user's counts from their command, and the executor starts later.

What the command did before the executor started (loading, planning; in head mode the head's boot and the code
upload) used part of the user's deadline, so a fresh run works to what is left of it. One rule for every backend:
the CLI's local executor and a head's executor both take it from here.
"""

from __future__ import annotations

#: The least deadline an executor is handed, in seconds: a command whose start-up used the whole deadline still runs
#: the plan (its boundaries then finish late or stop, as ``--on-late`` says).
MIN_DEADLINE_S = 1.0


def remaining_deadline(deadline_s: float, commanded_at: float | None, now: float) -> float:
    """What is left at ``now`` of a ``deadline_s`` counted from ``commanded_at`` (never less than
    :data:`MIN_DEADLINE_S`); unchanged where the command's start is unknown, and a command that seems to start in
    the future (a skewed clock) never adds time."""
    if commanded_at is None:
        return deadline_s
    return max(MIN_DEADLINE_S, deadline_s - max(0.0, now - commanded_at))
