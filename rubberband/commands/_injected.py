"""What the program running the CLI passes in beside the command line (never read from the environment).

``rubberband`` (``rubberband.cli.main``) passes when the command began and that the process is its own (it may
fork a worker: ``fork_workers``). The test suite runs the CLI through its own entry
point (``tests/cli_harness.py``), which calls ``rubberband.cli.run(argv, boots=PlayedBoots(), ...)``: the CLI app
gets an :class:`Injected` as its context object (made by :func:`inject`, which checks the values) and the commands
that need it (``run``) read it with :func:`injected` and hand it on as plain arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import typer

from rubberband.cloud.boots import BootPlayer


@dataclass(frozen=True)
class Injected:
    """The test seams, each None (the real thing) unless the CLI's caller passed it in.

    ``boots``: who plays cloud instances' boots on this machine (cloud/boots.py; the suite's ``PlayedBoots``).
    ``trial_runtime``: the module trials run through instead of ``rubberband.executor.trials`` (executor/runtime.py).
    ``metadata_url``: the metadata server's base URL the spot-notice watchers read instead of the cloud's
    (executor/notices.py; ``{instance}`` in it: the instance id).
    """

    boots: BootPlayer | None = None
    trial_runtime: str | None = None
    metadata_url: str | None = None
    #: when the command began (POSIX seconds; ``rubberband.cli.run`` sets it): a run reports what went before its start
    commanded_at: float | None = None
    #: the process is the CLI's own (``main``), so planning may fork a worker for the ASHA baseline
    #: (rubberband/forked.py); a caller running the CLI inside its own process (the tests) keeps it in-process
    fork_workers: bool = False


def inject(
    *,
    boots: BootPlayer | None = None,
    trial_runtime: str | None = None,
    metadata_url: str | None = None,
    commanded_at: float | None = None,
    fork_workers: bool = False,
) -> Injected:
    """The values passed in, checked: InputError (the CLI's one-line error, exit 2) for a malformed one."""
    if trial_runtime is not None:
        from rubberband.executor.runtime import check_module_name

        trial_runtime = check_module_name(trial_runtime)
    if metadata_url is not None:
        from rubberband.executor.notices import check_metadata_url

        metadata_url = check_metadata_url(metadata_url)
    return Injected(
        boots=boots,
        trial_runtime=trial_runtime,
        metadata_url=metadata_url,
        commanded_at=commanded_at,
        fork_workers=fork_workers,
    )


def injected(ctx: typer.Context | None) -> Injected:
    """The values the CLI's caller injected (defaults when it injected none)."""
    found = ctx.find_object(Injected) if ctx is not None else None
    return found if found is not None else Injected()
