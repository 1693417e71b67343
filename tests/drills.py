"""Fault drills (issue 17, item 5): kill the CLI, the head or the executor at each step of a cloud run, or inject API
errors into 5 % of calls, then run ``down --all-orphans`` and count what is left. Used by ``bench/bench_drills.py``
(the whole matrix, a printed table) and ``tests/test_cloud_drills.py`` (a subset).

**The run** is played by rubberband's own code, each role in a thread of its own, against the moto server or the GCE
fake: the CLI starts the head (``head_session.start_head``: the head's role, the run's group / firewall rules and,
on GCP, the Cloud NAT of its private workers, the head instance, ``head.json``); the executor on the head runs two stages (``backend.CloudBackend.provision`` with
failover, the run's heartbeat on the head, the stage's workers released at its end); the CLI ends the run
(``head_session.end_run``), or, when the CLI is gone, the head's watchdog does (``head.self_terminate``). Ray is not
started: a worker's join is taken as done (the played boots of tests/test_cloud_headmode.py cover that path).

**A kill** is a SIGKILL of one role at its k-th cloud API call within one phase: a hook on every API call (botocore's
``before-send`` for AWS, the HTTP adapter for GCP's REST client) freezes that role's thread right there — no
``finally`` and no ``except`` of it runs, as with SIGKILL — and the drill goes on with the consequences: a dead CLI
ends nothing (a CLI killed during teardown leaves it to the watchdog while the head runs); a dead executor leaves
its run to the attached CLI's ``end_run``; a dead head machine (executor and watchdog) leaves everything to the
sweep; a dead watchdog (CLI detached) too. At the end of the drill a frozen thread is released with every further
call of it failing before it is sent, so nothing of it ever reaches the cloud again.

**API errors**: with ``error_rate`` each call fails with the cloud's transient error with that probability — AWS on
the client side (``RequestLimitExceeded`` / ``InternalError`` / IAM ``Throttling``), GCP in the fake (``503
backendError``, half of them after the call took effect). A role that then fails does what its code does on an
exception (its ``finally`` blocks run) and the drill goes on as for a dead role.

**The count**: everything the cloud holds beyond what was there when the drill began — instances not terminated,
security groups / firewall rules, disks / volumes, IAM roles and instance profiles, secrets, Cloud Routers (GCP: the
workers' NAT) — before and after
``down --all-orphans --older-than 1h`` run two hours later (an injected clock; the sweep sees the same error
rate). What was there before must still be there after: the user's own look-alike resources (rubberband's name
shapes, no tag) and a live run whose heartbeat is fresh.
"""

from __future__ import annotations

import contextlib
import io
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOUR = 3600.0
REGIONS = {"aws": "us-east-1", "gcp": "us-central1"}
TYPES = {"aws": "g4dn.xlarge", "gcp": "n1-standard-8+V100x1"}
SERVICE_ACCOUNT = "head@rubberband-test.iam.gserviceaccount.com"
KEY_NAME = "rb-drill"
CATEGORIES = ("instances", "groups/rules", "disks", "identities", "secrets", "routers")
#: (role, phase) a kill can hit. "head" kills the executor at that call and the watchdog with it (the machine).
PHASES = (
    ("cli", "start"),
    ("executor", "stage-0"),
    ("executor", "stage-1"),
    ("head", "stage-0"),
    ("head", "stage-1"),
    ("cli", "teardown"),
    ("watchdog", "teardown"),
)


class Dead(BaseException):
    """Raised into a killed role's thread when it is released: every call it would still make fails unsent."""


@dataclass(frozen=True)
class Kill:
    role: str  # cli | executor | head | watchdog
    phase: str  # start | stage-N | teardown
    call: int  # the role's k-th API call (0-based) within the phase


@dataclass
class Outcome:
    cloud: str
    name: str
    roles: dict[str, str]  # role -> done | killed | failed: <error>
    before: Counter  # left by the run itself, per category
    after: Counter  # left after `down --all-orphans`
    survivors_ok: bool  # the look-alikes and the live run are intact
    sweep_errors: int = 0
    injected: int = 0


class Hooks:
    """The per-call hook shared by every role thread (installed once per process)."""

    def __init__(self) -> None:
        self.kill: Kill | None = None
        self.killed = threading.Event()
        self.error_rate = 0.0
        self.rng = random.Random(0)
        self.injected = 0
        self.calls: Counter = Counter()  # (role, phase) -> calls
        self._local = threading.local()
        self._frozen: list[threading.Event] = []
        self._lock = threading.Lock()

    # -- what a role thread says about itself --------------------------------------------------------------

    def enter(self, role: str, phase: str) -> None:
        self._local.role, self._local.phase, self._local.count = role, phase, 0

    def role(self) -> str | None:
        return getattr(self._local, "role", None)

    # -- the hook --------------------------------------------------------------------------------------------

    def on_call(self) -> bool:
        """Called before every API call; returns True when an error should be injected (AWS, client side)."""
        if getattr(self._local, "dead", False):
            raise Dead()
        role = self.role()
        if role is None:
            return False  # the auditor (census): never hooked
        phase = self._local.phase
        with self._lock:
            self.calls[(role, phase)] += 1
        kill = self.kill
        victim = (
            kill is not None
            and phase == kill.phase
            and (role == kill.role or (kill.role == "head" and role == "executor"))
        )
        if victim:
            if self._local.count == kill.call:
                self._freeze()
            self._local.count += 1
        return self.error_rate > 0 and self.rng.random() < self.error_rate

    def _freeze(self) -> None:
        release = threading.Event()
        with self._lock:
            self._frozen.append(release)
        self.killed.set()
        release.wait()
        self._local.dead = True
        raise Dead()

    def release_all(self) -> None:
        with self._lock:
            frozen, self._frozen = self._frozen, []
        for event in frozen:
            event.set()

    def reset(self, kill: Kill | None, error_rate: float, seed: int) -> None:
        self.release_all()
        self.kill, self.error_rate, self.rng, self.injected = kill, error_rate, random.Random(seed), 0
        self.killed.clear()
        self.calls = Counter()


HOOKS = Hooks()
_INSTALLED = False


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any):
        yield self._body


_AWS_ERRORS = [
    (503, "RequestLimitExceeded", "Request limit exceeded."),
    (500, "InternalError", "An internal error has occurred"),
    (503, "Unavailable", "The server is overloaded"),
]


def _aws_error(request: Any, service: str) -> Any:
    from botocore.awsrequest import AWSResponse

    HOOKS.injected += 1
    status, code, message = HOOKS.rng.choice(_AWS_ERRORS)
    if service == "ec2":
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code><Message>{message}'
            f"</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
        )
    else:  # IAM, STS, SSM (query protocol)
        status, code = 400, "Throttling"
        body = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>Rate exceeded</Message>"
            f"</Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
        )
    return AWSResponse(request.url, status, {}, _Raw(body.encode()))


def install_hooks() -> None:
    """Hook every AWS (botocore) and GCP (requests) call of this process, once."""
    global _INSTALLED
    if _INSTALLED:
        return
    import botocore.handlers
    import requests.adapters

    def before_send(request: Any, event_name: str = "", **_: Any) -> Any:
        if HOOKS.on_call():
            return _aws_error(request, event_name.split(".")[1] if event_name.count(".") >= 1 else "")
        return None

    botocore.handlers.BUILTIN_HANDLERS.append(("before-send", before_send))
    original_send = requests.adapters.HTTPAdapter.send

    def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        HOOKS.on_call()  # GCP errors are injected by the fake itself
        return original_send(self, request, *args, **kwargs)

    requests.adapters.HTTPAdapter.send = send  # type: ignore[method-assign]
    _INSTALLED = True


def fast_providers(patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """Providers built by name (``make_provider``) poll every 50 ms and back off from 50 ms (not 5 s / 1 s): the
    drills' servers answer at once; the logic is the same. ``patch``: ``setattr``, or a test's
    ``monkeypatch.setattr`` (undone after the test)."""
    import rubberband.cloud.registry as registry
    from rubberband.cloud.failover import RetryPolicy

    if getattr(registry.make_provider, "drill", False):
        return
    original = registry.make_provider

    def make_provider(cloud: str, region: str, **options: Any):  # type: ignore[no-untyped-def]
        options.setdefault("poll_s", 0.05)
        options.setdefault("retry", RetryPolicy(base_s=0.05, cap_s=0.5))
        return original(cloud, region, **options)

    make_provider.drill = True  # type: ignore[attr-defined]
    patch(registry, "make_provider", make_provider)


# -- the worlds: a moto server or the GCE fake, their census and baseline ------------------------------------------


@dataclass
class World:
    cloud: str
    tmp: Path
    fake: Any = None  # GceFake (gcp)
    moto_url: str = ""  # (aws)
    baseline: dict[str, set[str]] = field(default_factory=dict)
    keep: dict[str, set[str]] = field(default_factory=dict)  # what the sweep must spare
    live_run: str = "live-run"
    _live: Any = None

    @property
    def region(self) -> str:
        return REGIONS[self.cloud]

    # -- inventory (never hooked: called from the main thread) --------------------------------------------------

    def inventory(self) -> dict[str, set[str]]:
        if self.cloud == "gcp":
            fake = self.fake
            with fake._lock:
                return {
                    "instances": {n for (_, n), i in fake.instances.items() if i["status"] != "TERMINATED"}
                    | {f"stopped:{n}" for (_, n), i in fake.instances.items() if i["status"] == "TERMINATED"},
                    "groups/rules": set(fake.firewalls),
                    "disks": {n for _, n in fake.disks},
                    # the head role's bindings, run by run (GceFake.run_bindings, under the lock held here)
                    "identities": {
                        b["condition"]["title"] for b in fake.iam_bindings if (b.get("condition") or {}).get("title")
                    },
                    "secrets": set(),
                    # the workers' egress: the run's Cloud Routers (their NATs) and its subnetworks
                    "routers": {f"{r}/{n}" for r, n in fake.routers}
                    | {f"subnetwork:{r}/{n}" for r, n in fake.subnetworks},
                }
        import boto3

        ec2 = boto3.client("ec2", region_name=self.region)
        iam = boto3.client("iam")
        instances = {
            i["InstanceId"]
            for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated"
        }
        groups = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"] != "default"}
        volumes = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
        identities = {f"role/{r['RoleName']}" for r in iam.list_roles()["Roles"]} | {
            f"profile/{p['InstanceProfileName']}" for p in iam.list_instance_profiles()["InstanceProfiles"]
        }
        secrets = {
            s["Name"] for s in boto3.client("secretsmanager", region_name=self.region).list_secrets()["SecretList"]
        }
        return {
            "instances": instances,
            "groups/rules": groups,
            "disks": volumes,
            "identities": identities,
            "secrets": secrets,
            "routers": set(),
        }

    def left(self) -> Counter:
        now = self.inventory()
        return Counter({c: len(now[c] - self.baseline.get(c, set())) for c in CATEGORIES})

    def survivors_ok(self) -> bool:
        """The user's look-alikes and the live run are all still there."""
        now = self.inventory()
        return all(self.keep[c] <= now[c] for c in CATEGORIES)

    # -- the user's look-alikes and a live run (once), the drill's baseline (each drill) ------------------------

    def setup(self) -> None:
        """Once per world: the user's own resources with rubberband's name shapes and no tag, and a live run."""
        from rubberband.cloud.provider import TAG_ROLE, InstanceRequest
        from rubberband.cloud.registry import make_provider

        before = self.inventory()
        if self.cloud == "gcp":
            from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS

            fake = self.fake
            fake.add_service_account(SERVICE_ACCOUNT, list(GCP_HEAD_PERMISSIONS))  # the CLI binds its role per run
            fake.firewalls["rubberband-mine-internal"] = {
                "name": "rubberband-mine-internal",
                "description": "the user's own",
                "network": "global/networks/default",
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
            }
            fake.add_disk("us-central1-a", "rb-mine-0-aaaaaa")
            # a router named as rubberband names a run's NAT (no marker, no NAT: the runs' own NATs still fit beside
            # it), and the user's NAT of another region
            fake.add_router("us-central1", "rubberband-mine-nat", description="the user's own")
            fake.add_router(
                "us-east1",
                "rubberband-mine-east-nat",
                description="the user's own",
                nats=[
                    {
                        "name": "nat",
                        "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
                        "natIpAllocateOption": "AUTO_ONLY",
                    }
                ],
            )
        else:
            import boto3

            ec2 = boto3.client("ec2", region_name=self.region)
            ec2.create_key_pair(KeyName=KEY_NAME)
            vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
            ec2.create_security_group(GroupName="rubberband-mine", Description="the user's own", VpcId=vpc)
            ec2.run_instances(
                ImageId="ami-12c6146b",
                MinCount=1,
                MaxCount=1,
                InstanceType="t3.micro",
                TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "rb-mine-0"}]}],
            )
            ec2.create_volume(AvailabilityZone="us-east-1a", Size=1)
            boto3.client("iam").create_role(RoleName="rb-mine", AssumeRolePolicyDocument="{}", Path="/rubberband/")
            boto3.client("secretsmanager", region_name=self.region).create_secret(
                Name="rubberband-mine", SecretString="x"
            )
        provider = make_provider(self.cloud, self.region)
        itype = _catalog().find(TYPES[self.cloud], cloud=self.cloud, region=self.region)
        (live,) = provider.provision(InstanceRequest(self.live_run, 0, itype, extra_tags={TAG_ROLE: "head"}))
        self._live = (provider, live.id)
        now = self.inventory()
        self.keep = {c: now[c] - before[c] for c in CATEGORIES}

    def reset(self) -> None:
        """Before a drill: the live run beats (by the sweep's clock, two hours on) and what is there is noted."""
        from rubberband.cloud.heartbeat import beat_labels

        provider, ident = self._live
        provider.set_labels(ident, beat_labels(time.time() + 2 * HOUR - 60))
        self.baseline = self.inventory()

    def poweroff(self, instance_id: str) -> None:
        """What an instance's own shutdown does (the watchdog's fallback): EC2 terminates it
        (``InstanceInitiatedShutdownBehavior=terminate``); a Compute Engine VM only stops."""
        if self.cloud == "gcp":
            with self.fake._lock:
                for (_, name), inst in self.fake.instances.items():
                    if name == instance_id:
                        inst["status"] = "TERMINATED"
            return
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        ec2_backends[DEFAULT_ACCOUNT_ID][self.region].terminate_instances([instance_id])


_CATALOG: Any = None


def _catalog() -> Any:
    global _CATALOG
    if _CATALOG is None:
        from cloud_helpers import cloud_catalog

        _CATALOG = cloud_catalog()
    return _CATALOG


# -- the run, role by role ----------------------------------------------------------------------------------------


def _in_thread(role: str, fn: Callable[[], Any], timeout_s: float = 300.0) -> tuple[str, Any]:
    """Run a role; return (done | killed | failed: ..., its result)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
            box["status"] = "done"
        except Dead:
            box["status"] = "killed"
        except BaseException as exc:  # noqa: BLE001 - a role that fails is part of the drill
            box["status"] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"

    thread = threading.Thread(target=body, name=f"drill-{role}", daemon=True)
    HOOKS.killed.clear()
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and not HOOKS.killed.is_set() and time.monotonic() < deadline:
        thread.join(0.01)
    if thread.is_alive():
        return ("killed" if HOOKS.killed.is_set() else "failed: timeout"), None
    return box.get("status", "failed: ?"), box.get("result")


def run_drill(
    world: World, *, kill: Kill | None = None, error_rate: float = 0.0, seed: int = 0, name: str = ""
) -> Outcome:
    """One run with one fault, then the sweep; see the module docstring."""
    from rubberband.cloud.backend import CloudBackend
    from rubberband.cloud.bootstrap import WatchdogSettings, cloud_run_id
    from rubberband.cloud.head import self_terminate
    from rubberband.cloud.head_session import HeadOptions, NewRun, end_run, start_head
    from rubberband.cloud.heartbeat import beat_instances
    from rubberband.cloud.provider import InstanceRequest
    from rubberband.cloud.registry import ProviderPool, make_provider
    from rubberband.commands.down import down_orphans
    from cloud_helpers import make_plan

    world.reset()
    HOOKS.reset(kill, error_rate, seed)
    if world.fake is not None:
        world.fake.error_rate, world.fake.rng, world.fake.injected = error_rate, random.Random(seed + 1), 0
    cloud, region = world.cloud, world.region
    run_id = f"drill-{uuid.uuid4().hex[:8]}"
    crid = cloud_run_id(run_id)
    plan = make_plan(cloud, region, TYPES[cloud])
    catalog = _catalog()
    key = world.tmp / "key.pem"
    key.write_text("not a key\n")
    options = HeadOptions(
        ssh_cidr="203.0.113.7/32",
        ssh_key=key,
        key_name=KEY_NAME if cloud == "aws" else None,
        watchdog=WatchdogSettings(),
        boot_timeout_s=60.0,
        service_account=SERVICE_ACCOUNT if cloud == "gcp" else None,
    )
    roles: dict[str, str] = {}
    state: dict[str, Any] = {}

    def cli_start() -> Any:
        HOOKS.enter("cli", "start")
        return start_head(
            run=NewRun(run_id, world.tmp / run_id, metric="loss"),
            plan=plan,
            catalog=catalog,
            options=options,
            boots=None,
        )

    def executor() -> None:
        record = state["record"]
        pool = ProviderPool(factory=make_provider)
        (head,) = [i for i in pool(cloud, region).list(crid) if i.id == record.instance_id]
        backend = CloudBackend(pool=pool, head=head, join_check=lambda inst, timeout: None, boot_timeout_s=60.0)
        beat = beat_instances(lambda: [(pool(cloud, region), [head.id])])
        for index, stage in enumerate(plan.stages):
            HOOKS.enter("executor", f"stage-{index}")
            beat(time.time())
            itype = catalog.find(stage.instance_type, cloud=cloud, region=region)
            made = backend.provision(InstanceRequest(crid, stage.stage, itype, count=stage.instances))
            backend.terminate([i.id for i in made])  # the stage is over: its workers are released
        HOOKS.enter("executor", "done")

    def cli_end() -> int:
        HOOKS.enter("cli", "teardown")
        return end_run(state["record"], boots=None)

    def watchdog() -> None:
        HOOKS.enter("watchdog", "teardown")
        record = state["record"]
        self_terminate(
            make_provider(cloud, region), crid, record.instance_id, shutdown=lambda: world.poweroff(record.instance_id)
        )

    def head_alive() -> bool:
        record = state.get("record")
        return record is not None and any(
            i.id == record.instance_id and i.alive for i in make_provider(cloud, region).list(crid)
        )

    roles["cli"], state["record"] = _in_thread("cli", cli_start)
    if roles["cli"] == "done":
        roles["executor"], _ = _in_thread("executor", executor)
        head_dead = kill is not None and kill.role == "head" and roles["executor"] == "killed"
        if head_dead:
            roles["watchdog"] = "killed (with the head)"
        elif kill is not None and kill.role == "watchdog":  # the CLI detached: the watchdog ends the run alone
            roles["watchdog"], _ = _in_thread("watchdog", watchdog)
        else:
            roles["cli end"], _ = _in_thread("cli end", cli_end)
            if roles["cli end"] != "done" and head_alive():  # the CLI is gone: the head's watchdog ends it
                roles["watchdog"], _ = _in_thread("watchdog", watchdog)
    before = world.left()
    HOOKS.kill = None  # the sweep is never killed; it sees the same error rate
    sweep_errors = 0
    for _attempt in range(3):  # a sweep that fails on an API error is run again, as its user would
        with contextlib.redirect_stdout(io.StringIO()):  # its one line per resource
            status, _ = _in_thread(
                "down",
                lambda: (HOOKS.enter("down", "sweep"), down_orphans(cloud, [region], HOUR, now=time.time() + 2 * HOUR)),
            )
        if status == "done":
            break
        sweep_errors += 1
    HOOKS.release_all()
    injected = HOOKS.injected + (world.fake.injected if world.fake is not None else 0)
    if world.fake is not None:
        world.fake.error_rate = 0.0
    after = world.left()
    return Outcome(
        cloud,
        name or (f"{kill.role} killed at call {kill.call} of {kill.phase}" if kill else "no kill"),
        roles,
        before,
        after,
        world.survivors_ok(),
        sweep_errors,
        injected,
    )


def census(world: World) -> Counter:
    """API calls per (role, phase) of undisturbed runs (where the kills can land): one with the CLI attached to the
    end, one whose CLI detached so that the watchdog ends it (a kill that never comes)."""
    run_drill(world)
    calls = Counter(HOOKS.calls)
    run_drill(world, kill=Kill("watchdog", "teardown", 10**6))
    calls[("watchdog", "teardown")] = HOOKS.calls[("watchdog", "teardown")]
    return calls


def kill_points(calls: Counter, per_phase: int) -> list[Kill]:
    """Up to ``per_phase`` kills per (role, phase), spread over its calls (first, ..., last)."""
    kills = []
    for role, phase in PHASES:
        counted = "executor" if role == "head" else role
        n = calls.get((counted, phase), 0)
        if n == 0:
            continue
        picks = sorted({round(i * (n - 1) / max(1, per_phase - 1)) for i in range(per_phase)}) if per_phase > 1 else [0]
        kills += [Kill(role, phase, k) for k in picks]
    return kills


def make_world(
    cloud: str, tmp: Path, *, moto_url: str = "", fake: Any = None, patch: Callable[[Any, str, Any], None] = setattr
) -> World:
    """A world ready for drills: hooks installed, fast providers, the look-alikes and the live run made."""
    install_hooks()
    fast_providers(patch)
    if fake is not None:
        fake.page_size, fake.op_delay_s = 500, 0.0
    world = World(cloud=cloud, tmp=tmp, fake=fake, moto_url=moto_url)
    world.setup()
    return world
