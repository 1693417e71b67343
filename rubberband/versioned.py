"""Reading and validation of versioned JSON documents (plans, profiles) into one-line input errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from rubberband.errors import InputError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class DocumentSchema(Generic[M]):
    """A kind of versioned JSON document, as :func:`validate_versioned` checks it.

    ``model``: the pydantic model it validates into; ``kind``: its name in messages ("plan", "profile");
    ``version``: the ``schema_version`` it must have; ``error``: the InputError subclass its problems raise;
    ``remedy``: what those messages tell the user to do ("regenerate it with `rubberband plan`")."""

    model: type[M]
    kind: str
    version: int
    error: type[InputError]
    remedy: str


def validate_versioned(schema: DocumentSchema[M], data: Any, *, source: str) -> M:
    """``schema.model`` from parsed JSON (read from ``source``), or ``schema.error`` naming the first bad field and
    the remedy.

    A ``schema_version`` other than ``schema.version`` is refused before field validation, so old files get a clear
    "re-create it".
    """
    model, kind, version, error, remedy = schema.model, schema.kind, schema.version, schema.error, schema.remedy
    if not isinstance(data, dict):
        raise error(f"{source}: a {kind} must be a JSON object; {remedy}")
    found = data.get("schema_version")
    if found is not None and found != version:
        raise error(
            f"{source}: {kind} schema_version {found!r} is not supported; this rubberband reads "
            f"version {version} ({remedy})"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing; add it"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        raise error(f"{source}: {kind} field '{field}': {msg}; {remedy}") from None


def read_json(path: Path, *, kind: str, error: type[InputError], missing: str, remedy: str) -> Any:
    """Parsed JSON of ``path``, or ``error``: ``missing`` when it does not exist, else what is wrong and ``remedy``."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{kind} {path} does not exist; {missing}") from None
    except IsADirectoryError:
        raise error(f"{path} is a directory; pass a {kind} JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise error(f"{path}{':' + str(line) if line else ''}: {kind} is not valid JSON; {remedy}") from None
