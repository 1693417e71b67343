"""LocalProvider lifecycle with real Ray nodes: start, list, terminate, and orphans of a dead starter.

One test (~25 s on a 2-core machine: a head and two Ray nodes, started one after another) covers
the whole lifecycle, because starting Ray nodes is the slow part and every step builds on the last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from executor_helpers import run_pids

from rubberband.cloud.local.provider import LocalProvider, ProcessRecord
from rubberband.cloud.provider import node_resource
from rubberband.cloud.provider import TAG_RUN_ID
from rubberband.errors import CloudError

STARTER = textwrap.dedent("""
    import sys, time
    from rubberband.catalog import load_catalog
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.cloud.provider import InstanceRequest

    provider = LocalProvider(sys.argv[1])
    provider.start_head("orphan-run")
    itype = load_catalog(["local"]).find("local.cpu1", cloud="local")
    provider.provision(InstanceRequest(run_id="orphan-run", stage=0, instance_type=itype, count=2))
    print("ready", flush=True)
    time.sleep(600)
""")


def test_nodes_outlive_their_starter_and_are_found_and_stopped(tmp_path, cli):
    run_dir = tmp_path / "run"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout.readline().strip() == "ready"
    finally:
        starter.send_signal(signal.SIGKILL)  # the executor dies without cleaning up
        starter.wait(timeout=10)

    provider = LocalProvider(run_dir)
    found = provider.list("orphan-run")
    assert sorted(i.id for i in found) == ["n1", "n2"]
    assert all(i.state == "running" and i.tags[TAG_RUN_ID] == "orphan-run" for i in found)
    assert provider.list("another-run") == []
    records = {r.id: r for r in provider.records()}
    assert records["n1"].pgid == records["n1"].pid and records["n1"].pgid != os.getpgid(0)
    cmdline = open(f"/proc/{records['n1'].pid}/cmdline").read().replace("\0", " ")
    assert f'"{node_resource("n1")}": 1' in cmdline and "--num-cpus 1" in cmdline
    assert [i.id for i in provider.wait(["n1", "n2"], timeout_s=5)] == ["n1", "n2"]
    n1_pids = [p for p in run_pids(run_dir) if os.getpgid(p) == records["n1"].pgid]
    assert n1_pids, "node n1 should have live processes"

    provider.terminate(["n1"])
    provider.terminate(["n1"])  # idempotent
    time.sleep(0.2)
    assert not [p for p in n1_pids if os.path.exists(f"/proc/{p}") and _not_zombie(p)]
    assert [i.id for i in provider.list("orphan-run")] == ["n2"]
    assert ProcessRecord.read(run_dir / "instances" / "n1.json").terminated_at is not None
    with pytest.raises(CloudError, match="n1 is not running"):
        provider.wait(["n1"], timeout_s=1)

    temp = Path(os.readlink(run_dir / "ray"))  # the run dir's path is too long for Ray's sockets: a /tmp dir
    assert temp.is_dir() and (run_dir / "ray").is_symlink()
    result = cli("down", str(run_dir))
    assert result.returncode == 0, result.stderr
    # nothing of the run left in /tmp: its Ray logs moved into the run dir
    assert not temp.exists() and not (run_dir / "ray").is_symlink()
    assert list((run_dir / "ray-logs").glob("session_*/raylet.out"))
    assert "terminated n2 (local.cpu1, run orphan-run" in result.stdout
    assert "terminated the Ray head of run orphan-run" in result.stdout
    assert run_pids(run_dir) == []
    again = cli("down", str(run_dir))
    assert again.returncode == 0 and "nothing left running" in again.stdout


def _not_zombie(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_down_of_an_unknown_run_is_a_one_line_error(tmp_path, cli):
    result = cli("down", str(tmp_path / "missing"), env={**os.environ, "RUBBERBAND_RUNS_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not found" in result.stderr


@pytest.mark.e2e
def test_a_head_whose_port_another_process_took_starts_again_on_new_ports(tmp_path, monkeypatch):
    """Free ports are picked before Ray binds them: another process may take one first (two runs starting at once).
    The head's first start dies on the taken port; the second, on ports picked anew, comes up.

    The run dir is a resumed one: its head log already holds the earlier executor's head's "started" line. Only
    this start's part of the log counts; reading the whole log, the start returned at once, with a head that then
    died on the port, and the resumed run's driver gave up on its GCS a minute later."""
    import socket

    import rubberband.cloud.local.provider as local

    picked: list[int] = []
    real = local.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(local, "free_port", lambda: picked.append(1) or (port if len(picked) == 1 else real()))
        provider = LocalProvider(tmp_path / "run")
        earlier = tmp_path / "run" / "instances" / "head.log"
        earlier.parent.mkdir(parents=True)
        earlier.write_text(f"{local._STARTED_MARK}\n")  # the earlier executor's head, since stopped
        try:
            record = provider.start_head_process("clash-run")
            assert record.address != f"127.0.0.1:{port}" and record.ready_at is not None
            log = (tmp_path / "run" / "instances" / "head.log").read_text(errors="replace")
            assert local.port_clash(log)  # the first start died on the port, and said so
        finally:
            provider.stop_head()
    assert run_pids(tmp_path / "run") == []


def _ray_temp_dir(root: Path, *sessions: str) -> Path:
    """A Ray temp dir as a stopped cluster leaves it: per session its logs, sockets and runtime resources."""
    for name in sessions:
        (root / name / "logs").mkdir(parents=True)
        (root / name / "logs" / "raylet.out").write_text(f"{name} raylet\n")
        (root / name / "sockets").mkdir()
        (root / name / "runtime_resources").mkdir()
    (root / "session_latest").symlink_to(root / sessions[-1])
    (root / "prom_metrics_service_discovery.json").write_text("[]")  # the dashboard's, beside the sessions
    return root


def test_a_stopped_runs_ray_logs_move_into_its_run_dir_and_its_tmp_dir_goes(tmp_path):
    """The /tmp dir a long run-dir path needs for Ray's sockets is removed; each session's logs are kept."""
    from rubberband.cloud.local.provider import RAY_LOGS_DIR, settle_ray_logs

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    temp = _ray_temp_dir(tmp_path / "rb-short", "session_1", "session_2")  # a run and its resume
    (run_dir / "ray").symlink_to(temp, target_is_directory=True)
    assert settle_ray_logs(run_dir) == run_dir / RAY_LOGS_DIR
    assert not temp.exists() and not (run_dir / "ray").is_symlink()
    assert sorted(p.name for p in (run_dir / RAY_LOGS_DIR).iterdir()) == ["session_1", "session_2"]
    assert (run_dir / RAY_LOGS_DIR / "session_2" / "raylet.out").read_text() == "session_2 raylet\n"
    assert settle_ray_logs(run_dir) is None  # nothing left to settle
    (run_dir / "ray").symlink_to(tmp_path / "wiped-by-a-reboot", target_is_directory=True)
    assert settle_ray_logs(run_dir) == run_dir / RAY_LOGS_DIR and not (run_dir / "ray").is_symlink()


def test_a_short_run_dirs_own_ray_temp_dir_is_settled_the_same_way(tmp_path):
    from rubberband.cloud.local.provider import RAY_LOGS_DIR, settle_ray_logs

    run_dir = tmp_path / "run"
    _ray_temp_dir(run_dir / "ray", "session_1")
    (run_dir / RAY_LOGS_DIR / "session_0").mkdir(parents=True)  # an earlier attempt's, settled before
    settle_ray_logs(run_dir)
    assert not (run_dir / "ray").exists()
    assert sorted(p.name for p in (run_dir / RAY_LOGS_DIR).iterdir()) == ["session_0", "session_1"]


def test_a_ray_link_the_user_made_keeps_its_dir_and_what_is_theirs_in_it(tmp_path):
    """Only what Ray wrote is removed: a ``RUN_DIR/ray`` link to a dir of the user's stays, with their files."""
    from rubberband.cloud.local.provider import RAY_LOGS_DIR, settle_ray_logs

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    theirs = _ray_temp_dir(tmp_path / "fast-disk", "session_1")
    (theirs / "notes.txt").write_text("mine\n")
    (run_dir / "ray").symlink_to(theirs, target_is_directory=True)
    settle_ray_logs(run_dir)
    assert (run_dir / RAY_LOGS_DIR / "session_1" / "raylet.out").exists()
    assert (run_dir / "ray").is_symlink() and sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


@pytest.mark.e2e
@pytest.mark.parametrize("with_leader", [True, False])
def test_kill_group_ends_a_group_that_ignores_sigterm(with_leader):
    """kill_group stops a whole process group whose members ignore SIGTERM (SIGKILL after the grace), and with the
    leader's handle the leader is reaped through it (no zombie left to a later look at /proc)."""
    from rubberband.cloud.local.provider import kill_group

    proc = subprocess.Popen(
        ["bash", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)  # the two members have started
    started = time.monotonic()
    kill_group(proc.pid, 0.3, leader=proc if with_leader else None)
    assert time.monotonic() - started < 8.0
    if with_leader:
        assert proc.returncode == -signal.SIGKILL
    else:
        proc.wait(timeout=5)
    assert _live_in_group(proc.pid) == []


def _live_in_group(pgid: int) -> list[int]:
    """Pids of process group ``pgid`` that are not zombies (members orphaned by the leader wait for init's reap)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        state, _, group = text[text.rindex(")") + 2 :].split()[:3]
        if state != "Z" and int(group) == pgid:
            live.append(int(stat.parent.name))
    return live
