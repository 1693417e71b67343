"""The executor's cloud backend when the machine running ``rubberband run --cloud aws|gcp`` is inside
the cloud network: its own Ray head is the run's head, workers are cloud instances.

This is the mode for a CLI machine that the run's instances can reach (a VM in the same VPC /
network, or a bastion): no separate head instance is provisioned (docs/clouds.md, "Where the
Ray head runs", describes the head-instance mode, whose shipping step is not built yet). The
head is a local Ray head (:class:`~rubberband.cloud.local.provider.LocalProvider`, records under
``RUN_DIR/instances``) listening on Ray's port 6379; every worker is provisioned through
:class:`~rubberband.cloud.backend.CloudBackend` (failover, worker startup script joining this
head, ``rb-node-<instance id>`` resource) and found / terminated by the run's tags.

Ray auth: as on a head instance, Ray runs with the run's own token (``RAY_AUTH_MODE=token``). This machine
makes the token (``RUN_DIR/ray-token``, 0600) and a push key (``RUN_DIR/token-push-key``) when the head starts;
each worker's user-data carries the public half, and the token reaches the worker over SSH inside the run's
network (:class:`~rubberband.cloud.ray_token.SshTokenPush`), never in user-data. This head, its nodes and the
driver present the run's token (``ray_auth_token_path``); both files go when the head stops.

With a :class:`~rubberband.cloud.boots.BootPlayer` passed in (the test suite's; ``boots``) each instance's boot is
played by a local Ray node started under the instance's id, and the head takes a free port on 127.0.0.1.
"""

from __future__ import annotations

import builtins
import socket
from dataclasses import dataclass, field
from pathlib import Path

from rubberband.catalog import Catalog, load_catalog
from rubberband.cloud.boots import BootPlayer
from rubberband.cloud.backend import BackendSeams, CloudBackend, HeadHandle, TokenPush, ray_join_check
from rubberband.cloud.bootstrap import RAY_PORT, cloud_run_id
from rubberband.cloud.failover import alternatives_for
from rubberband.cloud.heartbeat import INTERVAL_S, Heartbeat, beat_instances
from rubberband.cloud.local.provider import LocalProvider
from rubberband.cloud.provider import TAG_MANAGED, TAG_ROLE, TAG_RUN_ID, Instance, InstanceRequest
from rubberband.cloud.ray_token import (
    PUSH_KEY_FILE,
    RUN_TOKEN_FILE,
    FileTokenPush,
    SshTokenPush,
    forget_push_key,
    forget_run_token,
    make_push_key,
    new_token,
    read_run_token,
    write_run_token,
)
from rubberband.cloud.registry import ProviderPool
from rubberband.cloud.teardown import terminate_run_detailed
from rubberband.devices import DevicePolicy


def private_address() -> str:
    """This machine's address as other machines of the network see it (the interface of the default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: UDP connect only picks a route
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@dataclass
class LocalHeadCloudBackend:
    """Backend for ``cloud: aws|gcp`` with the Ray head on this machine (see the module docstring)."""

    cloud: str
    run_dir: Path
    regions: list[str]
    pool: ProviderPool = field(default_factory=ProviderPool)
    catalog: Catalog | None = None
    #: who plays the instances' boots on this machine (tests); None: the cloud boots them
    boots: BootPlayer | None = None
    ray_auth_mode: str = "token"
    requirements: tuple[str, ...] = ()  # the spec's `requirements`, installed by each worker's boot
    heartbeat_s: float = INTERVAL_S  # how often the run's heartbeat is written on the cloud (cloud/heartbeat.py)
    _heartbeat: Heartbeat | None = field(default=None, init=False, repr=False)
    expires_at: float | None = None  # POSIX time by which every worker must be gone (bootstrap.lifetime_cap_s)
    token_push: TokenPush | None = None  # how workers get the run's Ray token; None: no token
    #: the metadata server's base URL the executor's notice watchers read (executor/notices.py); None: the cloud's
    #: own. Passed in by the caller (tests: a local endpoint serving notices), never read from the environment
    metadata_url: str | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        #: the run's own token file when this machine's head makes it (None: the caller brought a push, as the
        #: head instance does, or Ray runs without auth)
        self.run_token: Path | None = None
        if self.ray_auth_mode == "token" and self.token_push is None:
            self.run_token = self.run_dir / RUN_TOKEN_FILE
            self.token_push = (
                FileTokenPush()  # played workers are local nodes that read the token file themselves
                if self.boots is not None
                else SshTokenPush(key_file=self.run_dir / PUSH_KEY_FILE, token_file=self.run_token)
            )
        self.local = LocalProvider(self.run_dir, auth_mode=self.ray_auth_mode, token_path=self.run_token)
        self.catalog = self.catalog or load_catalog([self.cloud])
        placeholder = Instance(
            id=f"local-head-{socket.gethostname()}",
            cloud=self.cloud,
            instance_type="local-head",
            zone="",
            state="running",
            run_id="",
            address=None,
            tags={TAG_MANAGED: "true", TAG_ROLE: "head"},
        )
        join = self._boot_locally if self.boots is not None else ray_join_check
        self.workers = CloudBackend(
            pool=self.pool,
            head=placeholder,
            join_check=join,
            alternatives=self._alternatives,
            boot_timeout_s=600.0,
            join_timeout_s=600.0,
            requirements=tuple(self.requirements),
            expires_at=self.expires_at,
            token_push=self.token_push,
        )

    @property
    def types(self) -> Catalog:
        """The run's catalog (``catalog``, loaded for the cloud when not given)."""
        if self.catalog is None:
            self.catalog = load_catalog([self.cloud])
        return self.catalog

    @property
    def device_policy(self) -> DevicePolicy:
        """Trials on GPU types use their GPUs (nccl). A played boot's stand-in node advertises the type's
        GPUs as logical ones on this machine, so its trials check Ray's GPU assignment, then train on CPU."""
        return DevicePolicy(cpu_stand_in=self.boots is not None)

    # -- head --------------------------------------------------------------------------------

    @property
    def ray_auth_token_path(self) -> str | None:
        return None if self.run_token is None else str(self.run_token)

    def start_head(self, run_id: str) -> HeadHandle:
        """Start this machine's Ray head for the run (Ray's port 6379 unless test boots play the workers), with
        the run's token and push key (kept on a resume: its workers hold that token)."""
        if self.run_token is not None:
            if read_run_token(self.run_dir) is None:
                write_run_token(self.run_dir, new_token())
            if isinstance(self.token_push, SshTokenPush):
                make_push_key(self.token_push.key_file)
        port = None if self.boots is not None else RAY_PORT
        record = self.local.start_head_process(run_id, port=port)
        host = "127.0.0.1" if self.boots is not None else private_address()
        self.workers.head = Instance(
            id=self.workers.head.id,
            cloud=self.cloud,
            instance_type="local-head",
            zone="",
            state="running",
            run_id=cloud_run_id(run_id),
            address=host,
            launched_at=record.requested_at,
            tags={TAG_MANAGED: "true", TAG_ROLE: "head", TAG_RUN_ID: cloud_run_id(run_id)},
        )
        self.start_heartbeat()
        return HeadHandle(address=record.address or f"{host}:{port}", id=self.workers.head.id, pid=record.pid)

    def stop_head(self) -> bool:
        """Stop the local head; then make sure nothing of the run is left on the cloud (instances, groups)."""
        self.stop_heartbeat()
        stopped = self.local.stop_head()
        run_id = self.workers.head.run_id
        if run_id:
            for region in self.regions:
                terminate_run_detailed(self.pool(self.cloud, region), run_id)
            self._stop_stand_ins()
        if self.run_token is not None:  # the cluster is gone: its token and push key open nothing any more
            forget_run_token(self.run_dir)
            if isinstance(self.token_push, SshTokenPush):
                forget_push_key(self.token_push.key_file)
        return stopped

    def runtime_env(self, code_dir: str) -> dict | None:
        """What the driver's job ships to the workers (cloud instances): this machine's rubberband package
        and the training code directory (docs/clouds.md, "How code reaches the cluster")."""
        from rubberband.cloud.shipping import CodeFilter, build_package, job_runtime_env

        env = job_runtime_env(build_package(), Path(code_dir))
        env["excludes"] = CodeFilter(Path(code_dir)).ray_excludes()
        return env

    # -- heartbeat (what `down --all-orphans` reads: cloud/heartbeat.py) ---------------------------

    def heartbeat_targets(self) -> list[tuple[object, list[str]]]:
        """Where the run's heartbeat goes: this machine has no instance, so on the run's live workers."""
        run_id = self.workers.head.run_id
        targets: list[tuple[object, list[str]]] = []
        for region in self.regions:
            provider = self.pool(self.cloud, region)
            ids = [i.id for i in provider.list(run_id) if i.alive and i.role != "head"]
            if ids:
                targets.append((provider, ids))
        return targets

    def start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(beat_instances(self.heartbeat_targets), interval_s=self.heartbeat_s).start()

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    # -- Provider ----------------------------------------------------------------------------

    def provision(self, request: InstanceRequest) -> list[Instance]:
        request = InstanceRequest(
            run_id=cloud_run_id(request.run_id),
            stage=request.stage,
            instance_type=request.instance_type,
            count=request.count,
            spot=request.spot,
            zone=request.zone,
            startup_script=request.startup_script,
            extra_tags=dict(request.extra_tags),
            max_lifetime_s=request.max_lifetime_s,
        )
        return self.workers.provision(request)

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        return self.workers.wait(instance_ids, timeout_s)

    def list(self, run_id: str | None = None) -> list[Instance]:
        self._build_providers()
        return self.workers.list(cloud_run_id(run_id) if run_id is not None else None)

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        self._build_providers()
        try:
            self.workers.terminate(instance_ids)
        finally:
            if self.boots is not None:  # the played boots' stand-in nodes end with their instances
                self.local.terminate(instance_ids)

    # -- failover and losses (the executor's fleet) ------------------------------------------------

    def obtained(self, instance_id: str):
        return self.workers.obtained(instance_id)

    def unavailable(self, itype, spot: bool = False) -> bool:
        return self.workers.unavailable(itype, spot=spot)

    def check_lost(self, instance_ids: builtins.list[str]) -> dict[str, str]:
        """Instances the cloud no longer runs (with the cloud's reason) and, in test boots, dead stand-in nodes."""
        self._build_providers()
        lost = dict(self.workers.check_lost(instance_ids))
        if self.boots is not None:
            for ident, reason in self.local.check_lost([i for i in instance_ids if i not in lost]).items():
                lost[ident] = reason
        return lost

    # -- helpers -----------------------------------------------------------------------------

    def _alternatives(self, itype):
        """Failover's stand-ins for ``itype``: same workers and device, in the run's regions, cheapest first."""
        return [t for t in alternatives_for(itype, self.types, clouds=[self.cloud]) if t.region in self.regions]

    def _build_providers(self) -> None:
        """Every region of the plan has its provider, so list / terminate see instances of an earlier executor."""
        for region in self.regions:
            self.pool(self.cloud, region)

    def _boot_locally(self, instance: Instance, timeout_s: float) -> None:
        """A played boot: the instance's user-data, played by the boot player with a node of ``local``."""
        assert self.boots is not None
        self.boots.join(instance, self.types.find(instance.instance_type, cloud=self.cloud), self.local, timeout_s)

    def _stop_stand_ins(self) -> None:
        if self.boots is not None:
            self.local.terminate([r.id for r in self.local.records() if r.role == "node"])


def make_cloud_backend(
    cloud: str,
    run_dir: str | Path,
    regions: list[str],
    *,
    lifetime_cap_s: float | None = None,
    seams: BackendSeams = BackendSeams(),
) -> LocalHeadCloudBackend:
    """The executor's backend for ``cloud`` in ``regions`` (the plan's); workers live at most ``lifetime_cap_s``
    from now (``bootstrap.lifetime_cap_s`` of the run). ``seams``: the test boot mode and the metadata server the
    caller passes in (tests only); by default real boots and the cloud's own metadata server."""
    import time

    return LocalHeadCloudBackend(
        cloud=cloud,
        run_dir=Path(run_dir),
        regions=list(dict.fromkeys(regions)),
        boots=seams.boots,
        metadata_url=seams.metadata_url,
        expires_at=None if lifetime_cap_s is None else time.time() + lifetime_cap_s,
    )
