"""The ``rubberband`` CLI as the tests run it, with the test seams passed in.

``python tests/cli_harness.py [--test-boot MODE] [--trial-runtime MODULE] [--metadata-url URL] COMMAND ...`` runs
``rubberband COMMAND ...`` with those injected: it calls ``rubberband.cli.run(argv, boots=PlayedBoots(),
trial_runtime=MODULE, metadata_url=URL)``, which hands them to the commands as the CLI app's context object
(rubberband/commands/_injected.py); ``run`` passes them on as arguments:

* ``--test-boot local``: cloud instances' boots played on this machine (``played_boots.PlayedBoots``, passed to the
  CLI as its ``boots``) — to the executor's cloud backend, to head mode's functions and, through the head job's
  command (``head_job_harness.py``), to the played head's executor;
* ``--trial-runtime MODULE``: trials run through MODULE instead of ``rubberband.executor.trials`` (its ``TrialSpec``
  and ``TrialRun``; executor/runtime.py) — to the executor, and onto the head job's command line;
* ``--metadata-url URL``: the spot-notice watchers read this metadata server instead of the cloud's (``{instance}``
  in it stands for the instance id; executor/notices.py) — to the executor's cloud backend (its ``metadata_url``)
  and onto the head job's command line (``--metadata-url``).

No environment variable is involved: the real ``rubberband`` entry point has none of these. A malformed value is
the CLI's one-line input error (exit 2).

Tests use :func:`played_argv` / :func:`harness_argv` (for a ``subprocess.Popen`` of their own) or
``cli(..., test_boot="local", metadata_url=...)`` (conftest.run_cli).
"""

from __future__ import annotations

import sys
from pathlib import Path

HARNESS = Path(__file__).resolve()
#: The harness's own options (before COMMAND) → ``rubberband.cli.run``'s keyword.
OPTIONS = {"--test-boot": "test_boot", "--trial-runtime": "trial_runtime", "--metadata-url": "metadata_url"}


def harness_argv(
    *args: object, test_boot: str | None = None, trial_runtime: str | None = None, metadata_url: str | None = None
) -> list[str]:
    """The command line of ``rubberband ARGS...`` with the given test seams injected (None: not injected)."""
    seams = {"--test-boot": test_boot, "--trial-runtime": trial_runtime, "--metadata-url": metadata_url}
    words = [word for flag, value in seams.items() if value is not None for word in (flag, value)]
    return [sys.executable, str(HARNESS), *words, *map(str, args)]


def played_argv(
    *args: object, test_boot: str = "local", trial_runtime: str | None = None, metadata_url: str | None = None
) -> list[str]:
    """The command line of ``rubberband ARGS...`` with instance boots played (``test_boot``) and, if given, the
    other seams."""
    return harness_argv(*args, test_boot=test_boot, trial_runtime=trial_runtime, metadata_url=metadata_url)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seams: dict[str, str] = {}
    while args and args[0].split("=", 1)[0] in OPTIONS:
        flag = args.pop(0)
        if "=" in flag:
            flag, value = flag.split("=", 1)
        elif args:
            value = args.pop(0)
        else:
            print(f"cli_harness: {flag} needs a value", file=sys.stderr)
            return 2
        seams[OPTIONS[flag]] = value
    from rubberband.cli import run

    boots = seams.pop("test_boot", None)
    if boots not in (None, "local"):
        print(f"cli_harness: --test-boot {boots!r}: the one played boot is 'local'", file=sys.stderr)
        return 2
    if boots == "local":
        sys.path.append(str(HARNESS.parent))  # last: nothing of tests/ shadows what the CLI imports
        from played_boots import PlayedBoots

        return run(args, boots=PlayedBoots(), **seams)
    return run(args, **seams)


if __name__ == "__main__":
    # run as a script, this folder is first on sys.path: drop it so that nothing of tests/ shadows what the CLI imports
    if sys.path and Path(sys.path[0] or ".").resolve() == HARNESS.parent:
        sys.path.pop(0)
    sys.exit(main())
