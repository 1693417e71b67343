"""Startup scripts (EC2 user-data, GCE ``startup-script``) for a run's head and workers.

One renderer for both clouds. A script installs the runtime (a venv with the client's Ray, rubberband's
runtime pinned to the client's versions, torch where the image lacks it, and the spec's requirements:
pinned third-party packages only),
learns the instance's own id from the metadata server (IMDSv2 on AWS), and then either starts
the run's Ray head or joins the head as a worker node that offers the custom resource
``rb-node-<instance id>`` (see docs/training-api.md, "The runtime underneath"). rubberband itself, the head's watchdog
(:mod:`rubberband.cloud.head`) and the training code come with the CLI's Ray jobs
(:mod:`rubberband.cloud.shipping`), never from a package index.

Safety nets set up before anything that can fail (pip, Ray): the hard lifetime cap is scheduled
first (``shutdown +N``; the instance's ``shutdown`` terminates it on AWS,
``InstanceInitiatedShutdownBehavior=terminate``; GCP deletes it at its ``maxRunDuration``, and the
power-off only backs that up, :data:`~rubberband.cloud.gcp.boot.GCP_BACKSTOP_S` later), then the node's watchdog
(:func:`render_node_watchdog`) is installed as a systemd service, so it survives a reboot: it ends the
node at the cap, after a failed or hung boot, when a worker cannot reach its head for
``head_lost_timeout_s``, and when the head's run was never submitted or its run watchdog asks for it —
on GCP by deleting the VM through the API with its own service account where it has one (a GCP VM that
only powers off is stopped, not deleted), else by powering it off.

A script never carries a credential: the renderer takes none, and
:func:`assert_no_credentials` refuses anything that looks like one. Instances get their
cloud access from their instance role / service account.

Ray runs with token authentication (``RAY_AUTH_MODE=token``, the token in
``<state_dir>/ray-token``, :data:`TOKEN_FILE`). The per-run token never travels in user-data or
metadata: the CLI writes it onto the head over its SSH link, and the head's executor pushes it to
each worker over SSH inside the run's network, to a drop account whose only authorized key is
the head's (a forced command that can write the token file and nothing else); a node starts Ray
only once its token is there (:func:`_token_lines`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rubberband.cloud.host_keys import host_key_lines
from rubberband.cloud.shell import say_line, shell_word, shell_words
from rubberband import DIST_NAME
from rubberband.cloud.boot_dialect import BootDialect
from rubberband.clouds import cloud as cloud_facts
from rubberband.credentials import assert_no_credentials, refuse_requirement_credentials
from rubberband.errors import InputError

_q = shell_word  # short for the many paths in the scripts below

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
RAY_PORT = 6379
VENV = "/opt/rubberband"
RUN_ROOT = "/var/lib/rubberband/runs"
DASHBOARD_PORT = 8265  # Ray's dashboard and job server, on the head's 127.0.0.1 only (reached over SSH)
#: Environment the head's Ray (and so every Ray job the CLI submits to it) runs with: where run
#: directories go and which instance is the head (read by ``rubberband.head_job``).
RUN_ROOT_ENV = "RUBBERBAND_RUN_ROOT"
HEAD_ID_ENV = "RUBBERBAND_HEAD_ID"

_VERSION_RE = re.compile(r"[A-Za-z0-9.+!_-]{1,64}")


def validate_run_id(run_id: str) -> str:
    """Run ids become tags, GCE labels, names and shell words: keep them to [a-z0-9-]."""
    if not RUN_ID_RE.match(run_id or ""):
        raise InputError(
            f"run id {run_id!r} is not usable on a cloud: use 1-41 characters of lowercase "
            f"letters, digits and '-', starting with a letter or digit"
        )
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
        raise InputError(
            f"instance type {itype.name} is listed for {itype.region}, but this {provider} provider serves {region}"
        )
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


def run_root() -> Path:
    """Where the head keeps run directories (set by the head's startup script)."""
    return Path(os.environ.get(RUN_ROOT_ENV) or RUN_ROOT)


def head_run_dir(run_id: str) -> Path:
    """The run's directory on the head: ``<run root>/<cloud run id>`` (what the watchdog watches)."""
    return run_root() / cloud_run_id(run_id)


def check_ssh_cidr(cidr: str) -> str:
    """An IPv4 CIDR SSH may come from; the whole internet (a /0) is refused, and so is IPv6: the run's head has
    only an IPv4 public address (default VPC / network), so an IPv6 rule would let nobody in."""
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise InputError(f"SSH CIDR {cidr!r} is not a network address; give e.g. 203.0.113.7/32") from None
    if network.version == 6:
        raise InputError(
            f"SSH CIDR {cidr} is IPv6, but the run's head has only an IPv4 public address: give your "
            f"IPv4 address, e.g. 203.0.113.7/32 (`curl -4 ifconfig.me` shows it)"
        )
    if network.prefixlen == 0:
        raise InputError(
            f"SSH CIDR {cidr} would open SSH to the whole internet; give your own address, e.g. 203.0.113.7/32"
        )
    return str(network)


@dataclass(frozen=True)
class WatchdogSettings:
    """When the head gives up and terminates the run (see :func:`rubberband.cloud.head.decide`)."""

    submit_timeout_s: float = 1800.0  # no run submitted this long after boot
    stall_timeout_s: float = 3600.0  # the run's journal unchanged this long
    done_grace_s: float = 600.0  # after the run finished, time for the CLI to fetch results
    max_lifetime_s: float = 7 * 24 * 3600.0  # hard cap
    poll_s: float = 30.0

    def flags(self) -> list[str]:
        """The settings as the watchdog's command line takes them (``--submit-timeout S`` ...)."""
        return [
            *("--submit-timeout", f"{self.submit_timeout_s:g}"),
            *("--stall-timeout", f"{self.stall_timeout_s:g}"),
            *("--done-grace", f"{self.done_grace_s:g}"),
            *("--max-lifetime", f"{self.max_lifetime_s:g}"),
            *("--poll", f"{self.poll_s:g}"),
        ]


#: The longest any node of a run may live, whatever the plan says (the head's default cap).
MAX_LIFETIME_CEILING_S = 7 * 24 * 3600.0
#: What a lifetime cap allows beyond the run itself: booting the head, starting workers, fetching results.
LIFETIME_MARGIN_S = 1800.0


def lifetime_cap_s(
    deadline_s: float | None,
    overrun_s: float = 0.0,
    grace_s: float = 0.0,
    *,
    margin_s: float = LIFETIME_MARGIN_S,
    ceiling_s: float = MAX_LIFETIME_CEILING_S,
) -> float:
    """A run's hard lifetime cap from its plan: deadline + overrun + results grace + a boot margin.

    No deadline, or an unbounded overrun (``--overrun none``), leaves only the ceiling. Pure: the
    head's watchdog settings and every worker's cap (measured from the run's start) come from it."""
    if deadline_s is None or deadline_s <= 0 or overrun_s is None or overrun_s == float("inf"):
        return ceiling_s
    return min(ceiling_s, float(deadline_s) + max(0.0, float(overrun_s)) + max(0.0, float(grace_s)) + margin_s)


#: Python interpreters of the images rubberband boots, tried before ``python3.X`` / ``python3`` on PATH:
#: the PyTorch Deep Learning AMI's environment and the Deep Learning VM's conda.
IMAGE_PYTHONS = ("/opt/pytorch/bin/python3", "/opt/conda/bin/python3")
#: The Python minors a head may boot on when it takes the image's own (``python_version=None``): Ray's wheels.
IMAGE_PYTHON_RANGE = ((3, 10), (3, 13))
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: What a node's boot prints (console and log) when it fails; rubberband looks for it in the console output.
BOOT_FAILED = "rubberband-boot: FAILED:"
#: A file the head's watchdog (a Ray job, without the rights of the boot) writes to ask for a power-off.
POWEROFF_MARKER = "POWEROFF"
#: The node watchdog's systemd unit (installed by every startup script before anything that can fail).
WATCHDOG_UNIT = "rubberband-watchdog.service"
#: Stops the node's Ray when the node powers off (Ray's gcs_server and raylet outwait systemd's final SIGTERM).
RAY_STOP_UNIT = "rubberband-ray-stop.service"
#: The run's Ray token on a node, in its state directory (root only).
TOKEN_FILE = "ray-token"
#: `ray start` tries before a boot fails (:func:`_ray_start_function`).
RAY_START_TRIES = 3
#: Seconds a failed `ray start` try's processes get to stop after SIGTERM, before SIGKILL.
RAY_START_STOP_GRACE_S = 10
#: The account a worker receives its token through (ssh from the head, forced command) and its home.
TOKEN_DROP_USER = "rubberband-token"
#: On the head: where its key for pushing the token to workers is (the executor's job reads it from the env).
TOKEN_PUSH_KEY_ENV = "RUBBERBAND_TOKEN_PUSH_KEY"


@dataclass(frozen=True)
class BootstrapConfig:
    """Everything a node needs to know at boot: run, role, the versions that must match, where the head is.

    The versions are the submitting machine's (:func:`client_versions`): every node runs the same
    Python minor and the same Ray as the CLI that ships code to it. Paths, the metadata server and
    the power-off command are parameters so that a test can execute the very script on one machine
    (tests/test_cloud_boot.py); production code never changes them.
    """

    run_id: str
    dialect: BootDialect  # the cloud's lines (how a node learns its id, how it ends itself): its provider's
    role: Literal["head", "worker"]
    ray_version: str
    #: "3.11": the Python minor the node's interpreter must have (a worker: its head's / the CLI's, Ray joins
    #: need the same minor); None: the image's own Python, any of :data:`IMAGE_PYTHON_RANGE` (a cloud head: the
    #: CLI only talks to it over Ray's job HTTP API, and the head renders its workers' scripts with its own)
    python_version: str | None
    torch_version: str | None = None  # installed (pinned) only where the image has no torch
    rubberband_version: str = ""  # for the script's header only: rubberband itself comes with each job
    region: str = ""
    head_address: str | None = None  # private address of the head (workers only)
    workers: int = 1  # trial workers this node holds (GPUs on GPU types)
    use_gpu: bool = True
    cpus: int | None = None  # CPUs the node advertises (rubberband.devices.node_resources); None: ``workers``
    requirements: tuple[str, ...] = ()  # the spec's `requirements` (PEP 508, validated by the spec)
    #: rubberband's runtime dependencies pinned to the submitting machine's versions (runtime_requirements())
    runtime_requirements: tuple[str, ...] = ()
    head_lost_timeout_s: float = 900.0
    max_lifetime_s: float | None = None
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    ray_port: int = RAY_PORT
    dashboard_port: int = DASHBOARD_PORT
    ray_start_options: tuple[str, ...] = ()  # more `ray start` options (e.g. ports, where nodes share a machine)
    venv: str = VENV  # where the runtime is installed
    run_root: str = RUN_ROOT  # run directories (the head's watchdog watches <run_root>/<run id>)
    log_dir: str = "/var/log"
    console: str = "/dev/console"  # boot progress also goes here: the instance's serial console
    #: interpreters of the image tried first (AWS Deep Learning AMI, GCP Deep Learning VM: they carry CUDA torch)
    image_pythons: tuple[str, ...] = IMAGE_PYTHONS
    metadata_url: str | None = None  # the cloud's metadata server (default: the cloud's own)
    state_dir: str = "/var/lib/rubberband"  # the node watchdog's script and state (boot time, cap, markers)
    systemd_dir: str = "/etc/systemd/system"  # where the watchdog's unit goes
    boot_timeout_s: float = 3600.0  # a boot not finished by then (hung pip, ...) powers the node off
    failed_grace_s: float = 600.0  # a failed boot powers the node off this long after (time to read its console)
    #: Ray's authentication: ``token`` (the run's token, delivered over SSH; see the module docstring), or
    #: ``disabled`` for a worker of a head outside the cloud (``--head local``), which cannot push a token
    ray_auth: Literal["token", "disabled"] = "token"
    token_push_key: str | None = None  # worker (token mode): the head's public key that may write its token
    token_drop_dir: str = "/var/lib/rubberband-token"  # the drop account's home (sshd wants it owned by it)
    shutdown_command: str = "shutdown -h"  # + "now" / "+MINUTES": powers the instance off (terminates on AWS)
    ssh_dir: str = "/etc/ssh"  # the node's SSH host keys (a head prints their public halves on its console)
    #: the cloud API a node that ends itself deletes itself through (with its own identity's token; the dialect
    #: says whether it does); None: the dialect's own (tests pass a local fake)
    api_url: str | None = None
    torch_cpu_index: str = TORCH_CPU_INDEX

    @property
    def cloud(self) -> str:
        return self.dialect.cloud

    @property
    def metadata(self) -> str:
        """The metadata server's base URL, without a trailing slash (the one passed in, else the cloud's own)."""
        return (self.metadata_url or cloud_facts(self.cloud).metadata_url or "").rstrip("/")

    def __post_init__(self) -> None:
        if cloud_facts(self.cloud).metadata_url is None:
            raise InputError(f"cloud {self.cloud!r} boots no instances from a startup script")
        for name in ("ray_version", "torch_version", "rubberband_version"):
            value = getattr(self, name)
            if value and not _VERSION_RE.fullmatch(value):
                raise InputError(f"{name} {value!r} is not a version number like 2.41.0")
        for requirement in (*self.requirements, *self.runtime_requirements):
            refuse_requirement_credentials(requirement)
            if "\n" in requirement or "\r" in requirement:
                raise InputError(f"requirement {requirement!r} spans lines; give one PEP 508 requirement per entry")


#: Set in every rubberband job's environment by the CLI (``shipping.job_runtime_env``): the Ray and torch
#: versions and the pinned runtime packages of the machine that started the run, which the nodes a head
#: starts must match (the head's own runtime has no torch, and rubberband arrives there without metadata).
RUN_VERSIONS_ENV = "RUBBERBAND_RUN_VERSIONS"
#: rubberband's own dependencies that a node does not get from its runtime pins: Ray and torch have their own
#: rules (the client's Ray; the image's torch first), matplotlib only draws reports on the user's machine.
NOT_PINNED = frozenset({"ray", "torch", "matplotlib"})
#: Optional packages pinned too when the submitting machine has them (the head runs the spec's sampler).
OPTIONAL_PINNED = ("optuna",)


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def runtime_requirements() -> tuple[str, ...]:
    """rubberband's runtime dependencies pinned to this machine's versions (``numpy==2.4.6``, ...), for the nodes:
    the head runs the shipped executor and planner, every worker the trial runtime, with these exact versions."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires(DIST_NAME) or []
    except PackageNotFoundError:
        return ()
    names = [m.group(0) for r in declared if "extra ==" not in r and (m := re.match(r"[A-Za-z0-9_.-]+", r))]
    names += [n for n in OPTIONAL_PINNED if _installed(n)]
    pins = []
    for name in dict.fromkeys(names):
        found = _installed(name)
        if name.lower() not in NOT_PINNED and found:
            pins.append(f"{name}=={found}")
    return tuple(pins)


def passed_versions() -> dict:
    """What the CLI passes down to its jobs in ``$RUBBERBAND_RUN_VERSIONS`` (the Python minor is each machine's)."""
    versions = client_versions()
    return {
        "ray_version": versions["ray_version"],
        "torch_version": versions["torch_version"],
        "requirements": list(versions["requirements"]),
    }


def client_versions() -> dict:
    """What the nodes of a run must match: this interpreter's Python minor, and the submitting machine's Ray,
    torch and pinned runtime packages (:func:`runtime_requirements`).

    The Python minor is always this machine's: the CLI's for ``--head local`` (its Ray joins the cloud
    workers), the head's own on a head (its workers join it; the head boots on the image's Python). The rest
    is this machine's, or — in a job the CLI submitted to a head — what the CLI passed down in
    ``$RUBBERBAND_RUN_VERSIONS``: the head's runtime has no torch and the shipped rubberband no metadata, yet
    the worker scripts it renders must pin the CLI's versions.
    """
    import os
    import sys

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    passed = os.environ.get(RUN_VERSIONS_ENV)
    if passed:
        data = json.loads(passed)
        return {
            "python_version": python,
            "ray_version": str(data.get("ray_version") or _installed("ray")),
            "torch_version": str(data["torch_version"]) if data.get("torch_version") else None,
            "requirements": tuple(str(r) for r in data.get("requirements") or ()),
        }
    return {
        "python_version": python,
        "ray_version": _installed("ray") or "2.60.0",
        "torch_version": _installed("torch"),
        "requirements": runtime_requirements(),
    }


def _torch_lines(config: BootstrapConfig, py: str) -> list[str]:
    """Reuse the image's torch (the Deep Learning images carry a CUDA build); else install the client's version."""
    if config.role == "head" or not config.torch_version:
        return []  # the head trains nothing
    base = config.torch_version.split("+")[0]
    if config.use_gpu:
        install = f"{py} -m pip install --quiet {_q(f'torch=={base}')}"  # the index's Linux build is CUDA's
    else:
        install = (
            f"{py} -m pip install --quiet --extra-index-url {_q(config.torch_cpu_index)} {_q(f'torch=={base}+cpu')}"
        )
    return [
        f"if {py} -c 'import torch' 2>/dev/null; then",
        f"  say \"reusing the image's torch $({py} -c 'import torch; print(torch.__version__)')\"",
        "else",
        "  " + say_line(f"the image has no torch: installing torch {base}{'' if config.use_gpu else ' (CPU build)'}"),
        f"  {install}",
        "fi",
    ]


def render_node_watchdog(config: BootstrapConfig) -> str:
    """The node's own watchdog (bash), run as the systemd service :data:`WATCHDOG_UNIT`.

    Every ``poll`` seconds it ends the node — on GCP it deletes the VM through the Compute Engine API with the VM's
    own service account (the head's; workers have none) and powers it off (``shutdown_command now``) only where that
    did not take; on AWS the power-off terminates the instance (:func:`_off_lines`) — when

    * the node reached its lifetime cap (``<state_dir>/expires_at``, written once at first boot; on GCP
      :data:`~rubberband.cloud.gcp.boot.GCP_BACKSTOP_S` after the VM's ``maxRunDuration``, which deletes it first);
    * the boot failed (``<state_dir>/failed``) ten minutes ago, or did not finish within ``boot_timeout_s``;
    * head: the run's watchdog job left :data:`POWEROFF_MARKER` (it could not terminate the head through
      the API), or no run was submitted within ``submit_timeout_s`` of boot;
    * worker: the head's Ray did not answer for ``head_lost_timeout_s``.

    Being a service, it comes back after a reboot (which drops a pending ``shutdown +N``) and after a crash.
    """
    state = _q(config.state_dir)
    run_dir = f"{_q(config.run_root)}/{_q(config.run_id)}"
    ray = f"{_q(config.venv)}/bin/python -m ray.scripts.scripts"
    poll = 5 if config.role == "head" else 60
    lines = [
        "#!/bin/bash",
        f"# rubberband node watchdog of run {config.run_id} ({config.role}); installed by the startup script as",
        f"# {WATCHDOG_UNIT} before anything that can fail. Needs no cloud permission (a GCP VM with a "
        "service account deletes itself with it).",
        f"STATE={state}",
        'echo $$ > "$STATE/watchdog.pid"',
        *_off_lines(config),
        "export RAY_USAGE_STATS_ENABLED=0",
        *_ray_auth_lines(config),
        'booted="$(cat "$STATE/booted_at" 2>/dev/null || date +%s)"',
        "lost=0",
        'while [ -d "$STATE" ]; do',
        '  now="$(date +%s)"',
        '  if [ -s "$STATE/expires_at" ] && [ "$now" -ge "$(cat "$STATE/expires_at")" ]; then',
        "    off 'the node reached its lifetime cap'; fi",
        '  if [ -e "$STATE/failed" ]; then',
        f'    if [ $((now - $(stat -c %Y "$STATE/failed"))) -ge {int(config.failed_grace_s)} ]; then '
        "off 'the boot failed'; fi",
        '  elif [ ! -e "$STATE/ready" ]; then',
        f"    if [ $((now - booted)) -ge {int(config.boot_timeout_s)} ]; then "
        f"off 'the boot did not finish within {int(config.boot_timeout_s)}s'; fi",
    ]
    if config.role == "head":
        wd = config.watchdog
        lines += [
            "  else",
            f'    if [ -e {run_dir}/{POWEROFF_MARKER} ]; then off "the run\'s watchdog ended the run"; fi',
            f'    if [ $((now - booted)) -ge {int(wd.submit_timeout_s)} ] && [ -z "$(ls -A {run_dir} 2>/dev/null)" ]; '
            f"then off 'no run was submitted within {int(wd.submit_timeout_s)}s of boot'; fi",
        ]
    else:
        head = _q(f"{config.head_address}:{config.ray_port}")
        lines += [
            "  else",
            f"    if {ray} health-check --address {head} >/dev/null 2>&1; then lost=0; else lost=$((lost + {poll})); fi",
            f'    if [ "$lost" -ge {int(config.head_lost_timeout_s)} ]; then off "the head was unreachable for '
            f'${{lost}}s"; fi',
        ]
    lines += [
        "  fi",
        f"  sleep {poll} || exit 1",
        "done",
    ]
    return "\n".join(lines) + "\n"


def _off_lines(config: BootstrapConfig) -> list[str]:
    """The node watchdog's ``off``: where the cloud's dialect deletes the instance through its API (GCP:
    ``GcpBoot.self_delete_lines``), that first, and power off only where it did not take — a GCP VM that powers itself off is just
    stopped, and stays; on AWS power off, which terminates the instance. Either way :data:`RAY_STOP_UNIT` stops Ray
    as the machine goes down."""
    console = f">> {_q(config.console)} 2>/dev/null || true"
    lines = config.dialect.self_delete_lines(
        metadata_url=config.metadata, api_url=config.api_url or config.dialect.api_url, console=config.console
    )
    return [
        *lines,
        f'off() {{ echo "rubberband-boot: $(date -u +%H:%M:%S) watchdog: $*: powering off" {console}; '
        + ("self_delete && exit 0; " if lines else "")
        + f"{config.shutdown_command} now; exit 0; }}",
    ]


def _ray_auth_lines(config: BootstrapConfig) -> list[str]:
    """Ray's authentication mode for every Ray process of the node (the boot's and the watchdog's)."""
    if config.ray_auth == "disabled":
        return ["export RAY_AUTH_MODE=disabled"]
    return ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN_PATH={_q(config.state_dir)}/{TOKEN_FILE}"]


_PUBLIC_KEY_RE = re.compile(r"^ssh-ed25519 [A-Za-z0-9+/=]{40,120}( [A-Za-z0-9@._-]{0,60})?$")


def _token_drop_lines(config: BootstrapConfig) -> list[str]:
    """Worker, token mode, early in the boot: the drop account the head pushes the run's token to (over SSH from
    inside the run's network; its one key may only write the token: ``restrict`` + a forced command)."""
    key = (config.token_push_key or "").strip()
    if not _PUBLIC_KEY_RE.match(key):
        raise InputError("a worker's startup script in token mode needs the head's ed25519 public key (token_push_key)")
    drop = _q(config.token_drop_dir)
    forced = (
        f'restrict,command="umask 077; cat > {config.token_drop_dir}/{TOKEN_FILE}.part && '
        f'mv {config.token_drop_dir}/{TOKEN_FILE}.part {config.token_drop_dir}/{TOKEN_FILE}"'
    )
    return [
        "# the run's Ray token arrives from the head over SSH (never in user-data): an account that can only drop it",
        f"id -u {TOKEN_DROP_USER} >/dev/null 2>&1 || useradd --system --home-dir {drop} --shell /bin/sh "
        f"{TOKEN_DROP_USER}",
        f"mkdir -p {drop}/.ssh",
        f"echo {_q(forced + ' ' + key)} > {drop}/.ssh/authorized_keys",
        f"chown -R {TOKEN_DROP_USER}: {drop}",
        f"chmod 700 {drop} {drop}/.ssh",
        f"chmod 600 {drop}/.ssh/authorized_keys",
    ]


def _token_lines(config: BootstrapConfig) -> list[str]:
    """Token mode, right before ``ray start``: wait for the run's token (the head: from the CLI, over SSH; a worker:
    from the head, into its drop account), then keep it root-only in the state directory."""
    if config.ray_auth == "disabled":
        return []
    state, token = _q(config.state_dir), f"{_q(config.state_dir)}/{TOKEN_FILE}"
    if config.role == "head":
        return [
            "# the run's Ray token comes from the CLI over SSH (never in user-data or metadata)",
            f"[ -s {state}/push_key ] || ssh-keygen -q -t ed25519 -N '' -C rubberband-token-push -f {state}/push_key",
            f"export {TOKEN_PUSH_KEY_ENV}={state}/push_key",
            'say "waiting for the run\'s Ray token from the CLI"',
            f"waited=0; until [ -s {token} ]; do sleep 2; waited=$((waited + 2)); "
            f'[ "$waited" -lt {int(config.watchdog.submit_timeout_s)} ] || '
            f'fail "the CLI did not deliver the run\'s Ray token within {int(config.watchdog.submit_timeout_s)}s"; done',
            f"chmod 600 {token}",
        ]
    drop = f"{_q(config.token_drop_dir)}/{TOKEN_FILE}"
    return [
        'say "waiting for the run\'s Ray token from the head"',
        f"waited=0; until [ -s {drop} ] || [ -s {token} ]; do sleep 2; waited=$((waited + 2)); "
        f'[ "$waited" -lt {int(config.boot_timeout_s)} ] || '
        f'fail "the head did not deliver the run\'s Ray token within {int(config.boot_timeout_s)}s"; done',
        f"if [ -s {drop} ]; then install -m 600 {drop} {token}; rm -f {drop}; fi",
    ]


def _safety_net_lines(config: BootstrapConfig) -> list[str]:
    """The lifetime cap, then the node watchdog as a systemd service: the first things a boot does."""
    state = _q(config.state_dir)
    lines = [f"mkdir -p {state}", f"chmod 700 {state}", f"[ -s {state}/booted_at ] || date +%s > {state}/booted_at"]
    if config.max_lifetime_s:
        cap_s = config.max_lifetime_s + config.dialect.backstop_s
        minutes = max(1, int(cap_s // 60))
        lines += [
            "# hard lifetime cap first: powering off terminates this instance (AWS); GCP deletes it at its "
            "maxRunDuration, and this power-off only backs that up, later",
            f"{config.shutdown_command} +{minutes} || true",
            f"[ -s {state}/expires_at ] || echo $(( $(date +%s) + {int(cap_s)} )) > {state}/expires_at",
        ]
    unit = "\n".join(
        [
            "[Unit]",
            f"Description=rubberband safety nets of run {config.run_id} (lifetime cap, failed boot, lost head)",
            "After=network-online.target",
            "[Service]",
            "Type=simple",
            f"ExecStart=/bin/bash {config.state_dir}/watchdog.sh",
            "Restart=always",
            "RestartSec=10",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )
    lines += [
        "# the node's watchdog, as a service (it survives reboots and crashes), before anything that can fail",
        f"cat > {state}/watchdog.sh <<'RB_WATCHDOG'",
        render_node_watchdog(config).rstrip("\n"),
        "RB_WATCHDOG",
        f"chmod 700 {state}/watchdog.sh",
        f"mkdir -p {_q(config.systemd_dir)}",
        f"cat > {_q(config.systemd_dir)}/{WATCHDOG_UNIT} <<'RB_UNIT'",
        unit,
        "RB_UNIT",
        f"if command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload && systemctl enable --now {WATCHDOG_UNIT}; "
        "then",
        "  " + say_line(f"watchdog: systemd service {WATCHDOG_UNIT}"),
        "else",
        "  say 'watchdog: no systemd here; running it in the background'",
        f"  nohup /bin/bash {state}/watchdog.sh </dev/null >/dev/null 2>&1 &",
        "fi",
    ]
    return lines


def _ray_stop_lines(config: BootstrapConfig) -> list[str]:
    """Right before ``ray start``: a unit whose stop runs ``ray stop``, so a power-off (the watchdog's, the lifetime
    cap's, the cloud's) takes seconds. Ray runs in the user-data's unit (cloud-init's ``cloud-final.service`` and GCE's
    startup-script unit have ``KillMode=process``), so nothing stops it before systemd's final SIGTERM, which its
    gcs_server and raylet ignore until the 90 s timeout: 94 s from the watchdog's power-off to the node's end."""
    unit = "\n".join(
        [
            "[Unit]",
            f"Description=rubberband: stop the Ray of run {config.run_id} before the node powers off",
            "After=network-online.target",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            "ExecStart=/bin/true",
            f"ExecStop={config.venv}/bin/python -m ray.scripts.scripts stop",
        ]
    )
    return [
        f"cat > {_q(config.systemd_dir)}/{RAY_STOP_UNIT} <<'RB_UNIT'",
        unit,
        "RB_UNIT",
        f"if command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload && systemctl start {RAY_STOP_UNIT}; then",
        "  " + say_line(f"Ray stops before a power-off: systemd service {RAY_STOP_UNIT}"),
        "fi",
    ]


def _ray_start_function() -> list[str]:
    """``ray_start``: ``ray start``, tried up to :data:`RAY_START_TRIES` times, each try's processes stopped if it fails.

    ``ray start`` waits a fixed 30 s for its raylet to register with the GCS, and the raylet a fixed 15 s for its
    agents' ports (ray-project/ray#65983); a loaded first boot (the image's own start-up services, a shared core
    still busy with pip) can run past either. ``ray start`` then exits 1 and leaves what it started running (the
    GCS holding the port a second try needs). Each try runs in a session and process group of its own
    (``setsid``; a background job of a non-interactive bash is no group leader, so ``$!`` is the group's id): a
    failed try's processes are stopped by that id (SIGTERM, SIGKILL after :data:`RAY_START_STOP_GRACE_S`), and
    nothing else on the node is touched.
    """
    grace_ticks = RAY_START_STOP_GRACE_S * 10
    return [
        f"# `ray start`, up to {RAY_START_TRIES} tries: Ray's fixed start-up waits (30 s for the raylet) can run out "
        "on a loaded first boot",
        "ray_start() {",
        "  local try pgid tick",
        f"  for try in $(seq 1 {RAY_START_TRIES}); do",
        '    setsid --wait "$@" &',
        "    pgid=$!",
        '    if wait "$pgid"; then return 0; fi',
        f'    say "ray start failed (try $try of {RAY_START_TRIES}): stopping what it started (process group $pgid)"',
        '    kill -TERM -- "-$pgid" 2>/dev/null || true',
        f'    for tick in $(seq 1 {grace_ticks}); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 0.1; done',
        '    kill -KILL -- "-$pgid" 2>/dev/null || true',
        "  done",
        f'  fail "ray start failed {RAY_START_TRIES} times; see the lines above"',
        "}",
    ]


def _python_lines(config: BootstrapConfig) -> list[str]:
    """Pick the node's interpreter into ``$RB_PY`` (and its minor into ``$RB_PYV``), or fail saying why.

    A worker needs exactly ``python_version`` (its Ray joins a head of that minor): the image's first, else
    the OS package. A cloud head (``python_version=None``) takes the image's own Python — the Deep Learning
    images' first, where their CUDA torch lives — if Ray has wheels for it (:data:`IMAGE_PYTHON_RANGE`).
    """
    want = config.python_version
    (lo_major, lo_minor), (hi_major, hi_minor) = IMAGE_PYTHON_RANGE
    if want is None:
        candidates = " ".join(_q(p) for p in (*config.image_pythons, "python3"))
        test = f"sys.exit(not ({lo_major}, {lo_minor}) <= sys.version_info[:2] <= ({hi_major}, {hi_minor}))"
        lines = ["# the image's own Python (its CUDA torch lives there); the workers will match this head's minor"]
    else:
        major, minor = want.split(".")
        candidates = " ".join(_q(p) for p in (*config.image_pythons, f"python{want}", "python3"))
        test = f"sys.exit(sys.version_info[:2] != ({major}, {minor}))"
        lines = [
            f"# an interpreter with Python {want}, the minor of the Ray this node joins (Ray needs the same "
            f"minor on every node)"
        ]
    lines += [
        "RB_PY=''",
        f"for cand in {candidates}; do",
        '  path="$(command -v "$cand" 2>/dev/null || true)"',
        f'  if [ -n "$path" ] && "$path" -c \'import sys; {test}\' 2>/dev/null; then RB_PY="$path"; break; fi',
        "done",
    ]
    if want is None:
        lines += [
            f'[ -n "$RB_PY" ] || fail "this image has no Python {lo_major}.{lo_minor}-{hi_major}.{hi_minor} '
            f'(the ones Ray supports): choose another image"'
        ]
    else:
        lines += [
            'if [ -z "$RB_PY" ] && command -v apt-get >/dev/null 2>&1; then',
            "  " + say_line(f"no Python {want} on this image: installing it from the OS packages"),
            f"  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python{want} "
            f"python{want}-venv) || true",
            f'  RB_PY="$(command -v python{want} || true)"',
            "fi",
            f'[ -n "$RB_PY" ] || fail "this image has no Python {want}, the minor of the Ray this node joins (Ray '
            f"needs the same Python minor on every node): with --head local run rubberband from the image's Python "
            f"($(python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo '?')), or "
            f'choose an image with Python {want}"',
        ]
    lines += [
        'RB_PYV="$("$RB_PY" -c \'import sys; print("%d.%d" % sys.version_info[:2])\')"',
        'say "Python $RB_PYV: $RB_PY"',
    ]
    return lines


def render_startup_script(config: BootstrapConfig) -> str:
    """The bash script a node runs at first boot (EC2 user-data / GCE startup-script).

    It installs pinned third-party packages only — ``ray[default]`` of the client's version,
    rubberband's runtime pinned to the client's versions, torch where the image lacks it, the spec's
    ``requirements`` — into a venv of the image's Python (a head) or of the Python minor of the Ray
    the node joins (a worker), then starts Ray. rubberband and the training code arrive later with each
    Ray job (``runtime_env``: :mod:`rubberband.cloud.shipping`). Progress goes to a log file and to
    the serial console; a failure prints :data:`BOOT_FAILED` with the reason there.
    """
    validate_run_id(config.run_id)
    if config.role == "worker" and not config.head_address:
        raise InputError("a worker's startup script needs the head's address (head_address)")
    if config.python_version is not None and not re.fullmatch(r"3\.\d{1,2}", config.python_version):
        raise InputError(f"python_version {config.python_version!r} is not a Python 3 minor version like 3.11")
    want = config.python_version
    venv, py = _q(config.venv), f"{_q(config.venv)}/bin/python"
    run_dir = f'{_q(config.run_root)}/"${{RB_RUN_ID}}"'
    packages = [f"ray[default]=={config.ray_version}", *config.runtime_requirements, *config.requirements]
    lines = [
        "#!/bin/bash",
        f"# rubberband {config.role} node of run {config.run_id} (rendered by rubberband "
        f"{config.rubberband_version or 'cli'}; Python {want or 'of the image'}, Ray {config.ray_version}).",
        "# Rendered by rubberband.cloud.bootstrap; holds no credentials (cloud access comes from the",
        "# instance role / service account). rubberband itself arrives with each Ray job (runtime_env).",
        "set -euo pipefail",
        f"mkdir -p {_q(config.log_dir)}",
        f"exec > >(tee -a {_q(config.log_dir)}/rubberband-boot.log {_q(config.console)} >/dev/null) 2>&1",
        'say() { echo "rubberband-boot: $(date -u +%H:%M:%S) $*"; }',
        f'fail() {{ echo "{BOOT_FAILED} $*"; touch {_q(config.state_dir)}/failed 2>/dev/null || true; '
        f"{config.shutdown_command} +{max(1, int((config.failed_grace_s + config.dialect.backstop_s) // 60))} || true; "
        "exit 1; }",
        "trap 'fail \"line ${LINENO}: a command failed (exit $?); see the lines above\"' ERR",
        say_line(f"booting a {config.role} of run {config.run_id}"),
        *(host_key_lines(config.ssh_dir) if config.role == "head" else []),
        *_safety_net_lines(config),
        *(_token_drop_lines(config) if config.role == "worker" and config.ray_auth == "token" else []),
        f"RB_RUN_ID={_q(config.run_id)}",
        *config.dialect.instance_id_lines(config.metadata),
        "export RAY_USAGE_STATS_ENABLED=0",
        "# cluster traffic is confined to the run's security group / firewall rules (see docs/clouds.md)",
        *_ray_auth_lines(config),
        *_python_lines(config),
        f"if [ ! -x {py} ]; then",
        f'  say "creating the runtime in "{venv}" from $RB_PY"',
        f'  "$RB_PY" -m venv {venv} 2>/dev/null || {{ rm -rf {venv}; (apt-get update -qq && '
        f'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${{RB_PYV}}-venv") || true; '
        f'"$RB_PY" -m venv {venv}; }}',
        "  # the image's packages (its CUDA torch, drivers' bindings) stay importable beneath the runtime's own",
        '  "$RB_PY" -c \'import sys; print("\\n".join(p for p in sys.path if p.endswith(("site-packages", '
        '"dist-packages"))))\' \\',
        f'    > "$({py} -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')/rubberband-image.pth"',
        "fi",
        say_line(f"installing {' '.join(packages)}"),
        f"{py} -m pip install --quiet --disable-pip-version-check {shell_words(packages)}",
        *_torch_lines(config, py),
        f"RB_RAY=\"$({py} -c 'import ray; print(ray.__version__)')\"",
        f'[ "$RB_RAY" = {_q(config.ray_version)} ] || fail "Ray $RB_RAY is installed here but the CLI runs Ray "'
        f'{_q(config.ray_version)}"; every node must run the CLI\'s version"',
        f"export PATH={venv}/bin:\"$PATH\"  # the runtime's python and pip for Ray's jobs",
        f"mkdir -p {run_dir}",
        *_token_lines(config),
        *_ray_stop_lines(config),
        *_ray_start_function(),
    ]
    ray = f"ray_start {py} -m ray.scripts.scripts"
    more = "".join(f" {_q(option)}" for option in config.ray_start_options)
    if config.role == "head":
        wd = config.watchdog
        lines += [
            "# the run's executor and its watchdog arrive as Ray jobs from the CLI (python -m rubberband.cloud...)",
            f'export {RUN_ROOT_ENV}={_q(config.run_root)} {HEAD_ID_ENV}="${{INSTANCE_ID}}"',
            "# the head schedules no trial work; dashboard and job server listen on localhost (reach them over SSH)",
            f"{ray} start --head --port={config.ray_port} --num-cpus=0 --dashboard-host=127.0.0.1 "
            f"--dashboard-port={config.dashboard_port} --resources='{json.dumps({'rb-head': 1})}'{more}",
            f"# an unsubmitted run ({int(wd.submit_timeout_s)}s) and the run watchdog's {POWEROFF_MARKER} marker: "
            f"the node watchdog ({WATCHDOG_UNIT})",
        ]
    else:
        head = f"{config.head_address}:{config.ray_port}"
        cpus = config.workers if config.cpus is None else config.cpus
        device = f"--num-gpus={config.workers} --num-cpus={cpus}" if config.use_gpu else f"--num-cpus={cpus}"
        lines += [
            f"RB_HEAD={_q(head)}",
            f'{ray} start --address="${{RB_HEAD}}" {device} '
            f'--resources="{{\\"rb-node-${{INSTANCE_ID}}\\": {config.workers}}}"{more}',
            f"# a head unreachable for {int(config.head_lost_timeout_s)}s powers this worker off: the node watchdog "
            f"({WATCHDOG_UNIT})",
        ]
    lines += [f"touch {_q(config.state_dir)}/ready", "say 'ready: Ray is up'", "trap - ERR"]
    return assert_no_credentials("\n".join(lines) + "\n")
