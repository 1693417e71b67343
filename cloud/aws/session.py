"""boto3 sessions that share one botocore data loader per process.

A new ``boto3.Session()`` reads botocore's service models afresh: EC2's alone is megabytes of JSON, about 0.3 s of
CPU per session. rubberband makes a session per region it provides in (failover visits several), one for IAM and
one for pricing, so each CLI command paid that several times over. The models are read-only files of the installed
botocore, so one loader (which caches what it has read) serves every session; credentials, region and endpoint
stay per session, resolved as boto3 always does.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _shared_loader(data_path: str | None) -> Any:
    from botocore.loaders import create_loader

    return create_loader(data_path)


def new_session() -> Any:
    """A fresh ``boto3.Session`` (the default credential and config chain) reading models through the shared loader;
    every client made from it refuses an answer that is not its API's (:func:`refuse_unreadable_answer`)."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    core.register_component("data_loader", _shared_loader(core.get_config_variable("data_path")))
    core.register("before-parse", refuse_unreadable_answer)
    return boto3.Session(botocore_session=core)


def refuse_unreadable_answer(operation_model: Any, response_dict: dict, **_: Any) -> None:
    """botocore's ``before-parse`` hook: an answer that is not the API's kind of document (a proxy's or captive
    portal's HTML page, plain text) is an :class:`~rubberband.errors.UnexpectedAnswer` naming the call, before
    botocore reads it as an empty result (a missing key deep in rubberband) or fails with a parser traceback."""
    body = response_dict.get("body") or b""
    if not isinstance(body, (bytes, bytearray)) or not body.strip():
        return  # streamed or empty (an answer with no body, e.g. a delete): nothing to judge
    head = bytes(body[:200]).lstrip().lower()
    protocol = operation_model.service_model.resolved_protocol
    xml = protocol in ("query", "ec2", "rest-xml")
    readable = (
        head.startswith((b"{", b"["))
        if not xml
        else head.startswith(b"<") and not head.startswith((b"<html", b"<!doctype html"))
    )
    if not readable:
        from rubberband.errors import UnexpectedAnswer

        service = operation_model.service_model.endpoint_prefix
        status = response_dict.get("status_code")
        text = bytes(body[:120]).decode("utf-8", "replace").replace("\n", " ")
        raise UnexpectedAnswer(f"aws {service}:{operation_model.name}", f"HTTP {status}: {text}")
