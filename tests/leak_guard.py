"""Test tiers and the leak guard: loaded by ``conftest.py`` (and by the sandboxed sessions that test it).

**Tiers.** A test that starts Ray, a server (moto, the GCE fake), a subprocess (the CLI), real training or
runs a whole CLI command in the test's process (``cli_here``) is marked ``e2e``; the rest is the unit tier
(``pytest -m "not e2e"``, about a minute). A test is marked ``e2e`` explicitly (``@pytest.mark.e2e`` or a
module's ``pytestmark``) or by using a fixture of :data:`E2E_FIXTURES`. The tier is checked, not trusted: in a
test that is *not* marked e2e, starting a process or binding a server socket raises :class:`UnitTierViolation`
naming what was started, so the unit tier cannot silently grow slow.

**Leak guard.** The session tags every process it starts (``$RUBBERBAND_TEST_SESSION``, inherited by the
CLI subprocesses, the Ray nodes they start and Ray's workers, even once they are orphaned) and points
every temp dir at a root of its own (``$TMPDIR`` and ``$RUBBERBAND_TMP_ROOT``). Per test (e2e), per module
and per session it compares what is tagged and what is in that root before and after: a process, a temp
dir, a Ray connection or a server socket left behind is removed (processes killed by pid, after checking
that the pid still names the same process) and the test that left it fails; of temp entries only the caches
libraries keep there by design (:data:`THIRD_PARTY_CACHES`) are removed without failing it. Nothing is ever
looked up by name across the machine: other test sessions' Ray clusters run on it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest

SESSION_ENV = "RUBBERBAND_TEST_SESSION"
TMP_ROOT_ENV = "RUBBERBAND_TMP_ROOT"

#: Fixtures that make a test end-to-end (they start Ray, a server or the CLI in a subprocess, or run a whole CLI
#: command in this process: ``cli_here``).
E2E_FIXTURES = frozenset(
    {
        "cli",
        "cli_here",
        "local_ray_cluster",
        "moto_server",
        "moto_env",
        "ec2_faults",
        "gce_fake",
        "gce_env",
        "pytester",
    }
)

#: How long something a test started may take to go away on its own before it counts as left behind.
GRACE_S = float(
    os.environ.get("RUBBERBAND_LEAK_GRACE_S", "15")
)  # a played head's watchdog job may take ~10 s to see its head gone


class UnitTierViolation(BaseException):
    """A unit-tier test started a process or a server (a BaseException, so no ``except Exception`` hides it)."""


# -- processes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks since boot: with the pid, the process's identity
    cmdline: str

    def alive(self) -> bool:
        current = _stat(self.pid)
        return current is not None and current[1] == self.start and current[2] != "Z"


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time, state) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0].decode()


def tagged_processes(token: str) -> dict[int, Proc]:
    """Live processes whose environment carries this session's token (children of the CLI, Ray's nodes and
    workers included, even reparented), except this process."""
    needle = f"{SESSION_ENV}={token}".encode()
    found: dict[int, Proc] = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle + b"\0" not in environ and not environ.endswith(needle):
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[2] == "Z":
            continue
        try:
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        found[int(entry.name)] = Proc(int(entry.name), stat[0], stat[1], cmd[:160])
    return found


def _kill(procs: list[Proc]) -> None:
    for proc in procs:
        if proc.alive():  # the same process: the pid was not reused
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + 5
    for proc in procs:
        while time.monotonic() < deadline:
            try:  # our own child: reap it, else it stays a zombie
                os.waitpid(proc.pid, os.WNOHANG)
            except OSError:
                pass
            if not proc.alive():
                break
            time.sleep(0.05)


def _left_behind(before: dict[int, Proc], token: str, grace_s: float) -> list[Proc]:
    """Processes started since ``before`` that are still alive after ``grace_s``.

    A new process whose parent was already there (a Ray worker of a cluster a wider fixture started)
    belongs to that parent, not to the test; one whose parent is this process, is gone (reparented) or is
    itself new is the test's."""
    deadline = time.monotonic() + grace_s
    while True:
        now = tagged_processes(token)
        new = [p for p in now.values() if before.get(p.pid) is None or before[p.pid].start != p.start]
        leaked = [p for p in new if p.ppid not in before]
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(0.1)


# -- temp dirs, Ray connections, servers ---------------------------------------------------------------------


def _temp_entries(root: Path) -> set[str]:
    try:
        return {name for name in os.listdir(root) if not name.startswith("pytest-of-")}
    except FileNotFoundError:
        return set()


#: What libraries leave in ``$TMPDIR`` by design, not rubberband: torch's compile cache (DDP's constructor imports
#: torch._dynamo, which creates it) and multiprocessing's per-process dir (left when its process is killed). Removed
#: after each test like any other entry, but not held against it.
THIRD_PARTY_CACHES = ("torchinductor_", "pymp-")


_servers: "weakref.WeakSet[socketserver.BaseServer]" = weakref.WeakSet()
_server_init = socketserver.BaseServer.__init__


def _tracking_init(self, *args, **kwargs):
    _server_init(self, *args, **kwargs)
    _servers.add(self)


#: Servers a session-scoped fixture owns (it closes them itself): not a module's or a test's leak, although
#: the first module or test that needs the fixture is the one that starts them.
_session_owned: set[int] = set()


def session_owned(server: object) -> None:
    """Declare ``server`` (a socketserver) owned by a session-scoped fixture, which closes it at the end."""
    _session_owned.add(id(server))


def _open_servers() -> set[int]:
    return {
        id(s)
        for s in list(_servers)
        if id(s) not in _session_owned and getattr(getattr(s, "socket", None), "fileno", lambda: -1)() != -1
    }


def _close_servers(ids: set[int]) -> list[str]:
    closed = []
    for server in list(_servers):
        if id(server) in ids:
            closed.append(f"{type(server).__name__} on {getattr(server, 'server_address', '?')}")
            threading.Thread(target=server.shutdown, daemon=True).start()  # returns at once if not serving
            server.server_close()
    return closed


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


# -- the unit-tier check ---------------------------------------------------------------------------------------


def _is_e2e(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None


class _UnitTierCheck:
    """While active, starting a process or binding a server socket raises :class:`UnitTierViolation`."""

    def __init__(self, test: str) -> None:
        self.test = test

    def _refuse(self, what: str) -> None:
        raise UnitTierViolation(
            f"{self.test} is not marked e2e but {what}; mark it @pytest.mark.e2e "
            f"(or keep the unit tier free of processes and servers)"
        )

    def __enter__(self) -> "_UnitTierCheck":
        check = self
        self._popen = subprocess.Popen._execute_child
        self._bind = socketserver.TCPServer.server_bind
        self._fork = os.fork

        def execute_child(popen, args, *rest, **kw):
            check._refuse(f"started the process {str(args)[:200]!r}")

        def server_bind(server):
            check._refuse(f"opened the server {type(server).__name__}")

        def fork():
            check._refuse("forked a process")

        subprocess.Popen._execute_child = execute_child
        socketserver.TCPServer.server_bind = server_bind
        os.fork = fork
        return self

    def __exit__(self, *exc) -> None:
        subprocess.Popen._execute_child = self._popen
        socketserver.TCPServer.server_bind = self._bind
        os.fork = self._fork


# -- pytest hooks and fixtures -------------------------------------------------------------------------------


def take_sigterm() -> None:
    """A SIGTERM to the session (a CI job cancelled, ``kill``) unwinds it as Ctrl-C does, so that the fixtures'
    teardowns and this guard still stop what the tests started: Python's default ends the process at once, and
    the boot tier's booted machines (systemd-nspawn, Ray inside), Ray nodes and servers outlived it. In the main
    thread only (where signal handlers run); each xdist worker is a session of its own and takes it too."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: starts Ray, a server, a whole CLI command or real training (deselect with -m 'not e2e')"
    )
    if getattr(config, "_rb_guard_root", None) is not None:
        return
    take_sigterm()
    token = uuid.uuid4().hex[:12]
    # Short, so that Ray's unix sockets under it stay below 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="rbt-", dir="/tmp"))
    config._rb_guard_root = root
    config._rb_guard_token = token
    config._rb_guard_saved = {k: os.environ.get(k) for k in (SESSION_ENV, TMP_ROOT_ENV, "TMPDIR")}
    os.environ[SESSION_ENV] = token
    os.environ[TMP_ROOT_ENV] = str(root)
    os.environ["TMPDIR"] = str(root)
    tempfile.tempdir = None  # recompute gettempdir() from $TMPDIR
    socketserver.BaseServer.__init__ = _tracking_init


def pytest_unconfigure(config: pytest.Config) -> None:
    root = getattr(config, "_rb_guard_root", None)
    if root is None:
        return
    for key, value in config._rb_guard_saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    tempfile.tempdir = None
    socketserver.BaseServer.__init__ = _server_init
    _kill(list(tagged_processes(config._rb_guard_token).values()))  # last resort: nothing outlives the session
    shutil.rmtree(root, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not _is_e2e(item) and E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


class Snapshot:
    def __init__(self, config: pytest.Config, *, processes: bool) -> None:
        self.token: str = config._rb_guard_token
        self.root: Path = config._rb_guard_root
        self.processes = tagged_processes(self.token) if processes else None
        self.temp = _temp_entries(self.root)
        self.servers = _open_servers()
        self.ray = _ray_connected()

    def leaks(self, what: str, grace_s: float = GRACE_S) -> str | None:
        """Remove what was left since this snapshot; a message naming it, or None when nothing was."""
        found = []
        if self.ray is False and _ray_connected():
            import ray

            ray.shutdown()
            found.append("a Ray connection (ray.init without ray.shutdown)")
        if self.processes is not None:
            procs = _left_behind(self.processes, self.token, grace_s)
            if procs:
                _kill(procs)
                found.append(
                    f"{len(procs)} process(es), now killed: "
                    + "; ".join(f"pid {p.pid} `{p.cmdline}`" for p in procs[:6])
                )
        servers = _open_servers() - self.servers
        if servers:
            found.append("server socket(s), now closed: " + ", ".join(_close_servers(servers)))
        temp = _temp_entries(self.root) - self.temp
        for name in temp:
            path = self.root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        ours = sorted(name for name in temp if not name.startswith(THIRD_PARTY_CACHES))
        if ours:
            found.append(f"temp entries in {self.root}, now removed: {', '.join(ours[:6])}")
        return f"{what} left behind {' and '.join(found)}" if found else None


@pytest.fixture(scope="session", autouse=True)
def _session_leak_guard(request: pytest.FixtureRequest):
    snapshot = Snapshot(request.config, processes=True)
    yield
    message = snapshot.leaks("the test session (a session-scoped fixture)")
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _module_leak_guard(request: pytest.FixtureRequest):
    snapshot = Snapshot(request.config, processes=True)
    yield
    message = snapshot.leaks(f"module {request.module.__name__} (a module-scoped fixture)")
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture(autouse=True)
def _test_leak_guard(request: pytest.FixtureRequest):
    """Per test: e2e tests must leave nothing behind; unit tests must not start processes or servers."""
    e2e = _is_e2e(request.node)
    snapshot = Snapshot(request.config, processes=e2e)
    if e2e:
        yield
    else:
        with _UnitTierCheck(request.node.nodeid):
            yield
    message = snapshot.leaks(request.node.nodeid)
    if message:
        pytest.fail(message, pytrace=False)
