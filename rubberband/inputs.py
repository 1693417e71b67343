"""Load everything a command needs for one job spec: the spec, its profile and the allowed catalog.

Shared by ``plan``, ``report`` and the executor so that every command resolves the profile path
and filters the catalog the same way. Errors are the one-line ``rubberband.errors`` kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rubberband.catalog import Catalog, load_catalog
from rubberband.clouds import rented_clouds
from rubberband.errors import InputError, ProfileError
from rubberband.profile import Profile, load_profile
from rubberband.spec import CLOUDS, JobSpec, load_spec

CLOUD_CHOICES = (*CLOUDS, "any")


@dataclass(frozen=True)
class JobInputs:
    spec: JobSpec
    profile: Profile
    profile_path: Path
    catalog: Catalog


def resolve_profile_path(spec: JobSpec, override: str | Path | None = None) -> Path:
    """``--profile`` wins over the spec's ``profile:`` (relative to the spec's folder)."""
    if override is not None:
        return Path(override)
    path = spec.profile_path()
    if path is None:
        raise ProfileError(
            "no profile given: pass --profile PATH or set `profile:` in the spec (create one with `rubberband profile`)"
        )
    return path


def catalog_for(spec: JobSpec, cloud: str | None = None, *, directory: str | Path | None = None) -> Catalog:
    """The catalog filtered by the spec's resources (and ``cloud``: one cloud, or ``any``)."""
    if cloud is not None and cloud not in CLOUD_CHOICES:
        raise InputError(f"--cloud must be one of {', '.join(CLOUD_CHOICES)} (got {cloud!r})")
    if cloud in (None, ""):
        clouds = list(spec.resources.clouds)
    elif cloud == "any":
        clouds = rented_clouds() + [c for c in spec.resources.clouds if c not in rented_clouds()]
    else:
        clouds = [cloud]
    catalog = load_catalog(clouds, directory=directory)
    res = spec.resources
    return catalog.filter(clouds=clouds, regions=res.regions, names=res.instance_types, spot=res.spot)


def load_job_inputs(
    spec_path: str | Path,
    *,
    profile: str | Path | None = None,
    cloud: str | None = None,
    catalog_dir: str | Path | None = None,
) -> JobInputs:
    spec = load_spec(spec_path)
    path = resolve_profile_path(spec, profile)
    catalog = catalog_for(spec, cloud, directory=catalog_dir)
    return JobInputs(spec=spec, profile=load_profile(path), profile_path=path.resolve(), catalog=catalog)
