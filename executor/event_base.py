"""The base of every journal event (run, instance, stage, trial and decision events alike)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class _Event(BaseModel):
    """Every event: ``type`` (the discriminator) and ``t``, POSIX seconds (the writer fills it in when None)."""

    model_config = ConfigDict(extra="forbid")

    #: fields written only when they apply: None leaves them out of the line (as the untyped journal did)
    omit_none: ClassVar[frozenset[str]] = frozenset()

    t: float | None = None
