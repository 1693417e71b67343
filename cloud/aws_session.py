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
    """A fresh ``boto3.Session`` (the default credential and config chain) reading models through the shared loader."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    core.register_component("data_loader", _shared_loader(core.get_config_variable("data_path")))
    return boto3.Session(botocore_session=core)
