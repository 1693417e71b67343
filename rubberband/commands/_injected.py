"""What the program running the CLI passes in beside the command line (never read from the environment).

``rubberband`` (``rubberband.cli.main``) passes nothing. The test suite runs the CLI through its own entry
point (``tests/cli_harness.py``), which calls ``rubberband.cli.run(argv, test_boot="local")``: the CLI app
gets an :class:`Injected` as its context object and the commands that need it (``run``) read it with
:func:`injected` and hand it on as plain arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import typer


@dataclass(frozen=True)
class Injected:
    """``test_boot``: a test boot mode (cloud/testboot.py: instance boots played by local Ray nodes), or None."""

    test_boot: str | None = None


def injected(ctx: typer.Context | None) -> Injected:
    """The values the CLI's caller injected (defaults when it injected none)."""
    found = ctx.find_object(Injected) if ctx is not None else None
    return found if found is not None else Injected()
