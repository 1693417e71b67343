"""Fresh Debian machines for the ``boot`` tier: the rendered startup scripts booted by a real systemd.

tests/test_cloud_boot.py runs the rendered scripts with bash in a venv that holds every package, where
``systemctl`` answers "no systemd" and ``useradd`` does nothing. Here a node is a real (if small) OS:

* :func:`rootfs` builds a Debian bookworm root filesystem with ``debootstrap`` once (the packages of
  :data:`PACKAGES`: systemd, sshd, python3, curl, ...) and keeps it in :data:`CACHE`
  (``/var/cache/rubberband-boot/bookworm-<hash of the package list>``), outside the repository, so later
  runs skip the build; pip's wheel cache is kept beside it and bind-mounted into every node.
* :class:`Node` boots one "instance": an overlay of that root filesystem (the cache stays read-only; the
  node's writes go to a per-test upper directory), ``systemd-nspawn --boot --register=no --keep-unit``
  with systemd as PID 1, on the host's network (loopback addresses and distinct ports only: no bridge,
  NAT or private addresses). The host's CA certificates are bind-mounted read-only, so pip can reach its
  index from inside as the host does.
* The rendered user-data runs the way cloud-init runs it: a oneshot unit after ``network-online.target``
  (``Type=oneshot``, ``RemainAfterExit=yes``, ``KillMode=process``, output to the journal and console, as
  cloud-init's ``cloud-final.service`` and GCE's ``google-startup-scripts.service`` do), so the script's
  ``apt-get``, ``pip``, ``useradd`` and ``systemctl enable --now`` are the real ones.
* The test looks inside through the overlay's merged directory (files) and ``nsenter`` into the node's
  namespaces (``systemctl``, a Ray driver); a node's console (nspawn's stdout) is its serial console.

Cleanup is by pid: :meth:`Node.close` kills the node's PID 1 (which ends everything in its PID namespace,
Ray and sshd included), waits for its nspawn, unmounts the overlay and removes the node's directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "python3-pip",
    "curl",
    "ca-certificates",
    "sudo",
    "iproute2",
    "procps",
)
CACHE = Path(os.environ.get("RUBBERBAND_BOOT_CACHE", "/var/cache/rubberband-boot"))
#: The oneshot unit that runs the user-data, as cloud-init's cloud-final.service does.
USER_DATA_UNIT = "rb-user-data.service"
USER_DATA = "/var/lib/cloud/instance/user-data.txt"
_UNIT = f"""[Unit]
Description=the instance's user-data (as cloud-init's cloud-final.service runs it)
Wants=network-online.target
After=network-online.target
[Service]
Type=oneshot
ExecStart=/bin/bash {USER_DATA}
RemainAfterExit=yes
TimeoutSec=0
KillMode=process
TasksMax=infinity
StandardOutput=journal+console
[Install]
WantedBy=multi-user.target
"""
#: What boot tests print at the end (rootfs build, boot to ready, power-off): for the closing note.
TIMINGS: dict[str, float] = {}


def unavailable() -> str | None:
    """Why nspawn boots cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "boot tier needs root (debootstrap, overlay mounts, systemd-nspawn)"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter"):
        if shutil.which(tool) is None:
            return f"boot tier needs {tool} (apt-get install debootstrap systemd-container)"
    if not (_rootfs_path() / "etc" / "os-release").exists():
        try:
            urllib.request.urlopen(f"{MIRROR}/dists/{SUITE}/Release", timeout=15).close()
        except OSError as exc:
            return f"boot tier cannot reach Debian's mirror {MIRROR} to build its root filesystem: {exc}"
    return None


def _rootfs_path() -> Path:
    digest = hashlib.sha256(" ".join((SUITE, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]
    return CACHE / f"{SUITE}-{digest}"


def rootfs() -> Path:
    """The cached root filesystem, built with debootstrap if missing (under a lock: pytest-xdist workers)."""
    path = _rootfs_path()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        if not (path / "etc" / "os-release").exists():
            building = path.with_name(path.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(building), MIRROR],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            building.rename(path)
            TIMINGS["rootfs build (cold)"] = time.monotonic() - started
        else:
            TIMINGS.setdefault("rootfs build (warm, cached)", time.monotonic() - started)
    (CACHE / "pip").mkdir(exist_ok=True)
    return path


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, breadth first (read from /proc/PID/task/*/children)."""
    found, queue = [], [pid]
    while queue:
        for task in Path(f"/proc/{queue.pop(0)}/task").glob("*/children"):
            try:
                children = [int(child) for child in task.read_text().split()]
            except OSError:  # the task ended while we read
                continue
            found += children
            queue += children
    return found


def _pid_one_of_its_namespace(pid: int) -> bool:
    """Whether ``pid`` is PID 1 inside a PID namespace nested in ours (its NSpid line ends in 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False


class Node:
    """One booted "instance": an overlay of :func:`rootfs` under ``workdir``, systemd as PID 1 in nspawn.

    ``files`` are written into the node's disk before it boots (paths inside the node); ``user_data`` is the
    rendered startup script, run by :data:`USER_DATA_UNIT`; ``ssh_port`` is where the node's sshd listens
    (127.0.0.1 only: the nodes share the host's network)."""

    def __init__(self, name: str, workdir: Path, user_data: str, *, ssh_port: int, files: dict[str, str] | None = None):
        self.name, self.workdir = name, workdir
        self.root = workdir / "root"
        for sub in ("upper", "work", "root"):
            (workdir / sub).mkdir(parents=True)
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={rootfs()},upperdir={workdir / 'upper'},workdir={workdir / 'work'}",
                str(self.root),
            ],
            check=True,
        )
        self.mounted = True
        wanted = f"/etc/systemd/system/multi-user.target.wants/{USER_DATA_UNIT}"
        files = {
            **(files or {}),
            USER_DATA: user_data,
            f"/etc/systemd/system/{USER_DATA_UNIT}": _UNIT,
            "/etc/ssh/sshd_config.d/rb-boot.conf": f"Port {ssh_port}\nListenAddress 127.0.0.1\n",
            "/etc/pip.conf": "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
            + ("find-links = /opt/wheels\n" if Path("/opt/wheels").is_dir() else ""),
            "/etc/hostname": f"{name}\n",
        }
        for path, text in files.items():
            target = self.root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (self.root / wanted.lstrip("/")).symlink_to(f"/etc/systemd/system/{USER_DATA_UNIT}")
        # nspawn's console-getty.service runs agetty on /dev/console, whose vhangup() turns the boot script's open
        # console into EIO ("tee: /dev/console: Input/output error"): an instance's serial getty is not on it here
        (self.root / "etc/systemd/system/console-getty.service").symlink_to("/dev/null")
        binds = ["--bind-ro=/etc/ssl/certs", f"--bind={CACHE / 'pip'}:/root/.cache/pip"]
        if Path("/opt/wheels").is_dir():
            binds.append("--bind-ro=/opt/wheels")  # a local wheel (torch) the host's pip finds too
        self.console_file = open(workdir / "console.log", "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--console=read-only", "-q"]
            + [f"--machine=rb-{name}-{os.getpid()}", "-D", str(self.root), *binds],
            stdin=subprocess.DEVNULL,
            stdout=self.console_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.leader = self._leader()

    def _leader(self) -> int:
        """The node's PID 1 (systemd) as the host sees it: the descendant of nspawn that is PID 1 of its own PID
        namespace. nspawn's first child is an intermediate that exits once it has started the container, so
        taking "nspawn's first child" can name a process that is gone a moment later (every ``nsenter`` then
        fails with empty output)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            for pid in _descendants(self.proc.pid):
                if _pid_one_of_its_namespace(pid):
                    return pid
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: systemd-nspawn started no container: {self.console()[-2000:]}")

    def path(self, inside: str) -> Path:
        """A path of the node's disk, seen from the host."""
        return self.root / inside.lstrip("/")

    def console(self) -> str:
        return (self.workdir / "console.log").read_text(errors="replace")

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a command inside the node (all its namespaces: mount, pid, cgroup, ...)."""
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", *argv], capture_output=True, text=True, timeout=timeout
        )

    def is_active(self, unit: str, *, settle_s: float = 60.0) -> str:
        """``systemctl is-active unit`` inside the node, once it has an answer that is not a transition: systemd
        may not answer on its bus for a moment (empty output) while the boot's units start on a loaded machine."""
        deadline = time.monotonic() + settle_s
        while True:
            answer = self.run("systemctl", "is-active", unit)
            state = answer.stdout.strip()
            if state not in ("", "activating", "reloading", "deactivating"):
                return state
            if time.monotonic() >= deadline:
                return state or f"(no answer: {answer.stderr.strip()[-300:]})"
            time.sleep(1.0)

    def wait_for(self, inside: str, timeout_s: float, *, fail: str | None = None) -> float:
        """Seconds since boot until ``inside`` exists; raises if ``fail`` appears, the node stops, or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not self.path(inside).exists():
            if fail and self.path(fail).exists():
                raise AssertionError(f"{self.name}: the boot failed: {self.console()[-4000:]}")
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name}: the node stopped ({self.proc.returncode}): {self.console()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {inside} within {timeout_s:.0f}s: {self.console()[-4000:]}")
            time.sleep(0.5)
        return time.monotonic() - self.started

    def wait_stopped(self, timeout_s: float) -> bool:
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        """Kill the node (its PID 1: everything in its PID namespace ends), unmount its disk, remove its directory."""
        if self.proc.poll() is None:
            try:
                os.kill(self.leader, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not self.wait_stopped(20):
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.console_file.close()
        if self.mounted:
            subprocess.run(["umount", str(self.root)], check=False)
            if subprocess.run(["mountpoint", "-q", str(self.root)]).returncode == 0:
                subprocess.run(["umount", "-l", str(self.root)], check=False)
            self.mounted = False
        shutil.rmtree(self.workdir, ignore_errors=True)
