"""What a startup script says differently on each cloud: how a node learns its own id and how it ends itself.

:mod:`rubberband.cloud.bootstrap` renders one script for every cloud; the few lines that differ come from the cloud's
:class:`BootDialect` (``cloud/<name>/boot.py``), which the cloud's provider hands to the renderer (its
``boot_dialect``) — the renderer itself names no cloud.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rubberband.errors import InputError


class BootDialect(Protocol):
    """One cloud's boot-script lines (bash)."""

    #: the cloud (rubberband/clouds.py) whose metadata server (``metadata_url``) the lines read
    @property
    def cloud(self) -> str: ...
    #: how long a node's own power-offs wait beyond the deletion they back up (0: a power-off ends the instance)
    @property
    def backstop_s(self) -> float: ...
    #: the API a node that ends itself deletes itself through ("": it powers off instead)
    @property
    def api_url(self) -> str: ...

    def instance_id_lines(self, metadata_url: str) -> list[str]:
        """Lines that set ``INSTANCE_ID`` to this instance's id, read from the metadata server at ``metadata_url``."""
        ...

    def self_delete_lines(self, *, metadata_url: str, api_url: str, console: str) -> list[str]:
        """Lines that define ``self_delete``: delete this instance through the cloud's API (``api_url``) and wait
        until it is gone, returning non-zero where that did not take; [] where powering off ends the instance."""
        ...


@runtime_checkable
class ScriptBooted(Protocol):
    """A provider whose instances boot from a startup script in its cloud's dialect."""

    @property
    def boot_dialect(self) -> BootDialect: ...


def dialect_of(provider: Any) -> BootDialect:
    """The boot dialect of ``provider``'s instances; InputError for a provider whose instances boot from no
    startup script (local nodes)."""
    if not isinstance(provider, ScriptBooted):
        raise InputError(f"{getattr(provider, 'cloud', provider)!r} instances boot from no startup script")
    return provider.boot_dialect
