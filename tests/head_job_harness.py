"""The played head's run job: ``python tests/head_job_harness.py run ...`` is ``python -m rubberband.head_job run ...``
with the suite's :class:`~played_boots.PlayedBoots` passed in (its workers' boots are played too). The CLI puts this
command on the job's command line when it was given that player (``PlayedBoots.head_job_command``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()

if __name__ == "__main__":
    # this folder goes last on sys.path: nothing of tests/ may shadow the rubberband the job ships
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE.parent:
        sys.path.append(sys.path.pop(0))
    from played_boots import PlayedBoots

    from rubberband.head_job import main

    sys.exit(main(sys.argv[1:], boots=PlayedBoots()))
