"""Startup scripts (EC2 user-data, GCE ``startup-script``) for a run's head and workers.

One renderer for both clouds. A script installs the runtime (a venv with rubberband,
Ray and torch), learns the instance's own id from the metadata server (IMDSv2 on AWS),
and then either starts the run's Ray head plus its self-termination watchdog
(:mod:`rubberband.cloud.head`) or joins the head as a worker node that offers the custom
resource ``rb-node-<instance id>`` (see CONTRACT_TRIALS.md).

Safety nets that need no API permission: the instance's ``shutdown`` terminates it
(AWS ``InstanceInitiatedShutdownBehavior=terminate``), a hard lifetime cap schedules that
shutdown at boot, and a worker that cannot reach its head for ``head_lost_timeout_s``
shuts itself down.

A script never carries a credential: the renderer takes none, and
:func:`assert_no_credentials` refuses anything that looks like one. Instances get their
cloud access from their instance role / service account.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

from rubberband.errors import InputError

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
RAY_PORT = 6379
VENV = "/opt/rubberband"
RUN_ROOT = "/var/lib/rubberband/runs"
DASHBOARD_PORT = 8265  # Ray's dashboard and job server, on the head's 127.0.0.1 only (reached over SSH)
#: Environment the head's Ray (and so every Ray job the CLI submits to it) runs with: where run
#: directories go and which instance is the head (read by ``rubberband.cloud.head_job``).
RUN_ROOT_ENV = "RUBBERBAND_RUN_ROOT"
HEAD_ID_ENV = "RUBBERBAND_HEAD_ID"

# Patterns of things that must never appear in user-data, logs or journals.
_CREDENTIAL_PATTERNS = (
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"aws_secret_access_key|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN", re.I),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r'"private_key"\s*:'),  # GCP service-account key files
    re.compile(r"\bya29\.[0-9A-Za-z_-]{10,}"),  # Google OAuth access tokens
)


def validate_run_id(run_id: str) -> str:
    """Run ids become tags, GCE labels, names and shell words: keep them to [a-z0-9-]."""
    if not RUN_ID_RE.match(run_id or ""):
        raise InputError(f"run id {run_id!r} is not usable on a cloud: use 1-41 characters of lowercase "
                         f"letters, digits and '-', starting with a letter or digit")
    return run_id


def check_request(request, *, cloud: str, region: str, provider: str) -> None:
    """What every cloud provider checks before any API call: run id, cloud, region, zone and count.

    ``request`` is a :class:`~rubberband.cloud.provider.InstanceRequest`; bad input is an
    InputError (exit 2) and nothing is provisioned.
    """
    validate_run_id(request.run_id)
    itype = request.instance_type
    if itype.cloud != cloud:
        raise InputError(f"instance type {itype.name!r} belongs to {itype.cloud}, not {cloud}")
    if itype.region != region:
        raise InputError(f"instance type {itype.name} is listed for {itype.region}, but this {provider} provider "
                         f"serves {region}")
    if request.zone and itype.zones and request.zone not in itype.zones:
        raise InputError(f"zone {request.zone!r} does not offer {itype.name}; use one of {', '.join(itype.zones)}")
    if request.count < 1:
        raise InputError(f"instance count must be at least 1, got {request.count}")


def cloud_run_id(text: str) -> str:
    """Map any run id (e.g. ``MNIST_tune-20261121T0530``) onto one :func:`validate_run_id` accepts."""
    import hashlib

    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "run"
    if clean == text and len(clean) <= 41:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{clean[:34].rstrip('-')}-{digest}"


def check_ssh_cidr(cidr: str) -> str:
    """A CIDR SSH may come from; the whole internet (a /0) is refused."""
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise InputError(f"SSH CIDR {cidr!r} is not a network address; give e.g. 203.0.113.7/32") from None
    if network.prefixlen == 0:
        raise InputError(f"SSH CIDR {cidr} would open SSH to the whole internet; give your own address, "
                         f"e.g. 203.0.113.7/32")
    return str(network)


def redact(text: str) -> str:
    """Replace anything credential-like in ``text`` (e.g. a provider's error message) with ``[redacted]``."""
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub("[redacted]", text)
    return text


def assert_no_credentials(text: str, *, what: str = "startup script") -> str:
    """Raise if ``text`` contains anything that looks like a credential; return it unchanged otherwise."""
    for pattern in _CREDENTIAL_PATTERNS:
        if pattern.search(text):
            raise InputError(f"refusing to write a {what} that contains a credential-like string "
                             f"(pattern {pattern.pattern!r}); credentials come from the instance role")
    return text


@dataclass(frozen=True)
class WatchdogSettings:
    """When the head gives up and terminates the run (see :func:`rubberband.cloud.head.decide`)."""

    submit_timeout_s: float = 1800.0  # no run submitted this long after boot
    stall_timeout_s: float = 3600.0  # the run's journal unchanged this long
    done_grace_s: float = 600.0  # after the run finished, time for the CLI to fetch results
    max_lifetime_s: float = 7 * 24 * 3600.0  # hard cap
    poll_s: float = 30.0


@dataclass(frozen=True)
class BootstrapConfig:
    """Everything a node needs to know at boot: run, role, versions, where the head is."""

    run_id: str
    cloud: Literal["aws", "gcp"]
    role: Literal["head", "worker"]
    rubberband_version: str
    ray_version: str
    region: str = ""
    head_address: str | None = None  # private address of the head (workers only)
    workers: int = 1  # trial workers this node holds (GPUs on GPU types)
    use_gpu: bool = True
    cpus: int | None = None  # CPUs the node advertises (executor.devices.node_resources); None: ``workers``
    extra_packages: tuple[str, ...] = ()
    rubberband_spec: str | None = None  # pip requirement for rubberband itself (a wheel URL, a git URL)
    torch_spec: str = "torch"
    head_lost_timeout_s: float = 900.0
    max_lifetime_s: float | None = None
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    ray_port: int = RAY_PORT
    venv: str = VENV  # where the runtime is installed
    run_root: str = RUN_ROOT  # run directories (the head's watchdog watches <run_root>/<run id>)
    log_dir: str = "/var/log"


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _instance_id_lines(cloud: str) -> list[str]:
    if cloud == "aws":
        return [
            'IMDS_TOKEN="$(curl -sS -X PUT http://169.254.169.254/latest/api/token '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")"',
            'INSTANCE_ID="$(curl -sS -H "X-aws-ec2-metadata-token: ${IMDS_TOKEN}" '
            'http://169.254.169.254/latest/meta-data/instance-id)"',
            "unset IMDS_TOKEN",
        ]
    return ['INSTANCE_ID="$(curl -sS -H "Metadata-Flavor: Google" '
            'http://metadata.google.internal/computeMetadata/v1/instance/name)"']


def render_startup_script(config: BootstrapConfig) -> str:
    """The bash script a node runs at first boot (EC2 user-data / GCE startup-script)."""
    validate_run_id(config.run_id)
    if config.role == "worker" and not config.head_address:
        raise InputError("a worker's startup script needs the head's address (head_address)")
    packages = [config.rubberband_spec or f"rubberband=={config.rubberband_version}",
                f"ray[default]=={config.ray_version}",
                config.torch_spec, *config.extra_packages]
    lines = [
        "#!/bin/bash",
        f"# rubberband {config.role} node of run {config.run_id} (rubberband {config.rubberband_version}).",
        "# Rendered by rubberband.cloud.bootstrap; holds no credentials (cloud access comes from the",
        "# instance role / service account).",
        "set -euo pipefail",
        f"exec >>{_q(config.log_dir)}/rubberband-bootstrap.log 2>&1",
    ]
    if config.max_lifetime_s:
        minutes = max(1, int(config.max_lifetime_s // 60))
        lines += ["# hard lifetime cap: shutdown terminates this instance", f"shutdown -h +{minutes} || true"]
    venv, run_dir = _q(config.venv), f"{_q(config.run_root)}/\"${{RB_RUN_ID}}\""
    lines += [
        f"RB_RUN_ID={_q(config.run_id)}",
        *_instance_id_lines(config.cloud),
        "export RAY_USAGE_STATS_ENABLED=0",
        "# cluster traffic is confined to the run's security group / firewall tag (see docs/clouds.md)",
        "export RAY_AUTH_MODE=disabled",
        f"if [ ! -x {venv}/bin/ray ]; then",
        f"  python3 -m venv {venv}",
        f"  {venv}/bin/pip install --quiet --upgrade pip",
        f"  {venv}/bin/pip install --quiet {' '.join(_q(p) for p in packages)}",
        "fi",
        f"mkdir -p {run_dir}",
    ]
    if config.role == "head":
        wd = config.watchdog
        lines += [
            "# the run's executor arrives as a Ray job (python -m rubberband.cloud.head_job run ...)",
            f"export PATH={venv}/bin:\"$PATH\" {RUN_ROOT_ENV}={_q(config.run_root)} "
            f"{HEAD_ID_ENV}=\"${{INSTANCE_ID}}\"",
            "# the head schedules no trial work; dashboard and job server listen on localhost (reach them over SSH)",
            f"{venv}/bin/ray start --head --port={config.ray_port} --num-cpus=0 --dashboard-host=127.0.0.1 "
            f"--dashboard-port={DASHBOARD_PORT} --resources='{json.dumps({'rb-head': 1})}'",
            "# self-termination watchdog: ends every worker of the run, then this head",
            f"nohup {venv}/bin/python -m rubberband.cloud.head watchdog --cloud {_q(config.cloud)} "
            f"--region {_q(config.region)} --run-id \"${{RB_RUN_ID}}\" --head-id \"${{INSTANCE_ID}}\" "
            f"--run-dir {run_dir} --submit-timeout {wd.submit_timeout_s:g} "
            f"--stall-timeout {wd.stall_timeout_s:g} --done-grace {wd.done_grace_s:g} "
            f"--max-lifetime {wd.max_lifetime_s:g} --poll {wd.poll_s:g} "
            f">>{_q(config.log_dir)}/rubberband-watchdog.log 2>&1 &",
        ]
    else:
        head = f"{config.head_address}:{config.ray_port}"
        cpus = config.workers if config.cpus is None else config.cpus
        device = f"--num-gpus={config.workers} --num-cpus={cpus}" if config.use_gpu else f"--num-cpus={cpus}"
        lines += [
            f"RB_HEAD={_q(head)}",
            f"{venv}/bin/ray start --address=\"${{RB_HEAD}}\" {device} "
            f"--resources=\"{{\\\"rb-node-${{INSTANCE_ID}}\\\": {config.workers}}}\"",
            "# head-loss watchdog: a worker whose head is gone shuts down (and so terminates)",
            "(lost=0; while sleep 60; do",
            f"   if {venv}/bin/ray health-check --address \"${{RB_HEAD}}\" >/dev/null 2>&1; then lost=0;",
            "   else lost=$((lost + 60)); fi",
            f"   if [ \"$lost\" -ge {int(config.head_lost_timeout_s)} ]; then shutdown -h now; fi",
            " done) >/dev/null 2>&1 &",
        ]
    return assert_no_credentials("\n".join(lines) + "\n")
