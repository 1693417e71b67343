"""One cloud, as the rest of rubberband sees it: its facts and its code behind one small interface.

Each cloud's package (``cloud/aws/``, ``cloud/gcp/``, ``cloud/local/``) registers one :class:`CloudDescriptor`
(:mod:`rubberband.cloud.registry`); every module outside those packages asks the registry and never branches on a
cloud's name. The descriptor holds:

* ``facts`` — the cloud's data (:class:`~rubberband.clouds.CloudFacts`, from ``catalogs/clouds.yaml``: billing,
  start-up defaults, metadata server, head shape, spot, ``region_of``);
* ``provider`` — the factory of its :class:`~rubberband.cloud.provider.Provider` (the SDK loads on first use);
* ``notice_reader`` — how a node reads its preemption notice from the metadata server (None: no notices);
* ``head`` — head mode (:class:`HeadMode`): the head's identity, its flags, its checks, the run's set-up and the
  clean-up of what the identity left; None for a cloud whose run's head is this machine (``local``).

A new cloud is a new package with its descriptor and a ``catalogs/clouds.yaml`` entry (docs/adding-a-cloud.md).
Errors keep one vocabulary: a provider turns its SDK's failures into :class:`~rubberband.errors.CloudError` through
:func:`~rubberband.cloud.failover.classify`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rubberband.cloud.head_identity import HeadIdentity
from rubberband.cloud.provider import PermissionCheck, Provider
from rubberband.clouds import CloudFacts


class HeadFlags(Protocol):
    """The ``rubberband run`` flags about a run's head (``cloud/head_session.HeadOptions`` has them)."""

    @property
    def ssh_cidr(self) -> str | None: ...
    @property
    def ssh_key(self) -> Path | None: ...
    @property
    def key_name(self) -> str | None: ...
    @property
    def instance_profile(self) -> str | None: ...
    @property
    def service_account(self) -> str | None: ...
    @property
    def worker_egress(self) -> str | None: ...


class RefreshedCatalog(Protocol):
    """What a catalog refresh wrote."""

    @property
    def path(self) -> Path: ...
    @property
    def rows(self) -> int: ...
    @property
    def types(self) -> int: ...
    @property
    def regions(self) -> tuple[str, ...]: ...
    @property
    def warnings(self) -> tuple[str, ...]: ...


class NoticeRead(Protocol):
    """One read of a node's metadata server: its preemption notice as a dict (``cloud``, ``action``, ``time``), or
    None (no notice yet, or no answer)."""

    def read(self) -> dict[str, Any] | None: ...


class HeadMode(Protocol):
    """What a cloud does differently when rubberband runs a run's executor on a head instance of it."""

    def check_flags(self, flags: HeadFlags, *, over_ssh: bool) -> None:
        """Refuse head flags that do not fit this cloud, in one line (InputError); ``over_ssh``: the CLI reaches
        the head over SSH (a real run, not a played boot), so what SSH needs must be there too."""
        ...

    def provider_options(
        self,
        *,
        identity: str | None = None,
        ssh_cidr: str | None = None,
        key_name: str | None = None,
        worker_egress: str | None = None,
        image: str | None = None,
    ) -> dict[str, Any]:
        """This cloud's provider options for what the flags say (the ones that do not apply to it are dropped):
        the head's identity, the CIDR its SSH is opened to, the key pair, how workers reach the internet, the
        machine image."""
        ...

    def identity(self, run_id: str, region: str, flags: HeadFlags) -> HeadIdentity:
        """The identity the run's head starts with: the one the flags name, or one made for the run (``created``:
        the run's end deletes it)."""
        ...

    def prepare_run(self, provider: Any, run_id: str) -> None:
        """What the run needs on this cloud before its head starts (GCP: the workers' Cloud NAT); fails the run
        now where it cannot be had."""
        ...

    def delete_identity(self, run_id: str) -> list[str]:
        """Delete what rubberband made for ``run_id``'s head identity; what was deleted, for the user."""
        ...

    def identity_left(self, run_id: str) -> str:
        """What a user deletes by hand when :meth:`delete_identity` could not look (one phrase)."""
        ...

    def sweep_identities(
        self, live: set[str], regions: list[str], *, older_than_s: float, now: float, echo: Callable[[str], None]
    ) -> int:
        """Delete the head identities of runs with no instance left (``live``: runs that still have one), made at
        least ``older_than_s`` ago; how many resources went."""
        ...

    def check_identity(self, flags: HeadFlags, run_id: str) -> list[PermissionCheck]:
        """The dry run's checks of the head's identity: it exists and may do what the run needs, or the CLI may
        make it."""
        ...

    def policy_docs(self) -> str:
        """The identity's policies as docs/clouds.md prints them."""
        ...


class CloudDescriptor(Protocol):
    """Everything cloud-specific, for the one cloud ``facts.name`` (see the module docstring)."""

    @property
    def facts(self) -> CloudFacts: ...
    #: head mode; None: the run's head is this machine's Ray (the cloud's provider is the executor's backend)
    @property
    def head(self) -> HeadMode | None: ...
    #: ``rubberband catalog update``: refresh the cloud's prices from its API into a directory; None: its prices ship
    #: with rubberband
    @property
    def refresh_catalog(self) -> Callable[[list[str] | None, list[str] | None, Path], RefreshedCatalog] | None: ...

    def provider(self, region: str, **options: Any) -> Provider:
        """The cloud's provider for ``region`` (credentials from the cloud's standard chain)."""
        ...

    def notice_reader(self, base_url: str, timeout_s: float) -> NoticeRead | None:
        """A reader of the preemption notice at ``base_url`` (the metadata server's, ``/``-terminated); None: the
        cloud posts no notices."""
        ...


def ssh_flags_needed(cloud: str, more: str = "") -> str:
    """The one-line error of a head-mode run whose SSH flags are missing (``more``: the cloud's own, e.g. its key
    pair)."""
    return (
        f"--cloud {cloud} runs the executor on a head instance reached over SSH: pass --ssh-cidr "
        f"YOUR.IP/32 and --ssh-key PRIVATE_KEY{more} (or run with --head local from a machine "
        f"inside the cloud network)"
    )
