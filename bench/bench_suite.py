"""Where the test suite's time goes: the CPU of every process a pytest run starts, by what the process is.

    python bench/bench_suite.py [--interval S] [--out FILE] [-- PYTEST ARGS...]

Runs ``python -m pytest -q -p no:cacheprovider PYTEST ARGS...`` (the README's test command when none are given)
and samples ``/proc`` every ``--interval`` seconds. A process counts once it is seen with the pytest process or
a process already counted as its parent: the CLI subprocesses, the Ray nodes they start (``ray start --block``
stays their parent), Ray's workers. Each process's CPU (user + system, from ``/proc/PID/stat``) goes to what it
was last seen to be: a Ray worker that became a trial worker counts as a trial worker, its start-up included.
A process that lives entirely between two samples is missed (a few per cent at the default interval).

Prints the run's wall time and pytest's summary, the CPU it used against what the machine's cores offered, what
the 10-minute target allows (``--target``, minutes: cores × target CPU-minutes at best), a table of the process
kinds (how many, CPU-minutes, share and the median per process) and the ``--top`` tests whose processes used the
most CPU (a process goes to the test that ``PYTEST_CURRENT_TEST`` names in its environment). Why: the suite is
bound by CPU on two cores, so its wall time follows from how much CPU its processes need; this says which of them
to cut.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

#: (kind, substrings of the command line): the first kind whose substring is in it. Order matters: a Ray agent's
#: title starts with ``ray::`` too, and a worker's command line names the raylet's socket.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Ray dashboard agent (per node)", ("ray::DashboardAgent", "dashboard/agent.py")),
    ("Ray runtime-env agent (per node)", ("ray::RuntimeEnvAgent", "runtime_env/agent/main.py")),
    ("trial workers (Ray + torch + DDP)", ("ray::TrialWorker",)),
    ("journal sink actor", ("ray::JournalSink",)),
    ("other Ray workers (tasks, idle, never used)", ("ray::", "default_worker.py")),
    ("raylet (per node)", ("/raylet/raylet",)),
    ("gcs_server (per head)", ("gcs_server",)),
    ("Ray dashboard / API server (per head)", ("dashboard/dashboard.py", "ray-dashboard-")),
    ("Ray client server (per head)", ("ray.util.client.server",)),
    ("Ray autoscaler monitor (per head)", ("autoscaler/_private/monitor.py",)),
    ("Ray log monitor (per node)", ("log_monitor.py",)),
    ("`ray start --block` (per node)", ("ray.scripts.scripts start", "bin/ray start")),
    (
        "played head job / watchdog / boot",
        ("rubberband.head_job", "rubberband.cloud.watchdog_cli", "played_boots.py", "head_job_harness.py"),
    ),
    ("CLI processes", ("-m rubberband", "cli_harness.py", "bin/rubberband")),
    ("pytest (controller and workers, moto and the GCE fake in them)", ("pytest", "execnet", "sys.stdin.readline")),
)
OTHER = "other"


def kind_of(cmdline: str) -> str:
    for kind, needles in KINDS:
        if any(needle in cmdline for needle in needles):
            return kind
    return OTHER


@dataclass
class Seen:
    """One process (pid and start time): its last CPU reading, what it was last seen to be, and the test it ran
    for (``""`` when its environment names none: pytest's own processes)."""

    cpu_ticks: int = 0
    kind: str = OTHER
    test: str = ""


def test_of(environ: bytes) -> str:
    """The test a process was started for: pytest's ``PYTEST_CURRENT_TEST`` in its environment (which a CLI
    subprocess, the Ray nodes it starts and their workers all inherit), without the phase. A module fixture's
    processes go to the test whose setup started them."""
    for entry in environ.split(b"\0"):
        if entry.startswith(b"PYTEST_CURRENT_TEST="):
            value = entry.split(b"=", 1)[1].decode(errors="replace")
            return value.rsplit(" (", 1)[0]
    return ""


@dataclass
class Sampler:
    root: int
    processes: dict[tuple[int, int], Seen] = field(default_factory=dict)
    samples: int = 0

    def sample(self) -> None:
        table: list[tuple[int, int, int, int, str]] = []  # pid, ppid, start, cpu, cmdline
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                raw = Path(entry.path, "stat").read_bytes()
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            table.append((int(entry.name), int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]), cmdline))
        table.sort(key=lambda row: row[2])  # parents before their children
        counted_pids = {pid for (pid, _start) in self.processes}
        for pid, ppid, start, cpu, cmdline in table:
            key = (pid, start)
            if key not in self.processes and not (pid == self.root or ppid in counted_pids):
                continue
            seen = self.processes.get(key)
            if seen is None:
                seen = self.processes[key] = Seen(test=_read_test(pid))
            counted_pids.add(pid)
            seen.cpu_ticks = max(seen.cpu_ticks, cpu)
            if cmdline.strip():
                seen.kind = kind_of(cmdline)
        self.samples += 1


def _read_test(pid: int) -> str:
    try:
        return test_of(Path(f"/proc/{pid}/environ").read_bytes())
    except OSError:
        return ""


def report(sampler: Sampler, wall_s: float, cores: int, target_min: float, summary: str) -> str:
    """The CPU used per process kind against what the target allows (the costliest tests: :func:`by_test`)."""
    by_kind: dict[str, list[float]] = {}
    for seen in sampler.processes.values():
        by_kind.setdefault(seen.kind, []).append(seen.cpu_ticks / TICKS)
    total_s = sum(sum(v) for v in by_kind.values())
    budget_s = cores * target_min * 60
    lines = [
        f"suite: {summary or '(no pytest summary line)'}",
        f"wall {wall_s / 60:.1f} min on {cores} cores; CPU {total_s / 60:.1f} CPU-min = "
        f"{100 * total_s / (cores * wall_s):.0f}% of what the cores offered in that time",
        f"{target_min:g}-minute target: at most {budget_s / 60:.1f} CPU-min on {cores} cores; this run needed "
        f"{total_s / budget_s:.2f}x that",
        "",
        f"{'process kind':64} {'count':>6} {'CPU-min':>8} {'share':>6} {'median s':>9}",
    ]
    for kind, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        lines.append(
            f"{kind:64} {len(cpus):6d} {sum(cpus) / 60:8.2f} {100 * sum(cpus) / total_s:5.1f}% "
            f"{statistics.median(cpus):9.2f}"
        )
    lines.append(f"({sampler.samples} samples of /proc)")
    return "\n".join(lines)


NODE_KIND = "`ray start --block` (per node)"
WORKER_KIND = "trial workers (Ray + torch + DDP)"


def by_test(sampler: Sampler, top: int) -> list[str]:
    """The ``top`` tests whose processes used the most CPU, with the Ray nodes and trial workers they started: the
    tests to merge or shrink first. pytest's own CPU is not in it (its processes name no test)."""
    cpu: dict[str, float] = {}
    nodes: dict[str, int] = {}
    workers: dict[str, int] = {}
    for seen in sampler.processes.values():
        if not seen.test:
            continue
        cpu[seen.test] = cpu.get(seen.test, 0.0) + seen.cpu_ticks / TICKS
        nodes[seen.test] = nodes.get(seen.test, 0) + (seen.kind == NODE_KIND)
        workers[seen.test] = workers.get(seen.test, 0) + (seen.kind == WORKER_KIND)
    if not cpu:
        return ["(no process named its test)"]
    lines = [f"{'test (its processes only)':100} {'CPU s':>7} {'nodes':>6} {'workers':>8}"]
    for test, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{test[-100:]:100} {seconds:7.1f} {nodes[test]:6d} {workers[test]:8d}")
    lines.append(f"({len(cpu)} tests started processes; they used {sum(cpu.values()) / 60:.1f} CPU-min in all)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples of /proc")
    parser.add_argument("--target", type=float, default=10.0, help="the wall-time target, minutes")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--top", type=int, default=25, help="how many of the costliest tests to list")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: none)")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be above 0 seconds")
    if args.top < 1:
        parser.error("--top must be at least 1")
    cores = len(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args]
    began = time.monotonic()
    output: list[str] = []

    def echo(stream) -> None:  # pytest's output, shown as it comes and kept for its summary line
        for line in stream:
            output.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        sampler = Sampler(root=proc.pid)
        reader = threading.Thread(target=echo, args=(proc.stdout,), daemon=True)
        reader.start()
        while proc.poll() is None:
            sampler.sample()
            time.sleep(args.interval)
        reader.join(timeout=10)
    wall_s = time.monotonic() - began
    sampler.sample()
    if proc.returncode in (2, 3, 4, 5):  # pytest did not run the suite: no figures to report
        print(f"bench_suite: pytest exited {proc.returncode} before running the suite (see above)", file=sys.stderr)
        return proc.returncode
    lines = "".join(output).splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if " in " in line and "passed" in line), "")
    table = "\n".join([report(sampler, wall_s, cores, args.target, summary), "", *by_test(sampler, args.top)])
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
