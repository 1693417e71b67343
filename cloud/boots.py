"""Who boots a cloud run's instances: the cloud, from their startup scripts — or, in the test suite, a
:class:`BootPlayer` passed in that plays each boot on this machine.

Production code never makes a player: ``rubberband`` runs with none (the instances boot for real), and the test
suite's entry points (``tests/cli_harness.py``, ``tests/head_job_harness.py``) pass theirs (``tests/played_boots.py``)
into :func:`rubberband.cli.run` / :func:`rubberband.head_job.main`, which hand it on as a value — to the executor's
cloud backend (its workers' boots), to head mode's functions (the head's boot, its token, the way to its job server)
and, through the run job's command line, to the played head's executor. Nothing test-only ships in the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rubberband.catalog import InstanceType
from rubberband.cloud.bootstrap import WatchdogSettings
from rubberband.cloud.provider import Instance, InstanceRequest


class StandInNodes(Protocol):
    """Where played workers run: this machine's Ray nodes of the run (the local provider of its head)."""

    def start_node(self, instance_id: str, request: InstanceRequest, *, timeout_s: float = 120.0) -> Any:
        """Start one Ray node under ``instance_id`` that joins the run's head."""
        ...


class BootPlayer(Protocol):
    """Plays what an instance's startup script would do, on this machine (local Ray nodes and processes)."""

    def join(self, instance: Instance, itype: InstanceType, local: StandInNodes, timeout_s: float) -> None:
        """A worker instance the cloud reports running: play its user-data — a Ray node of ``local`` under the
        instance's id that offers its ``rb-node-<id>`` resource and joins the run's head."""
        ...

    def play_head(self, cloud: str, region: str, run_id: str, instance_id: str, settings: WatchdogSettings) -> None:
        """A head instance just provisioned: play its boot (a local Ray head with its job server), returning at
        once; it ends itself once the cloud no longer reports the instance running."""
        ...

    def deliver_token(self, instance_id: str, token: str) -> None:
        """What the CLI's SSH delivery does for a real head: the run's Ray token onto the played head."""
        ...

    def head_url(self, instance_id: str) -> str:
        """The played head's job server URL, once it is up (CloudError when its boot failed)."""
        ...

    def wait_head_gone(self, instance_id: str) -> bool:
        """Wait until the played head has stopped all it ran (its instance ended)."""
        ...

    def head_disk(self, instance_id: str) -> Path:
        """The played head's "disk": where its run directories and node records live."""
        ...

    def head_job_command(self) -> list[str]:
        """The command that runs ``rubberband.head_job`` on the played head with this player passed in."""
        ...
