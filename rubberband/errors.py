"""One exception hierarchy for every failure a user can act on.

The CLI turns a :class:`RubberbandError` into a single line on stderr and its
``exit_code``; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class RubberbandError(Exception):
    """Base of all user-facing errors: a one-line message and an exit code."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InputError(RubberbandError):
    """Bad user input: spec, profile, catalog, plan file, CLI flag (exit 2)."""


class SpecError(InputError):
    """The job spec is invalid."""


class ProfileError(InputError):
    """The profile file is missing, malformed or does not cover what is needed."""


class CatalogError(InputError):
    """The instance catalog is missing, malformed or lacks a requested type/region."""


class PlanFileError(InputError):
    """A plan JSON file is missing, malformed or does not match the spec."""


class RunDirError(InputError):
    """A run directory is missing, belongs to another job, or cannot be resumed."""


class UnexpectedAnswer(InputError):
    """A cloud API answered with something its client cannot read (a proxy's or portal's page, a stub that is not
    the service): the user's environment points the call elsewhere (an endpoint override, a proxy). Bad input, so
    one line naming the call and exit code 2; not a :class:`CloudError`, so no check reports it as "could not be
    checked" and no failover tries another zone."""

    def __init__(self, call: str, detail: str) -> None:
        first = (detail.strip().splitlines() or [""])[0][:160]
        super().__init__(
            f"{call}: the answer could not be read as the API's ({first}); check the endpoint (AWS_ENDPOINT_URL*, "
            f"RUBBERBAND_GCE_ENDPOINT) and any proxy between you and the cloud"
        )


class InfeasibleError(RubberbandError):
    """No plan meets the deadline (or budget) at the requested confidence (exit 3).

    Carries the best achievable figures so the message can say what *is* possible.
    """

    exit_code = 3

    def __init__(self, message: str, *, shortest_jct_s: float | None = None, cost_usd: float | None = None) -> None:
        super().__init__(message)
        self.shortest_jct_s = shortest_jct_s
        self.cost_usd = cost_usd


class TrainingError(RubberbandError):
    """The user's training code failed to import or raised while running."""


class TrialPreempted(TrainingError):
    """A trial stopped after its checkpoint because its (spot) instance got a preemption notice; the executor
    restarts it from that checkpoint on another instance."""


class ExecutionError(RubberbandError):
    """The executor could not carry a run through (after cleaning up)."""

    exit_code = 1


class GpuUnavailableError(ExecutionError):
    """A node advertises GPUs (its instance type has them) but CUDA is not usable in a trial's worker.

    Raised instead of training a GPU type on its CPUs; the message names the instance type.
    """


@dataclass(frozen=True)
class Location:
    """Where in a cloud a :class:`CloudError` happened: the region and the zone, each None where unknown."""

    region: str | None = None
    zone: str | None = None


#: A :class:`CloudError` of no particular region or zone.
NOWHERE = Location()


class CloudError(RubberbandError):
    """A cloud API failure, classified into rubberband's failover vocabulary.

    ``kind`` is one of ``capacity`` (try another zone/type), ``quota`` (block the
    region, tell the user which quota), ``transient`` (retry with backoff) or
    ``fatal`` (stop, e.g. bad credentials).
    """

    exit_code = 1
    kinds = ("capacity", "quota", "transient", "fatal")

    def __init__(
        self, message: str, *, kind: str, code: str = "", where: Location = NOWHERE, quota: str | None = None
    ) -> None:
        """``code``: the cloud's own error code; ``where``: the region and zone the failed call was about, each where
        known (failover blocks what failed there); ``quota``: the quota to raise (``kind="quota"``)."""
        if kind not in self.kinds:
            raise ValueError(f"unknown cloud error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.where = where
        self.quota = quota

    @property
    def zone(self) -> str | None:
        return self.where.zone

    @property
    def region(self) -> str | None:
        return self.where.region


class CleanupIncomplete(CloudError):
    """A run's cleanup deleted what it could, but some kind of resource could not be deleted (or not even listed).

    Each kind of run-level resource is deleted on its own, so that one the credentials may not touch (say, secrets
    without ``secretsmanager:ListSecrets``) does not keep the others (the security group) alive; this error comes
    once all were tried. ``deleted``: what did go (teardown still reports it); the message names what did not and
    why; ``kind`` and ``code`` are the first failure's."""

    def __init__(self, message: str, *, deleted: list[str], first: CloudError) -> None:
        super().__init__(message, kind=first.kind, code=first.code, where=first.where, quota=first.quota)
        self.deleted = deleted
