"""The ``rubberband`` CLI as the tests run it when cloud instances' boots are played on this machine.

``python tests/cli_harness.py [--test-boot MODE] COMMAND ...`` runs ``rubberband COMMAND ...`` with the test boot
injected: it calls ``rubberband.cli.run(argv, test_boot=MODE)``, which hands it to the commands as the CLI app's
context object (rubberband/commands/_injected.py); ``run`` passes it on as arguments to the executor's cloud
backend, to head mode's functions and onto the head job's command line (``--test-boot``). No environment
variable is involved: the real ``rubberband`` entry point cannot play a boot. An unknown MODE is the CLI's
one-line input error (exit 2).

Tests use :func:`played_argv` (for a ``subprocess.Popen`` of their own) or ``cli(..., test_boot="local")``
(conftest.run_cli).
"""

from __future__ import annotations

import sys
from pathlib import Path

HARNESS = Path(__file__).resolve()


def played_argv(*args: object, test_boot: str = "local") -> list[str]:
    """The command line of ``rubberband ARGS...`` with instance boots played (``test_boot``)."""
    return [sys.executable, str(HARNESS), "--test-boot", test_boot, *map(str, args)]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    test_boot = None
    if args and args[0].startswith("--test-boot="):
        test_boot = args.pop(0).split("=", 1)[1]
    elif args[:1] == ["--test-boot"]:
        if len(args) < 2:
            print("cli_harness: --test-boot needs a value (local)", file=sys.stderr)
            return 2
        test_boot, args = args[1], args[2:]
    from rubberband.cli import run

    return run(args, test_boot=test_boot)


if __name__ == "__main__":
    # run as a script, this folder is first on sys.path: drop it so that nothing of tests/ shadows what the CLI imports
    if sys.path and Path(sys.path[0] or ".").resolve() == HARNESS.parent:
        sys.path.pop(0)
    sys.exit(main())
