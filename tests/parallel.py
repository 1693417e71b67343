"""Running the suite on several pytest-xdist workers (pyproject's addopts: ``-n auto --dist loadgroup``).

**How many.** Most end-to-end tests spend their time waiting (Ray nodes starting, trials sleeping through their
epochs, instances booting in the fakes), so a run that includes them gets two workers per core (four on two
cores), which keep the machine busy without slowing each other much. The unit tier (``-m "not e2e"``) only
computes: it gets one worker per core, since every extra worker costs a whole collection of the suite (about
13 CPU-seconds) and buys nothing (:func:`worker_count`; ``-n N`` on the command line still wins).

Three things make the parallel run safe and quick; all are loaded by ``conftest.py``:

- **Order.** The end-to-end tests go first, the slowest modules first, and the unit tests last, so the
  workers finish together: the last tests to be handed out are the short ones.
- **Groups.** A module whose tests share one expensive module-scoped fixture (one finished run, one Ray
  cluster) marks itself ``pytest.mark.xdist_group(...)``: its tests run on one worker, and the fixture once.
- **Exclusive tests.** A test that must run with nothing beside it is marked ``exclusive``: it runs alone.
  Every test holds a lock file shared; an exclusive test holds it exclusively, from its setup through its
  teardown, and keeps it through the exclusive tests that follow it on its worker. A turnstile keeps a
  waiting exclusive test from being starved by the others' shared holds. Tests that check a run against its
  deadline are written to hold on a loaded machine instead (they accept any outcome a user can meet, or wait
  for the run's time to pass), so that only the trial-runtime modules (tests/test_trials_gpu.py) are exclusive.

``-n 0`` runs everything in this process, one test at a time (the lock is then uncontended).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_ENV = "RUBBERBAND_TEST_LOCK"

#: Modules slowest first (their total time on 2 cores, most first); the rest of the e2e tests follow in
#: collection order. A hint for the order only: a module missing here costs balance, never correctness.
SLOW_MODULES = (
    "test_readme_commands",
    "test_profiler_cli",
    "test_profiler_tune_start",
    "test_executor_e2e",
    "test_spot_e2e",
    "test_executor_teardown",
    "test_executor_brackets",
    "test_cloud_headmode",
    "test_cloud_cli",
    "test_profiler_gpu",
    "test_brackets_spot",
    "test_brackets_replan",
    "test_cloud_gcp_failover",
    "test_executor_gpu",
    "test_executor_spot",
    "test_cloud_ray_token",
    "test_executor_lateness",
    "test_raytune_adapter",
    "test_search",
    "test_executor_provider",
    "test_trials_runtime",
)
_RANK = {name: rank for rank, name in enumerate(SLOW_MODULES)}

#: At most this many workers, whatever the machine: each one collects the whole suite and holds its imports.
MAX_WORKERS = 8


def worker_count(markexpr: str, cores: int) -> int:
    """The workers ``-n auto`` starts: one per core for the unit tier (a marker expression that deselects the
    e2e tests), two per core otherwise (the e2e tests mostly wait); at least one, at most :data:`MAX_WORKERS`."""
    unit_tier_only = "not e2e" in " ".join(markexpr.split())
    return max(1, min(MAX_WORKERS, cores if unit_tier_only else 2 * cores))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """pytest-xdist's hook for ``-n auto``: :func:`worker_count` for this run's ``-m`` and this machine's cores."""
    return worker_count(config.option.markexpr or "", len(os.sched_getaffinity(0)))


def configure(config: pytest.Config) -> None:
    """In the controlling process (or a plain run): the lock file every worker shares, named in the
    environment the workers inherit."""
    if hasattr(config, "workerinput") or os.environ.get(LOCK_ENV):
        return
    root = Path(config._rb_guard_root)  # the leak guard's temp root: removed at the end of the session
    os.environ[LOCK_ENV] = str(root / "exclusive.lock")
    config._rb_lock_owner = True


def unconfigure(config: pytest.Config) -> None:
    if getattr(config, "_rb_lock_owner", False):
        os.environ.pop(LOCK_ENV, None)


def _exclusive(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


def order(items: list[pytest.Item]) -> None:
    """Exclusive tests, then the other e2e tests (slow modules first), then the unit tests; stable."""

    def key(item: pytest.Item) -> tuple[int, int]:
        if _exclusive(item):
            return (0, 0)
        if item.get_closest_marker("e2e"):
            return (1, _RANK.get(item.module.__name__ if item.module else "", len(_RANK)))
        return (2, 0)

    items.sort(key=key)


@contextlib.contextmanager
def _held(path: Path, *, exclusive: bool) -> Iterator[None]:
    turnstile = path.with_suffix(".turnstile")
    with open(turnstile, "a") as gate, open(path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            # an exclusive test keeps the gate closed while it waits: no new shared holder gets past it
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_EXCLUSIVE_HOLD = pytest.StashKey[contextlib.ExitStack]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A shared hold for each test; an exclusive hold kept from an exclusive test through the next ones on this
    worker while they are exclusive too (a module of them, sharing one Ray cluster), so the worker does not hand
    the lock back and wait for the other workers' running tests between each two of them."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    if not _exclusive(item):
        with _held(Path(path), exclusive=False):
            yield
        return
    hold = item.config.stash.get(_EXCLUSIVE_HOLD, None)
    if hold is None:
        hold = contextlib.ExitStack()
        hold.enter_context(_held(Path(path), exclusive=True))
        item.config.stash[_EXCLUSIVE_HOLD] = hold
    try:
        yield
    finally:
        if not _exclusive(nextitem):
            del item.config.stash[_EXCLUSIVE_HOLD]
            hold.close()
