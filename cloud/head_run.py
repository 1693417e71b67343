"""The head's run directory and how the CLI reads it back; the executor's backend on the head.

Shared by both sides of head mode without either importing the other: the job on the head
(:mod:`rubberband.head_job`, which runs the executor) and the CLI (:mod:`rubberband.cloud.head_session`,
which submits that job and unpacks what it prints).

* :data:`STAGE_DIR`: where the job's working directory carries the run's spec, plan and profile.
* the run's directory on the head is :func:`rubberband.cloud.bootstrap.head_run_dir` (what the watchdog watches).
* :data:`PACK_BEGIN` … :data:`PACK_END`: the run directory as the job prints it into its log
  (:func:`rubberband.head_job.pack`); :class:`LogFilter` and :func:`unpack` take it back out.
* :class:`OnHeadCloudBackend`: the executor's backend when it runs on the head instance.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from rubberband.cloud.backend import BilledHead, HeadHandle
from rubberband.cloud.bootstrap import RAY_PORT, cloud_run_id
from rubberband.cloud.local_head import LocalHeadCloudBackend
from rubberband.cloud.provider import Instance
from rubberband.clouds import cloud as cloud_descriptor
from rubberband.catalog import head_types
from rubberband.files import write_text_atomic

STAGE_DIR = "_rubberband"  # inside the job's working directory: spec.json, plan.json, profile.json
PACK_BEGIN = "-----BEGIN RUBBERBAND RUN DIRECTORY-----"
PACK_END = "-----END RUBBERBAND RUN DIRECTORY-----"
#: What a fetch leaves on the head: model checkpoints (large), Ray's temp files, local node records.
PACK_EXCLUDE = ("checkpoints", "ray", "instances")
#: The best trial's newest checkpoint comes back with the run directory up to this size; a larger one stays
#: on the head (and goes with it): copy it off before the results grace ends.
MAX_FETCHED_CHECKPOINT_BYTES = 32 * 1024**2


@dataclass
class OnHeadCloudBackend(LocalHeadCloudBackend):
    """The executor's backend on the head instance: this machine's Ray head is already running.

    Workers are provisioned exactly as with the CLI machine as head (``LocalHeadCloudBackend``:
    failover, worker startup script joining ``head_instance``'s private address, the run's tags,
    test boots). ``start_head`` says where Ray listens and which instance the run pays for as its
    head (billed until ``head_grace_s``, the watchdog's results grace, after the run ends);
    ``stop_head`` leaves the head to its watchdog (results must still be fetched) and stops
    test-boot stand-ins of workers.
    """

    head_instance: Instance | None = None
    ray_address: str = ""
    head_grace_s: float = 0.0
    _run_id: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_instance is None:
            raise ValueError("OnHeadCloudBackend needs the head instance")
        self.workers.head = self.head_instance

    @property
    def _head(self) -> Instance:
        """The head instance (never None after construction)."""
        if self.head_instance is None:
            raise ValueError("OnHeadCloudBackend needs the head instance")
        return self.head_instance

    def start_head(self, run_id: str) -> HeadHandle:
        self._run_id = cloud_run_id(run_id)
        self.workers.head = dataclasses.replace(self._head, run_id=self._run_id)
        self.start_heartbeat()
        return HeadHandle(
            address=self.ray_address or f"{self._head.address}:{RAY_PORT}", id=self._head.id, billed=self.billed_head()
        )

    def billed_head(self) -> BilledHead:
        """This head as the run pays for it: its type's on-demand price from its launch (else from now)."""
        import time

        head = self._head
        itype = head_types().get(self.cloud)
        if itype is not None and itype.name == head.instance_type:
            price = itype.price_hr
        else:  # a head of another shape: the catalog's price, else the default head's
            try:
                price = self.types.find(head.instance_type, cloud=self.cloud).price_hr
            except Exception:  # noqa: BLE001 - unknown type: bill it like the default head
                price = itype.price_hr if itype is not None else 0.0
        launched = head.launched_at if head.launched_at is not None else time.time()
        return BilledHead(
            id=head.id,
            instance_type=head.instance_type,
            cloud=self.cloud,
            price_hr=price,
            launched_at=launched,
            grace_s=self.head_grace_s,
        )

    def stop_head(self) -> bool:
        self.stop_heartbeat()
        self._stop_stand_ins()
        return False

    def heartbeat_targets(self) -> list[tuple[object, list[str]]]:
        """The run's heartbeat goes on this head instance (one call a beat; the head's role may re-tag it)."""

        head = self.workers.head
        return [(self.pool(self.cloud, cloud_descriptor(head.cloud).region_of(head.zone)), [head.id])]

    def runtime_env(self, code_dir: str) -> dict | None:
        """None: the executor runs inside the CLI's Ray job, whose runtime_env (rubberband, code) its driver inherits."""
        return None


def localise_best_checkpoint(run_dir: Path) -> None:
    """Point ``result.json``'s best checkpoint at the fetched copy under ``run_dir`` (it named the head's path)."""
    path = run_dir / "result.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    best = result.get("best") or {}
    remote = best.get("checkpoint")
    if not remote or not isinstance(best.get("trial_id"), str):
        return
    local = run_dir / "checkpoints" / best["trial_id"] / Path(remote).name
    if local.is_file():
        best["checkpoint"] = str(local.resolve())
        write_text_atomic(path, json.dumps(result, indent=2))


class LogFilter:
    """Splits a job's log as it streams: what to show, and a packed run directory (kept, not shown)."""

    def __init__(self) -> None:
        self._partial = ""
        self._inside = False
        self._pack: list[str] = []
        self.packed: str | None = None  # the last complete pack seen, markers included

    def feed(self, chunk: str) -> str:
        text, shown = self._partial + chunk, []
        *lines, self._partial = text.split("\n")
        for line in lines:
            if line.strip() == PACK_BEGIN:
                self._inside, self._pack = True, [line]
            elif self._inside:
                self._pack.append(line)
                if line.strip() == PACK_END:
                    self._inside, self.packed = False, "\n".join(self._pack)
            else:
                shown.append(line + "\n")
        return "".join(shown)


def unpack(logs: str, into: Path) -> list[str]:
    """Extract what :func:`pack` printed (found in a job's ``logs``) into ``into``; returns the names."""
    from rubberband.errors import CloudError

    start, end = logs.rfind(PACK_BEGIN), logs.rfind(PACK_END)
    if start < 0 or end < start:
        raise CloudError("the head sent no run directory (see the fetch job's logs on the head)", kind="transient")
    payload = "".join(logs[start + len(PACK_BEGIN) : end].split())
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(payload)), mode="r:gz") as tar:
        tar.extractall(into, filter="data")  # no absolute paths, links out or devices
        names = tar.getnames()
    localise_best_checkpoint(into)
    return names
