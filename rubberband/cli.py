"""The ``rubberband`` command line.

Each command lives in its own module under ``rubberband.commands`` and registers itself
through ``register(app)``; this module only assembles them and turns errors into
one-line messages and exit codes (2 bad input, 3 infeasible, 1 execution failure).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path
from typing import Any

import typer

try:  # typer ≥ 0.20 vendors click as typer._click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

from rubberband import __version__, commands
from rubberband.commands._injected import inject
from rubberband.errors import RubberbandError


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="rubberband",
        help="Cheapest elastic hyperparameter tuning that still meets your deadline.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )

    @app.callback(invoke_without_command=True)
    def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
        if version:
            typer.echo(f"rubberband {__version__}")
            raise typer.Exit(0)

    modules = [
        importlib.import_module(f"{commands.__name__}.{info.name}")
        for info in pkgutil.iter_modules(commands.__path__)
        if not info.name.startswith("_")
    ]
    for module in sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__)):
        module.register(app)
    return app


def _fail(message: str, code: int) -> int:
    message = " ".join(str(message).split())
    print(f"rubberband: error: {message}", file=sys.stderr)
    return code


def run(
    argv: list[str] | None = None, *, commanded_at: float | None = None, fork_workers: bool = False, **seams: Any
) -> int:
    """Run the CLI and return its exit code (for tests and ``main``).

    The test ``seams`` (tests only; ``main`` never passes them; :func:`~rubberband.commands._injected.inject`
    checks them): ``boots`` plays cloud instances' boots on this
    machine (a :class:`~rubberband.cloud.boots.BootPlayer`: the suite's ``tests/played_boots.py``), ``trial_runtime`` names the module trials run through instead of
    ``rubberband.executor.trials``, ``metadata_url`` the metadata server the spot-notice watchers read instead of the
    cloud's (executor/notices.py). The commands get them from the app's context object (commands/_injected.py).
    ``commanded_at``: when the user's command began (``main``: the process's start; else now): a run reports how
    much of the user's wait went before its executor started. ``fork_workers`` (``main``: the process is the CLI's
    own): planning may fork a worker process for the ASHA baseline (rubberband/forked.py)."""
    commanded_at = time.time() if commanded_at is None else commanded_at
    app = build_app()
    try:
        settings = inject(commanded_at=commanded_at, fork_workers=fork_workers, **seams)
        result = app(args=argv, prog_name="rubberband", standalone_mode=False, obj=settings)
    except RubberbandError as exc:
        return _fail(exc.message, exc.exit_code)
    except (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError, FileNotFoundError) as exc:
        if exc.filename is None:
            raise
        # a path the user gave that cannot be read or written (the commands check what they can up front)
        return _fail(f"{exc.filename}: {exc.strerror or exc}; check the path and its permissions", 2)
    except click_exceptions.NoArgsIsHelpError:
        return 2  # the help text was already printed
    except click_exceptions.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        return _fail(f"{exc.format_message()}{hint}", 2)
    except click_exceptions.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return _fail("interrupted", 130)
    return result if isinstance(result, int) else 0


def process_started_at() -> float | None:
    """When this process began (POSIX seconds; Linux ``/proc``), so that the interpreter's own start counts; None
    where that cannot be read."""
    try:  # field 22 of /proc/self/stat: the start in clock ticks after boot; CLOCK_BOOTTIME: now after boot
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - max(0.0, age_s)


def main() -> None:
    sys.exit(run(commanded_at=process_started_at(), fork_workers=True))
