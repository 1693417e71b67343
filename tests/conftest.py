"""Shared test fixtures."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

import leak_guard
import parallel

# Tiers (the e2e marker, checked) and the leak guard: see leak_guard.py. Parallel workers: see parallel.py.
from leak_guard import _module_leak_guard, _session_leak_guard, _test_leak_guard  # noqa: F401
from parallel import pytest_runtest_protocol, pytest_xdist_auto_num_workers  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def pytest_configure(config: pytest.Config) -> None:
    take_sigint()
    leak_guard.pytest_configure(config)
    parallel.configure(config)


def take_sigint() -> None:
    """Undo an ignored SIGINT, so that the processes the tests start take a Ctrl-C as a user's would.

    A command started in the background of a non-interactive shell (``cmd &`` in a script) has SIGINT set to
    ignored, every process it starts inherits that, and Python then installs no KeyboardInterrupt. The tests that
    send SIGINT (Ctrl-C detaches a head-mode run; ``run_cli``'s timeout) would all see it ignored. A Python handler
    is not inherited: the children start with SIGINT's default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    parallel.unconfigure(config)
    leak_guard.pytest_unconfigure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    leak_guard.pytest_collection_modifyitems(config, items)  # marks e2e first: the order reads it
    parallel.order(items)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300, **seams: str | None
) -> subprocess.CompletedProcess:
    """Run the real ``rubberband`` CLI in a subprocess, as a user would.

    ``seams``, the test seams of :func:`cli_harness.harness_argv` (``test_boot="local"``,
    ``trial_runtime=MODULE``, ``metadata_url=URL``; None: not injected): through the test entry point
    (cli_harness.py), which injects them into the CLI (played instance boots, tests/played_boots.py; a stand-in trial
    runtime; a local metadata server serving spot notices).

    Past ``timeout`` it gets what a user's Ctrl-C sends (SIGINT: the CLI tears its run down, releasing its
    instances and Ray nodes), then SIGKILL after a grace; the test fails with :class:`subprocess.TimeoutExpired`
    carrying what it printed.
    """
    if all(value is None for value in seams.values()):
        argv = [sys.executable, "-m", "rubberband", *map(str, args)]
    else:
        from cli_harness import harness_argv

        argv = harness_argv(*args, **seams)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def cli():
    return run_cli


def run_cli_here(
    *args: object, cwd: Path | None = None, env: dict | None = None, entry: Callable[[list[str]], int] | None = None
) -> subprocess.CompletedProcess:
    """Run a ``rubberband`` command in this process: what :func:`run_cli` checks, without a Python to start.

    It calls ``rubberband.cli.run`` — all that the entry point ``main`` does but ``sys.exit`` — with the command's
    output captured, ``env`` as the whole environment and ``cwd`` as the working directory for the call, and
    returns what :func:`run_cli` returns. An exception that escapes the CLI is printed to stderr with exit code 1,
    as Python does at the top of a real process. A subprocess costs a second or two of CPU (the interpreter and
    its imports) per call; this costs the command's own work.

    For the commands that start nothing and install no signal handler (``plan``, ``report``, ``schedule``,
    ``simulate``, ``spot``, ``catalog``, and ``run`` where it refuses its input or runs on simulated time:
    test_bad_input.invoke). Runs that start Ray, ``profile`` and ``down`` stay in subprocesses (:func:`run_cli`),
    as do the tests of the entry point itself (test_bad_input_e2e.py, test_readme_commands.py) and one test of
    each command family that runs here otherwise (``schedule``, ``spot``; ``plan``, ``report`` and ``catalog`` have
    theirs in other modules).

    ``entry``: what stands for the entry point, ``rubberband.cli.run`` by default (the tests' own entry point,
    ``cli_harness.main``, for the test seams)."""
    from rubberband.cli import run

    entry = entry or run
    argv = [str(arg) for arg in args]
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(), out, err
        try:
            code = entry(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - what the interpreter would print, and its exit code
            traceback.print_exc(file=err)
            code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
    return subprocess.CompletedProcess(["rubberband", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli_here():
    """:func:`run_cli_here`: a ``rubberband`` command that starts nothing, run in this process."""
    return run_cli_here


@contextlib.contextmanager
def examples_on_path():
    """The examples folder first on ``sys.path`` for the block (its modules import as the examples' specs name them)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.fixture
def synthetic():
    """The example workload module (examples/synthetic.py), imported from the examples folder."""
    with examples_on_path():
        yield importlib.import_module("synthetic")
