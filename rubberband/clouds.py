"""What rubberband knows about each cloud that is data, not code: one set of facts per cloud, in one file.

Every fact that differs between clouds and is not an SDK call — how a zone names its region, the metadata server a
node reads, the head's shape, whether spot exists, the billing rule, start-up and termination defaults, how the
catalog is laid out, which variable names a boot image — lives in ``catalogs/clouds.yaml`` and is read here, so that
the planner, the boot script, the notice watchers, the spot model and the backends ask one place instead of
branching on a cloud's name each in its own way. The code half of a cloud (its provider, identities, notice parser,
clean-up) is its package under ``cloud/<name>/`` (:mod:`rubberband.cloud.registry`; docs/adding-a-cloud.md).
A cloud this file does not know is an :class:`~rubberband.errors.InputError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Literal, overload

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from rubberband.errors import InputError

FACTS_FILE = "clouds.yaml"


@dataclass(frozen=True)
class BillingRule:
    """Per-second billing with a minimum charge; a lifetime runs from request to termination.

    :meth:`billed_seconds` is the one billing function: the executor's accounting bills each
    journaled instance with it and the planner's simulator bills its simulated instances with it
    (element-wise on arrays of lifetimes), so a prediction is billed exactly like the run.
    """

    granularity_s: float = 1.0
    minimum_s: float = 60.0

    @overload
    def billed_seconds(self, lifetime_s: float) -> float: ...
    @overload
    def billed_seconds(self, lifetime_s: np.ndarray) -> np.ndarray: ...

    def billed_seconds(self, lifetime_s):
        """Seconds billed for a lifetime (a float, or element-wise for an array of them)."""
        billed = np.maximum(np.maximum(lifetime_s, 0.0), self.minimum_s)
        out = np.ceil(billed / self.granularity_s - 1e-9) * self.granularity_s
        return float(out) if np.ndim(out) == 0 else out

    def cost(self, lifetime_s: float, price_per_hour: float) -> float:
        return self.billed_seconds(lifetime_s) * price_per_hour / 3600.0


class HeadShape(BaseModel):
    """The run's head instance: a small on-demand CPU machine (the catalog builds its InstanceType)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    vcpus: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    price_hr: float = Field(gt=0)


class CloudFacts(BaseModel):
    """One cloud's facts (the fields are described at the top of ``catalogs/clouds.yaml``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    label: str
    metadata_url: str | None
    notice_path: str | None
    zone_suffix: str
    spot: bool
    head: HeadShape | None
    billing: BillingRule
    transfer_usd_per_gb: float = Field(ge=0)
    startup_s: tuple[float, ...] = Field(min_length=1)
    termination_s: tuple[float, ...] = Field(min_length=1)
    serial_provisioning: bool
    head_boots_first: bool
    catalog_layout: Literal["rows", "hosts_and_gpus"]
    image_env: str | None
    profiling: bool
    one_listing: bool
    resources_after_head: bool
    spot_trace_kinds: dict[str, str] = Field(default_factory=dict)

    def region_of(self, zone: str) -> str:
        """The region a zone lies in (``us-east-1a`` → ``us-east-1``, ``us-central1-a`` → ``us-central1``);
        a name that is no zone (a region, an aggregate like ``us-east-1*``) comes back as it is."""
        return re.sub(self.zone_suffix, "", zone) or zone

    @property
    def notice_url(self) -> str | None:
        """The base URL the preemption-notice watchers read, ending in ``/``; None: no notices on this cloud."""
        if self.metadata_url is None or self.notice_path is None:
            return None
        return f"{self.metadata_url.rstrip('/')}/{self.notice_path}"


def _load() -> tuple[dict[str, CloudFacts], str]:
    """The shipped facts file, parsed and checked (a broken file is a packaging error: it raises at import)."""
    doc = yaml.safe_load(resources.files("rubberband.catalogs").joinpath(FACTS_FILE).read_text())
    clouds = {name: CloudFacts(name=name, **entry) for name, entry in doc["clouds"].items()}
    return clouds, str(doc["default_cloud"])


#: Every cloud rubberband knows, by name (read once: shipped data, never changed while running).
CLOUDS, DEFAULT_CLOUD = _load()


def cloud(name: str) -> CloudFacts:
    """The facts of the cloud ``name``; an unknown one is an InputError naming the known ones."""
    try:
        return CLOUDS[name]
    except KeyError:
        raise InputError(f"unknown cloud {name!r}; rubberband knows {', '.join(sorted(CLOUDS))}") from None


def facts_or_like(name: str) -> CloudFacts:
    """The facts of ``name``, or, for a cloud this file does not list (a test catalog's own), those of the default
    cloud (``default_cloud``), which it is billed and started up like."""
    return CLOUDS.get(name) or CLOUDS[DEFAULT_CLOUD]


def billing_rule(name: str) -> BillingRule:
    """How ``name`` bills (:func:`facts_or_like`)."""
    return facts_or_like(name).billing


def chosen_image(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The machine image the user chose for cloud ``name`` in this process's environment (the variable its facts
    name: ``RUBBERBAND_AWS_AMI``, ``RUBBERBAND_GCP_IMAGE``), or None.

    Read where the environment is the user's (the CLI, its providers): the head's jobs run without it, so head mode
    carries the choice to its head on the run job's command line (``head_job run --image``)."""
    variable = cloud(name).image_env
    value = (os.environ if environ is None else environ).get(variable or "", "").strip()
    return value or None


def rented_clouds() -> list[str]:
    """The clouds that rent instances (a run there boots a head instance of its own; the local backend's head is
    this machine)."""
    return [name for name, facts in CLOUDS.items() if facts.head is not None]
