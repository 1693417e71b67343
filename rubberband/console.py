"""Rich consoles shared by the commands: results to stdout, progress and notes to stderr."""

from __future__ import annotations

from rich.console import Console


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=False)


def stderr() -> Console:
    return Console(stderr=True, highlight=False)
