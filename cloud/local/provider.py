"""The local backend: every "instance" is one Ray node on this machine.

A run gets its own Ray head (``num_cpus=0``, loopback, temp dir under the run directory whose
logs stay in ``RUN_DIR/ray-logs`` once the run's nodes and head are stopped, token auth left on)
and one ``ray start --block`` process per instance, started with ``setsid`` so that the node's
processes form one process group: terminating an instance kills that group (SIGTERM, then SIGKILL)
and nothing else on the machine. Each node carries the custom resource ``rb-node-<id>`` (amount =
the type's workers) so trials can be pinned to it (see docs/training-api.md, "The runtime
underneath").

Every process is recorded in ``RUN_DIR/instances/<id>.json`` with the run id, pid and pgid,
so :meth:`LocalProvider.list` also finds nodes of an executor that died (orphans) and
``rubberband down`` can stop them. Nodes are started one after another: two ``ray start``
processes started at once race for ports and both die.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rubberband import __version__
from rubberband.catalog import InstanceType
from rubberband.cloud.backend import HeadHandle
from rubberband.cloud.provider import TAG_RUN_ID, Instance, InstanceRequest, node_resource
from rubberband.errors import CloudError
from rubberband.devices import node_resources
from rubberband.paths import short_tmp_root
from rubberband.net import free_port
from rubberband.files import write_text_atomic

HEAD_ID = "head"
#: Ray's unix socket paths must stay below 108 bytes; longer temp dirs are symlinked from /tmp.
_MAX_TEMP_DIR_LEN = 40
_STARTED_MARK = "Ray runtime started."
#: Head settings: notice a dead node within ~2 s instead of ~12 s (BRIEF.md).
HEAD_ENV = {
    "RAY_AUTH_MODE": "token",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "2",
    "RAY_health_check_timeout_ms": "1000",
}
NODE_ENV = {"RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "1"}
OBJECT_STORE_BYTES = 96 * 1024**2


@dataclass
class ProcessRecord:
    """What ``RUN_DIR/instances/<id>.json`` holds about one local node (or the head)."""

    id: str
    run_id: str
    role: str  # head | node
    instance_type: str
    workers: int
    pid: int
    pgid: int
    temp_dir: str
    log: str
    stage: int = 0
    address: str | None = None
    requested_at: float = 0.0
    ready_at: float | None = None
    terminated_at: float | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def write(self, directory: Path) -> None:
        write_text_atomic(directory / f"{self.id}.json", json.dumps(asdict(self), indent=1), make_parents=True)

    @classmethod
    def read(cls, path: Path) -> "ProcessRecord":
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class _HeadStart:
    """One try of the head's start in progress: its process, its record, where its part of the log begins."""

    proc: subprocess.Popen
    record: ProcessRecord
    offset: int


#: Starts of a local head whose ports another process took first (see :func:`port_clash`).
PORT_TRIES = 3


def port_clash(output: str) -> bool:
    """Whether a Ray node's start failed on a port some other process bound first (Ray's own words)."""
    return any(
        words in output
        for words in (
            "same port is not used by multiple components",
            "Address already in use",
            "Failed to start the grpc server",
        )
    )


def _log_size(log: Path) -> int:
    """How much of an instance's log is there before a start appends to it: where that start's output begins."""
    try:
        return log.stat().st_size
    except OSError:
        return 0


def _log_since(log: Path, offset: int) -> str:
    """What one start wrote to an instance's log, from ``offset`` (:func:`_log_size` before it) on.

    A head's log is appended to by every start of the run's head: its port-clash retries and, after a resume,
    the earlier executor's head. Their "started" lines must not count for this start."""
    try:
        with open(log, "rb") as out:
            out.seek(offset)
            return out.read().decode(errors="replace")
    except OSError:
        return ""


def _gcs_port_clash(temp_dir: Path, ray_start_pid: int) -> str | None:
    """Ray's words, when the GCS that the ``ray start --head`` of ``ray_start_pid`` launched (its session directory
    ends in that pid) exited on a port clash; Ray's ``ray start`` only reports it after waiting 40 s for the GCS."""
    for logs in temp_dir.glob(f"session_*_{ray_start_pid}/logs"):
        for name in ("gcs_server.out", "gcs_server.err"):
            try:
                lines = (logs / name).read_text(errors="replace").splitlines()
            except OSError:
                continue
            clash = [line for line in lines if port_clash(line)]
            if clash:
                return clash[-1]
    return None


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def _reap(pid: int) -> None:
    """Collect the exit status of a ``ray start`` we started ourselves (no zombie left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return bool(_group_members(pgid))


def _is_ours(record: ProcessRecord) -> bool:
    """The recorded process group is alive and its leader is still our ``ray start`` (not a reused pid)."""
    if not _group_alive(record.pgid):
        return False
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        # the leader exited but members of its group live on: still ours (same pgid, never reused while alive)
        return True
    return "ray" in cmdline and "start" in cmdline


def kill_group(pgid: int, grace_s: float = 3.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s`` (and wait, bounded, for it to go).

    ``leader``: the group leader's handle, where this process started it: its exit is waited for through the
    handle, which reaps it, before the rest of the group is looked for."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        if leader is not None:
            try:
                leader.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        while _group_alive(pgid):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return


def ensure_auth_token() -> Path:
    """Ray's token auth needs ``~/.ray/auth_token``; create it (never overwrite) when missing.

    All local runs of a user share it, as every ``ray.init()`` on this machine does.
    """
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".auth_token.{os.getpid()}")
    tmp.write_text(secrets.token_hex(32))
    os.chmod(tmp, 0o600)
    try:
        os.link(tmp, path)  # atomic, fails if another process created it first
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path


def short_temp_dir(run_dir: Path) -> Path:
    """``RUN_DIR/ray`` when its path is short enough for Ray's sockets, else a symlink to a /tmp dir."""
    wanted = run_dir / "ray"
    if wanted.is_symlink():
        target = Path(os.readlink(wanted))
        target.mkdir(parents=True, exist_ok=True)
        return target
    if len(str(wanted.resolve())) <= _MAX_TEMP_DIR_LEN:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    target = Path(tempfile.mkdtemp(prefix="rb-", dir=short_tmp_root()))
    wanted.parent.mkdir(parents=True, exist_ok=True)
    wanted.symlink_to(target, target_is_directory=True)
    return target


#: Where a run directory keeps its Ray logs once the run's cluster is gone: ``RUN_DIR/ray-logs/<session>/``.
RAY_LOGS_DIR = "ray-logs"
#: What Ray writes at the top of its temp dir (name prefixes): the sessions and their ``session_latest`` link, the
#: address file, and the dashboard's copy of its Prometheus service-discovery file (and the temp file it writes first).
RAY_TEMP_ENTRIES = ("session_", "ray_current_cluster", "prom_metrics_service_discovery", "tmp_prom_metrics_")


def settle_ray_logs(run_dir: Path) -> Path | None:
    """Keep the run's Ray logs in ``RUN_DIR/ray-logs`` and remove the rest of its Ray temp dir.

    Call it once none of the run's Ray processes is left. Ray's temp dir holds, per session, its sockets,
    runtime-env resources and logs; only the logs are worth keeping. When :func:`short_temp_dir` put the
    temp dir under /tmp, that dir would otherwise stay there after the run (one per run, never reclaimed)
    and the run directory's ``ray`` link would dangle once /tmp is wiped: so each session's ``logs`` moves
    into the run directory, and the temp dir and its link go. A later resume starts a new temp dir.

    Only what Ray writes there is removed (:data:`RAY_TEMP_ENTRIES`): a temp dir that holds anything else
    (a user's own ``RUN_DIR/ray`` link to a dir of theirs) is left, link and all. Returns the logs dir, or
    None when there was no temp dir. Never raises for a file it cannot move or remove: losing a log must
    not fail a run's teardown.
    """
    wanted = run_dir / "ray"
    if wanted.is_symlink():
        temp = Path(os.readlink(wanted))
    elif wanted.is_dir():
        temp = wanted
    else:
        return None
    logs = run_dir / RAY_LOGS_DIR
    if not temp.is_dir():  # /tmp was wiped since (a reboot): nothing left to keep
        wanted.unlink(missing_ok=True)
        return logs if logs.is_dir() else None
    entries = [p for p in temp.iterdir() if p.name.startswith(RAY_TEMP_ENTRIES)]
    for session in entries:
        source = session / "logs"
        if session.is_symlink() or not source.is_dir() or (logs / session.name).exists():
            continue
        try:
            logs.mkdir(exist_ok=True)
            shutil.move(str(source), str(logs / session.name))  # a rename when /tmp and the run dir share a disk
        except OSError:
            pass
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    try:
        temp.rmdir()  # only when nothing but Ray's was in it
    except OSError:
        pass
    else:
        if wanted.is_symlink():
            wanted.unlink(missing_ok=True)
    return logs if logs.is_dir() else None


def remove_short_temp_dir(run_dir: Path) -> None:
    """Remove what :func:`short_temp_dir` made for ``run_dir``: the /tmp target of its symlink, if any."""
    wanted = run_dir / "ray"
    if wanted.is_symlink():
        shutil.rmtree(os.readlink(wanted), ignore_errors=True)
        wanted.unlink(missing_ok=True)


class LocalProvider:
    """:class:`~rubberband.cloud.provider.Provider` for ``cloud: local``: Ray nodes on this machine."""

    cloud = "local"

    def __init__(
        self,
        run_dir: str | Path,
        *,
        python: str | None = None,
        grace_s: float = 3.0,
        auth_mode: str = "token",
        token_path: Path | None = None,
    ) -> None:
        """``auth_mode``: Ray's ``RAY_AUTH_MODE`` for the head and nodes (``token``; ``disabled`` for tests of a
        Ray without auth). ``token_path``: the run's own token file, which the head and nodes use
        (``RAY_AUTH_TOKEN_PATH``); None: Ray's default, ``~/.ray/auth_token``, made when missing."""
        if auth_mode not in ("token", "disabled"):
            raise ValueError(f"auth_mode must be token or disabled, not {auth_mode!r}")
        self.auth_mode = auth_mode
        self.token_path = token_path
        self.run_dir = Path(run_dir)
        self.instances_dir = self.run_dir / "instances"
        self.python = python or sys.executable
        self.grace_s = grace_s
        self._lock = threading.Lock()  # nodes start one after another
        self._begun: _HeadStart | None = None  # the head's start begun ahead (begin_head), not yet waited for

    # -- the rest of the executor's contract (cloud.backend.ExecutorBackend) ------------------
    device_policy = None  # the executor's default: nodes advertise an instance type's real devices
    metadata_url = None  # local nodes get no preemption notices

    @property
    def ray_auth_mode(self) -> str:
        return self.auth_mode

    @property
    def ray_auth_token_path(self) -> str | None:
        return None if self.token_path is None else str(self.token_path)

    def _auth_env(self) -> dict[str, str]:
        """Ray's auth settings for a head or node this provider starts."""
        env = {"RAY_AUTH_MODE": self.auth_mode}
        if self.token_path is not None:
            env["RAY_AUTH_TOKEN_PATH"] = str(self.token_path)
        return env

    def obtained(self, instance_id: str) -> None:
        """Local nodes are exactly the type requested."""
        return None

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        """Local capacity is never blocked."""
        return False

    def runtime_env(self, code_dir: str) -> None:
        """Local nodes share this machine's files: nothing to ship."""
        return None

    # -- records ---------------------------------------------------------------------------
    def records(self) -> list[ProcessRecord]:
        if not self.instances_dir.is_dir():
            return []
        out = []
        for path in sorted(self.instances_dir.glob("*.json")):
            try:
                out.append(ProcessRecord.read(path))
            except (OSError, ValueError, TypeError):
                continue
        return out

    def record(self, instance_id: str) -> ProcessRecord:
        return ProcessRecord.read(self.instances_dir / f"{instance_id}.json")

    def head(self) -> ProcessRecord | None:
        path = self.instances_dir / f"{HEAD_ID}.json"
        return ProcessRecord.read(path) if path.exists() else None

    def _next_id(self) -> str:
        taken = {r.id for r in self.records()}
        n = 1
        while f"n{n}" in taken:
            n += 1
        return f"n{n}"

    def _ray_start(self, args: list[str], log: Path, env_extra: dict[str, str]) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        env.update(env_extra)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            return subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "ray.scripts.scripts",
                    "start",
                    "--block",
                    "--disable-usage-stats",
                    "--node-ip-address",
                    "127.0.0.1",
                    "--include-log-monitor",
                    "false",  # the driver takes no worker logs
                    "--object-store-memory",
                    str(OBJECT_STORE_BYTES),
                    # every node's dashboard agent binds 52365 by default: on one machine all but the first
                    # would retry it for ~3.4 s at start, then run without it
                    "--dashboard-agent-listen-port",
                    str(free_port()),
                    *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )

    def _wait_started(self, record: ProcessRecord, proc: subprocess.Popen, timeout_s: float, since: int) -> None:
        """Wait until this start's part of the log (from byte ``since``) says Ray is up; CloudError (transient)
        when the node exits, its GCS loses its port, or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        log = Path(record.log)
        while time.monotonic() < deadline:
            clash = _gcs_port_clash(Path(record.temp_dir), proc.pid) if record.role == "head" else None
            if clash:  # the GCS died on a port another process took; `ray start` would wait 40 s to say so
                kill_group(record.pgid, 0.5)
                proc.wait(timeout=10)
                with open(log, "a") as out:
                    out.write(f"rubberband: the head's GCS exited: {clash}\n")
                raise CloudError(f"local Ray head {record.id}: its GCS port was taken; see {log}", kind="transient")
            if proc.poll() is not None:
                tail = _log_since(log, since).strip().splitlines()[-1:]
                kill_group(record.pgid, 0.5)
                raise CloudError(
                    f"local Ray node {record.id} exited at start (code {proc.returncode}): "
                    f"{tail[0] if tail else 'no output'}; see {log}",
                    kind="transient",
                )
            if _STARTED_MARK in _log_since(log, since):
                return
            time.sleep(0.1)
        kill_group(record.pgid, 0.5)
        raise CloudError(
            f"local Ray node {record.id} did not start within {timeout_s:.0f}s; see {log}", kind="transient"
        )

    # -- head ------------------------------------------------------------------------------
    def start_head(self, run_id: str) -> HeadHandle:
        """The executor's call: the run's Ray head on this machine (started now, or taken over from
        :meth:`begin_head`); where the driver connects and when its start began."""
        record = self.start_head_process(run_id)
        return HeadHandle(address=record.address or "", id=record.id, pid=record.pid, requested_at=record.requested_at)

    def begin_head(self, run_id: str) -> None:
        """Start the run's Ray head without waiting for it: ``rubberband run`` calls this before planning, so the
        head comes up while the plan is made (issue 30: the time is not spent twice). :meth:`start_head` then
        waits for it (starting it again on other ports if another process took one); :meth:`stop_head` stops it
        when the run never starts. No thread: the process starts and this returns."""
        with self._lock:
            if self._begun is not None:
                raise ValueError("the run's head is already starting")
            self._begun = self._spawn_head(run_id, None, None, None)

    def start_head_process(
        self,
        run_id: str,
        timeout_s: float = 60.0,
        *,
        port: int | None = None,
        dashboard_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> ProcessRecord:
        """Start the run's Ray head (no CPUs: trials run on instances only); return its record.

        ``port``: the GCS port (default: a free one). ``dashboard_port``: also start the dashboard
        (and so Ray's job server) on 127.0.0.1 at that port; by default there is none. ``env``:
        extra environment for the head (and so for the Ray jobs it runs). A head begun by :meth:`begin_head`
        (with the defaults) is waited for instead of started again."""
        with self._lock:
            # Free ports are picked, then bound by Ray a moment later: another process on this machine (a second
            # run, another Ray) may take one in between, and the head exits. Then it starts again on new ports.
            tries = 1 if port is not None else PORT_TRIES
            begun, self._begun = self._begun, None
            if begun is not None and (begun.record.run_id != run_id or port or dashboard_port or env):
                self._stop_begun(begun)  # begun for another run or other settings: started afresh below
                begun = None
            for attempt in range(1, tries + 1):
                start = begun or self._spawn_head(run_id, port, dashboard_port, env)
                begun = None
                try:
                    self._wait_started(start.record, start.proc, timeout_s, start.offset)
                except CloudError:
                    if attempt == tries or not port_clash(_log_since(Path(start.record.log), start.offset)):
                        raise
                    continue
                start.record.ready_at = time.time()
                start.record.write(self.instances_dir)
                return start.record
            raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises

    def _spawn_head(
        self, run_id: str, port: int | None, dashboard_port: int | None, env: dict[str, str] | None
    ) -> "_HeadStart":
        """One try of the head's start: the ``ray start --head`` process launched and recorded, not waited for."""
        if self.auth_mode == "token" and self.token_path is None:
            ensure_auth_token()
        temp_dir = short_temp_dir(self.run_dir)
        log = self.instances_dir / f"{HEAD_ID}.log"
        now = time.time()
        gcs_port = port or free_port()
        offset = _log_size(log)  # the log is appended to: this try's part
        dashboard = (
            ["--include-dashboard", "false"]
            if dashboard_port is None
            else [
                "--include-dashboard",
                "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(dashboard_port),
            ]
        )
        proc = self._ray_start(
            [
                "--head",
                "--port",
                str(gcs_port),
                "--num-cpus",
                "0",
                "--temp-dir",
                str(temp_dir),
                *dashboard,
                "--ray-client-server-port",
                str(free_port()),
            ],
            log,
            {**HEAD_ENV, **NODE_ENV, **self._auth_env(), **(env or {})},
        )
        try:
            record = ProcessRecord(
                id=HEAD_ID,
                run_id=run_id,
                role="head",
                instance_type="head",
                workers=0,
                pid=proc.pid,
                pgid=proc.pid,
                temp_dir=str(temp_dir),
                log=str(log),
                address=f"127.0.0.1:{gcs_port}",
                requested_at=now,
                tags={TAG_RUN_ID: run_id},
            )
            record.write(self.instances_dir)
        except BaseException:  # interrupted before the record that stop_head and `down` find it by: stopped here
            kill_group(proc.pid, 0.5, leader=proc)
            raise
        return _HeadStart(proc, record, offset)

    def _stop_begun(self, begun: "_HeadStart") -> None:
        """Stop a head begun ahead: its process is this provider's own, so it is stopped and waited for by its Popen
        handle (not a pid read back from a record), never left to a look at ``/proc`` made while Ray is still
        starting; then whatever of its group outlived it."""
        kill_group(begun.record.pgid, self.grace_s, leader=begun.proc)
        begun.record.terminated_at = time.time()
        begun.record.write(self.instances_dir)

    def stop_head(self) -> bool:
        """Stop the run's Ray head, if it is ours and alive; True when it was.

        The head goes last (the executor's teardown and ``down`` terminate the nodes first): once no node
        of this run directory is left either, the run's Ray logs move into the run directory
        (:func:`settle_ray_logs`)."""
        begun, self._begun = self._begun, None
        if begun is not None:  # begun ahead and never waited for: stopped by its own handle, its record written
            self._stop_begun(begun)
            alive = True
        else:
            head = self.head()
            if head is None or head.terminated_at is not None and not _is_ours(head):
                return False
            alive = _is_ours(head)
            if alive:
                kill_group(head.pgid, self.grace_s)
            head.terminated_at = head.terminated_at or time.time()
            head.write(self.instances_dir)
        with self._lock:
            if not any(_is_ours(record) for record in self.records()):
                settle_ray_logs(self.run_dir)
        return alive

    # -- Provider --------------------------------------------------------------------------
    def provision(self, request: InstanceRequest, *, timeout_s: float = 120.0) -> list[Instance]:
        """Start ``request.count`` nodes, one after another, each up before the next starts."""
        head = self.head()
        if head is None or not _is_ours(head):
            raise CloudError("the run's local Ray head is not running; start it before provisioning", kind="fatal")
        out = []
        for _ in range(request.count):
            with self._lock:
                record = self._start_node(self._next_id(), request, head, timeout_s)
            out.append(self._instance(record))
        return out

    def start_node(self, instance_id: str, request: InstanceRequest, *, timeout_s: float = 120.0) -> Instance:
        """Start one node under a given id (e.g. a cloud instance's, to stand in for its boot in tests)."""
        head = self.head()
        if head is None or not _is_ours(head):
            raise CloudError("the run's local Ray head is not running; start it before starting nodes", kind="fatal")
        with self._lock:
            return self._instance(self._start_node(instance_id, request, head, timeout_s))

    def _start_node(
        self, instance_id: str, request: InstanceRequest, head: ProcessRecord, timeout_s: float
    ) -> ProcessRecord:
        itype: InstanceType = request.instance_type
        node = node_resources(itype)  # a GPU type's node advertises its GPUs (logical ones without CUDA)
        workers = node.slots
        log = self.instances_dir / f"{instance_id}.log"
        offset = _log_size(log)
        now = time.time()
        proc = self._ray_start(
            [
                "--address",
                str(head.address),
                *node.ray_start_args(),
                "--resources",
                json.dumps({node_resource(instance_id): workers}),
                "--temp-dir",
                head.temp_dir,
            ],
            log,
            {**NODE_ENV, **self._auth_env()},
        )
        record = ProcessRecord(
            id=instance_id,
            run_id=request.run_id,
            role="node",
            instance_type=itype.name,
            workers=workers,
            pid=proc.pid,
            pgid=proc.pid,
            temp_dir=head.temp_dir,
            log=str(log),
            stage=request.stage,
            address=head.address,
            requested_at=now,
            tags=request.tags(__version__),
        )
        record.write(self.instances_dir)
        self._wait_started(record, proc, timeout_s, offset)
        record.ready_at = time.time()
        record.write(self.instances_dir)
        return record

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        """Nodes are up when provision returns; check each is still alive."""
        out = []
        for instance_id in instance_ids:
            record = self.record(instance_id)
            if record.ready_at is None or not _is_ours(record):
                raise CloudError(f"local Ray node {instance_id} is not running; see {record.log}", kind="transient")
            out.append(self._instance(record))
        return out

    def list(self, run_id: str | None = None) -> list[Instance]:
        """Live nodes of this run directory (optionally of one run id), orphans included."""
        return [
            self._instance(r)
            for r in self.records()
            if r.role == "node" and (run_id is None or r.run_id == run_id) and _is_ours(r)
        ]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        for instance_id in instance_ids:
            path = self.instances_dir / f"{instance_id}.json"
            if not path.exists():
                continue
            record = ProcessRecord.read(path)
            if _is_ours(record):
                kill_group(record.pgid, self.grace_s)
            if record.terminated_at is None:
                record.terminated_at = time.time()
                record.write(self.instances_dir)

    def check_lost(self, instance_ids: builtins.list[str]) -> dict[str, str]:
        """Which of these nodes are gone (their process group died, or they were never recorded): id → ``lost``.

        A local node has no cloud to say why, so every loss is ``lost``.
        """
        lost = {}
        for instance_id in instance_ids:
            path = self.instances_dir / f"{instance_id}.json"
            if not path.exists() or not _is_ours(ProcessRecord.read(path)):
                lost[instance_id] = "lost"
        return lost

    def _instance(self, record: ProcessRecord) -> Instance:
        alive = _is_ours(record)
        state = "terminated" if not alive else ("running" if record.ready_at else "pending")
        return Instance(
            id=record.id,
            cloud=self.cloud,
            instance_type=record.instance_type,
            zone="local-a",
            state=state,
            run_id=record.run_id,
            stage=record.stage,
            address=record.address,
            launched_at=record.requested_at,
            tags=dict(record.tags),
        )

    def pids(self) -> builtins.list[int]:
        """Every live pid of this run's process groups (head and nodes), for tests and ``down``."""
        return sorted(pid for r in self.records() if _is_ours(r) for pid in _group_members(r.pgid))
