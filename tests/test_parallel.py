"""The lock that lets an ``exclusive`` test run alone beside the other xdist workers (tests/parallel.py).

flock locks belong to an open file description, so two opens in one process conflict as two processes'
would: threads stand in for the workers here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from parallel import LOCK_ENV, MAX_WORKERS, _held, order, pytest_runtest_protocol, worker_count

pytest_plugins = ["pytester"]


def _hold(path, exclusive: bool, log: list[str], name: str, release: threading.Event) -> None:
    with _held(path, exclusive=exclusive):
        log.append(f"{name} in")
        release.wait(10)
        log.append(f"{name} out")


def test_an_exclusive_holder_waits_for_the_shared_ones_and_shuts_out_later_ones(tmp_path):
    path = tmp_path / "exclusive.lock"
    log: list[str] = []
    first, writer, late = threading.Event(), threading.Event(), threading.Event()
    a = threading.Thread(target=_hold, args=(path, False, log, "a", first))
    a.start()
    while log != ["a in"]:
        time.sleep(0.01)
    w = threading.Thread(target=_hold, args=(path, True, log, "w", writer))
    w.start()
    time.sleep(0.3)  # w waits behind a's shared hold, with the turnstile closed
    b = threading.Thread(target=_hold, args=(path, False, log, "b", late))
    b.start()
    time.sleep(0.3)
    assert log == ["a in"]  # neither w nor the later shared holder b got in
    first.set()
    while "w in" not in log:
        time.sleep(0.01)
    time.sleep(0.3)
    assert log == ["a in", "a out", "w in"]  # b is still kept out: w runs alone
    writer.set()
    late.set()
    for thread in (a, w, b):
        thread.join(10)
    assert log == ["a in", "a out", "w in", "w out", "b in", "b out"]


def test_shared_holders_run_side_by_side(tmp_path):
    path = tmp_path / "exclusive.lock"
    log: list[str] = []
    release = threading.Event()
    threads = [threading.Thread(target=_hold, args=(path, False, log, n, release)) for n in "xyz"]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(log) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(log) == ["x in", "y in", "z in"]
    release.set()
    for thread in threads:
        thread.join(10)


class _Item:
    def __init__(self, module: str, *marks: str, config=None) -> None:
        self.module = types.SimpleNamespace(__name__=module)
        self.marks = marks
        self.config = config

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_exclusive_first_then_slow_e2e_modules_then_the_rest_then_unit():
    items = [
        _Item("test_spec"),
        _Item("test_other_e2e", "e2e"),
        _Item("test_profiler_cli", "e2e"),
        _Item("test_readme_commands", "e2e", "exclusive"),
        _Item("test_readme_commands", "e2e"),
    ]
    order(items)  # type: ignore[arg-type]
    assert [(i.module.__name__, i.marks) for i in items] == [
        ("test_readme_commands", ("e2e", "exclusive")),
        ("test_readme_commands", ("e2e",)),
        ("test_profiler_cli", ("e2e",)),
        ("test_other_e2e", ("e2e",)),
        ("test_spec", ()),
    ]


@pytest.mark.e2e  # a pytest session on two xdist workers, in a subprocess
@pytest.mark.parametrize(
    ("markexpr", "cores", "workers"),
    [
        ("not boot", 2, 4),  # the whole suite (pyproject's default -m): two per core, the e2e tests mostly wait
        ("e2e", 2, 4),
        ("not e2e", 2, 2),  # the unit tier only computes: one per core
        ("not  e2e and not boot", 2, 2),
        ("not e2e", 1, 1),
        ("", 1, 2),
        ("not boot", 64, MAX_WORKERS),  # each worker collects the whole suite: a few are enough
    ],
)
def test_auto_starts_two_workers_per_core_with_the_e2e_tests_and_one_per_core_without(markexpr, cores, workers):
    assert worker_count(markexpr, cores) == workers


def test_a_group_runs_on_one_worker_and_sets_its_module_fixture_up_once(pytester, monkeypatch):
    """``--dist loadgroup`` as pyproject's addopts give it: the tests of an ``xdist_group`` module go to one worker,
    so the module's expensive fixture (one finished run, one Ray cluster) is made once. pytest 9.2 silently broke
    this with pytest-xdist 3.8 (the group's suffix on the node id was ignored: every worker made the fixture)."""
    pytester.makepyfile(
        test_grouped=textwrap.dedent("""
        import os
        import pytest

        pytestmark = pytest.mark.xdist_group("one_cluster")

        @pytest.fixture(scope="module")
        def cluster():
            with open(os.environ["SETUPS"], "a") as out:
                out.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

        @pytest.mark.parametrize("n", range(8))
        def test_uses_the_cluster(cluster, n):
            pass
        """),
        test_other=textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("n", range(8))
        def test_other(n):
            pass
        """),
    )
    setups = pytester.path / "setups"
    monkeypatch.setenv("SETUPS", str(setups))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "loadgroup", "-q")
    result.assert_outcomes(passed=16)
    assert len(setups.read_text().split()) == 1, setups.read_text()


def _run(item, nextitem) -> None:
    """The hook around one test, as pytest drives a hookwrapper: up to the test, then the rest."""
    hook = pytest_runtest_protocol(item, nextitem)
    next(hook)
    try:
        next(hook)
    except StopIteration:
        pass


def test_an_exclusive_hold_is_kept_through_the_next_exclusive_tests_of_the_worker(tmp_path, monkeypatch):
    """Between two exclusive tests of one worker (one module sharing a Ray cluster) no shared holder gets in: the
    worker keeps the lock instead of waiting for the other workers' running tests again; after the last it is free."""
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "exclusive.lock"))
    config = types.SimpleNamespace(stash=pytest.Stash())
    first, second = (_Item("test_trials_runtime", "e2e", "exclusive", config=config) for _ in range(2))
    _run(first, second)
    log: list[str] = []
    release = threading.Event()
    shared = threading.Thread(target=_hold, args=(tmp_path / "exclusive.lock", False, log, "other", release))
    shared.start()
    time.sleep(0.3)
    assert log == []  # still held between the two exclusive tests
    _run(second, _Item("test_spec", config=config))
    deadline = time.monotonic() + 10
    while not log and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log == ["other in"]  # released after the last of them
    release.set()
    shared.join(10)


@pytest.mark.e2e  # starts Python processes
def test_a_suite_started_with_sigint_ignored_still_gives_its_children_a_ctrl_c():
    """conftest.take_sigint: a suite launched in the background of a non-interactive shell (SIGINT ignored, and
    inherited) still starts processes that a test's SIGINT interrupts, as a user's Ctrl-C would."""
    child = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    probe = (
        "import subprocess, sys\n"
        "from conftest import take_sigint\n"
        "TAKE\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout.strip())\n"
    )

    def launched_in_the_background(code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=Path(__file__).parent,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert launched_in_the_background(probe.replace("TAKE", "pass")) == "False"  # what the children inherit
    assert launched_in_the_background(probe.replace("TAKE", "take_sigint()")) == "True"
