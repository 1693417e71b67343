"""The leak guard and the tier check, proven in sandboxed pytest sessions (pytester, in a subprocess)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.e2e  # each test runs a pytest session in a subprocess (one starts a Ray node)

TESTS_DIR = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from leak_guard import (_module_leak_guard, _session_leak_guard, _test_leak_guard,  # noqa: F401
                        pytest_collection_modifyitems, pytest_configure, pytest_unconfigure)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] != "Z"


def test_a_test_that_leaks_a_ray_node_fails_and_the_node_is_killed(pytester, tmp_path):
    """The sandbox's test starts a Ray head node (``ray start``, which daemonises: its processes outlive
    the command) and never stops it. The guard fails that test, kills the node's processes by pid, and the
    next test of the session passes."""
    pids_file = tmp_path / "pids"
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_leaky=textwrap.dedent(f"""
        import os, subprocess, sys, tempfile, time
        from pathlib import Path
        import pytest

        @pytest.mark.e2e
        def test_leaks_a_ray_node():
            temp = tempfile.mkdtemp(prefix="rb-leak-")  # under the session's root, as Ray nodes in tests are
            done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", "0",
                                   "--num-cpus", "0", "--include-dashboard", "false", "--temp-dir", temp,
                                   "--disable-usage-stats"], capture_output=True, text=True, timeout=120,
                                  env={{k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}})
            assert done.returncode == 0, done.stderr[-2000:]
            token = os.environ["RUBBERBAND_TEST_SESSION"].encode()
            ours = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()
                    and _has(p, b"RUBBERBAND_TEST_SESSION=" + token)]
            Path({str(pids_file)!r}).write_text(" ".join(ours))
            assert ours  # raylet, gcs_server, ... are running now and nobody stops them

        def _has(proc, needle):
            try:
                return needle in (proc / "environ").read_bytes()
            except OSError:
                return False

        @pytest.mark.e2e
        def test_after_it_runs_clean():
            pass
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=240)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("errors") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_leaks_a_ray_node*", "*test_leaks_a_ray_node left behind*process(es), now killed*"]
    )
    assert "test_after_it_runs_clean" not in "".join(l for l in result.stdout.lines if "ERROR" in l)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert pids and not [p for p in pids if _alive(p)]


def test_a_unit_test_that_starts_a_process_or_a_server_fails(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_tiers=textwrap.dedent("""
        import subprocess, sys
        from http.server import HTTPServer, BaseHTTPRequestHandler
        import pytest

        def test_starts_a_process():
            subprocess.run([sys.executable, "-c", "pass"])

        def test_opens_a_server():
            HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler).server_close()

        def test_catching_exception_does_not_hide_it():
            try:
                subprocess.run(["true"])
            except Exception:
                pass

        @pytest.mark.e2e
        def test_marked_may():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_cli(cli):  # a fixture of E2E_FIXTURES marks the test
            pass

        @pytest.fixture
        def cli():
            return None
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rf", timeout=120)
    result.assert_outcomes(failed=3, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_starts_a_process is not marked e2e but started the process*",
            "*test_opens_a_server is not marked e2e but opened the server HTTPServer*",
        ]
    )
    deselected = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-m", "not e2e", timeout=120)
    deselected.assert_outcomes(failed=3, deselected=2)


def test_a_left_server_and_temp_dir_fail_their_test(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_left=textwrap.dedent("""
        import tempfile, threading
        from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
        import pytest

        @pytest.mark.e2e
        def test_leaves_a_server():
            server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
            threading.Thread(target=server.serve_forever, daemon=True).start()

        def test_leaves_a_temp_dir():
            tempfile.mkdtemp(prefix="forgotten-")

        def test_leaves_a_library_cache():  # torch's, created as DDP's constructor imports torch._dynamo
            tempfile.mkdtemp(prefix="torchinductor_")
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=120)
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_leaves_a_server left behind server socket(s), now closed: ThreadingHTTPServer*",
            "*test_leaves_a_temp_dir left behind temp entries in *forgotten-*",
        ]
    )


def test_a_sigterm_to_the_session_still_tears_its_fixtures_down(pytester, tmp_path):
    """A cancelled CI job sends SIGTERM: the session unwinds as on Ctrl-C, so a fixture's teardown (the boot
    tier's machines, a Ray node) still runs; Python's default would end the process on the spot."""
    ready, torn = tmp_path / "ready", tmp_path / "torn-down"
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_waits=textwrap.dedent(f"""
        import time
        from pathlib import Path
        import pytest

        @pytest.fixture
        def machine():
            yield
            Path({str(torn)!r}).write_text("torn down")

        @pytest.mark.e2e
        def test_waits_for_a_sigterm(machine):
            Path({str(ready)!r}).write_text("waiting")
            time.sleep(120)
    """)
    )
    out = tmp_path / "session.out"
    with out.open("w") as sink:
        proc = pytester.popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"], stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ready.exists(), out.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert torn.read_text() == "torn down", out.read_text()[-3000:]
    assert proc.returncode != 0  # interrupted, not passed
