"""What runs ON the run's head instance: the executor, and the packing of its run directory.

The CLI (:mod:`rubberband.cloud.head_session`) submits both as Ray jobs to the head's job server:

* ``python -m rubberband.cloud.head_job run --cloud C --region R --head-id I --run-id X`` — the
  job's working directory is the user's training code with the run's spec, plan and profile under
  ``_rubberband/`` (:data:`STAGE_DIR`). It runs the executor with an :class:`OnHeadCloudBackend`
  (workers join this head; failover as anywhere), in ``$RUBBERBAND_RUN_ROOT/<cloud run id>``
  (default ``/var/lib/rubberband/runs``, the directory the head's watchdog watches), and writes
  the ``DONE`` marker when the executor is over, however it ended: the watchdog then ends the head
  and any worker after its grace.
* ``python -m rubberband.cloud.head_job pack --run-id X`` — prints the run directory (journal,
  result.json, plan.json, logs and the best trial's newest checkpoint when small; no other checkpoint and
  no Ray temp files) as one base64 tar.gz between
  :data:`PACK_BEGIN` and :data:`PACK_END`, which the CLI reads back with ``get_job_logs``.

Neither takes a credential: the head's cloud access comes from its instance role / service account.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import os
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from rubberband.cloud.backend import BilledHead, HeadHandle
from rubberband.cloud.bootstrap import RAY_PORT, RUN_ROOT, RUN_ROOT_ENV, WatchdogSettings, cloud_run_id
from rubberband.cloud.head import add_head_arguments
from rubberband.cloud.local_head import LocalHeadCloudBackend
from rubberband.cloud.provider import Instance
from rubberband.files import write_text_atomic

STAGE_DIR = "_rubberband"  # inside the job's working directory: spec.json, plan.json, profile.json
PACK_BEGIN = "-----BEGIN RUBBERBAND RUN DIRECTORY-----"
PACK_END = "-----END RUBBERBAND RUN DIRECTORY-----"
#: What a fetch leaves on the head: model checkpoints (large), Ray's temp files, local node records.
PACK_EXCLUDE = ("checkpoints", "ray", "instances")
#: The best trial's newest checkpoint comes back with the run directory up to this size; a larger one stays
#: on the head (and goes with it): copy it off before the results grace ends.
MAX_FETCHED_CHECKPOINT_BYTES = 32 * 1024 ** 2


def run_root() -> Path:
    """Where the head keeps run directories (set by the head's startup script)."""
    return Path(os.environ.get(RUN_ROOT_ENV) or RUN_ROOT)


def head_run_dir(run_id: str) -> Path:
    """The run's directory on the head: ``<run root>/<cloud run id>`` (what the watchdog watches)."""
    return run_root() / cloud_run_id(run_id)


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

    def start_head(self, run_id: str) -> HeadHandle:
        self._run_id = cloud_run_id(run_id)
        self.workers.head = dataclasses.replace(self.head_instance, run_id=self._run_id)
        self.start_heartbeat()
        return HeadHandle(address=self.ray_address or f"{self.head_instance.address}:{RAY_PORT}",
                          id=self.head_instance.id, billed=self.billed_head())

    def billed_head(self) -> BilledHead:
        """This head as the run pays for it: its type's on-demand price from its launch (else from now)."""
        import time

        from rubberband.cloud.head import HEAD_TYPES

        head = self.head_instance
        itype = HEAD_TYPES.get(self.cloud)
        if itype is not None and itype.name == head.instance_type:
            price = itype.price_hr
        else:  # a head of another shape: the catalog's price, else the default head's
            try:
                price = self.catalog.find(head.instance_type, cloud=self.cloud).price_hr
            except Exception:  # noqa: BLE001 - unknown type: bill it like the default head
                price = itype.price_hr if itype is not None else 0.0
        launched = head.launched_at if head.launched_at is not None else time.time()
        return BilledHead(id=head.id, instance_type=head.instance_type, cloud=self.cloud, price_hr=price,
                          launched_at=launched, grace_s=self.head_grace_s)

    def stop_head(self) -> bool:
        self.stop_heartbeat()
        self._stop_stand_ins()
        return False

    def heartbeat_targets(self) -> list[tuple[object, list[str]]]:
        """The run's heartbeat goes on this head instance (one call a beat; the head's role may re-tag it)."""
        from rubberband.cloud.backend import _region_of

        head = self.workers.head
        return [(self.pool(self.cloud, _region_of(head)), [head.id])]

    def runtime_env(self, code_dir: str) -> dict | None:
        """None: the executor runs inside the CLI's Ray job, whose runtime_env (rubberband, code) its driver inherits."""
        return None


def _load_inputs(stage: Path):
    from rubberband.plan import load_plan
    from rubberband.spec import JobSpec

    data = json.loads((stage / "spec.json").read_text())
    data["base_dir"] = str(stage.parent)  # the job's working directory: the user's code
    profile = stage / "profile.json"
    return JobSpec.model_validate(data), load_plan(stage / "plan.json"), profile if profile.exists() else None


def run(args: argparse.Namespace) -> int:
    """Execute the staged run on this head; always leave the DONE marker."""
    import time

    from rubberband.catalog import load_catalog
    from rubberband.cloud.bootstrap import lifetime_cap_s
    from rubberband.cloud.head import DONE_MARKER
    from rubberband.cloud.registry import ProviderPool
    from rubberband.cloud.testboot import boot_mode
    from rubberband.errors import RubberbandError
    from rubberband.execution import execute, print_summary

    run_dir = head_run_dir(args.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        spec, plan, profile = _load_inputs(Path.cwd() / STAGE_DIR)
        pool = ProviderPool({"gcp": {"worker_egress": args.worker_egress}})
        (head,) = pool(args.cloud, args.region).wait([args.head_id], 120.0)
        test_boot = boot_mode()
        from rubberband.cloud.ray_token import FileTokenPush, SshTokenPush
        from rubberband.cloud.testboot import head_disk

        # the run's Ray token for each worker: pushed over SSH with the head's key (a played head's stand-in
        # workers read it from this process's environment instead)
        if test_boot:
            push = FileTokenPush() if os.environ.get("RAY_AUTH_MODE") == "token" else None
        else:
            push = SshTokenPush.from_env()

        backend = OnHeadCloudBackend(cloud=args.cloud, run_dir=head_disk(args.head_id) if test_boot else run_dir,
                                     regions=list(dict.fromkeys(s.region for s in plan.stages)), pool=pool,
                                     catalog=load_catalog([args.cloud]), test_boot=test_boot, head_instance=head,
                                     ray_address=os.environ.get("RAY_ADDRESS", ""), head_grace_s=args.head_grace,
                                     requirements=tuple(spec.requirements),
                                     expires_at=time.time() + lifetime_cap_s(args.deadline or plan.deadline_s,
                                                                             args.overrun_s, args.head_grace),
                                     token_push=push, ray_auth_mode="token" if push is not None else "disabled")
        result = execute(spec=spec, plan=plan, catalog=backend.catalog, run_id=args.run_id, run_dir=run_dir,
                         backend=backend, trial_runtime=args.trial_runtime, deadline_s=args.deadline,
                         overrun_s=args.overrun_s, resume=(run_dir / "journal.jsonl").exists(), profile_path=profile,
                         on_late=args.on_late)
        print_summary(args.run_id, spec.metric.name, result.result, run_dir / "result.json")
        from rubberband.executor.outcome import exit_code

        code = exit_code(result.result)  # met 0, late 4, stopped 5: the CLI reads the outcome from result.json
    except RubberbandError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    finally:
        (run_dir / DONE_MARKER).write_text(f"{code}\n")
        print_pack(run_dir)  # the CLI following the job's log takes the run directory from it
    return code


def pack(run_dir: Path) -> str:
    """The run directory as base64 of a tar.gz (members relative to it), without :data:`PACK_EXCLUDE`,
    plus the best trial's newest checkpoint when it is at most :data:`MAX_FETCHED_CHECKPOINT_BYTES`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if run_dir.is_dir():
            for path in sorted(run_dir.iterdir()):
                if path.name not in PACK_EXCLUDE and not path.is_symlink():
                    tar.add(path, arcname=path.name)
            for path in best_checkpoint_files(run_dir):
                tar.add(path, arcname=str(path.relative_to(run_dir)))
    return base64.b64encode(buffer.getvalue()).decode()


def best_checkpoint_files(run_dir: Path) -> list[Path]:
    """The best trial's newest checkpoint and its ``latest`` pointer, if small enough to fetch through the logs."""
    from rubberband.executor.checkpoints import LATEST, checkpoint_path, latest_epoch

    try:
        best = json.loads((run_dir / "result.json").read_text()).get("best") or {}
    except (OSError, ValueError):
        return []
    trial_id = best.get("trial_id")
    if not isinstance(trial_id, str) or "/" in trial_id or trial_id in ("", ".", ".."):
        return []
    directory = run_dir / "checkpoints" / trial_id
    epoch = latest_epoch(directory)
    if epoch is None or checkpoint_path(directory, epoch).stat().st_size > MAX_FETCHED_CHECKPOINT_BYTES:
        return []
    return [checkpoint_path(directory, epoch), directory / LATEST]


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


def print_pack(run_dir: Path) -> None:
    """Print :func:`pack` of ``run_dir`` between the markers (76-character lines, as base64 tools write)."""
    data = pack(run_dir)
    sys.stdout.flush()
    print(PACK_BEGIN)
    for i in range(0, len(data), 76):
        print(data[i:i + 76])
    print(PACK_END, flush=True)


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
    payload = "".join(logs[start + len(PACK_BEGIN):end].split())
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(payload)), mode="r:gz") as tar:
        tar.extractall(into, filter="data")  # no absolute paths, links out or devices
        names = tar.getnames()
    localise_best_checkpoint(into)
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rubberband.cloud.head_job")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="execute the run staged in the working directory on this head")
    add_head_arguments(r)
    r.add_argument("--deadline", type=float, default=None)
    r.add_argument("--overrun-s", type=float, default=0.0, help="seconds a late run goes on (inf: no limit)")
    r.add_argument("--on-late", choices=("finish", "stop"), default="finish",
                   help="at a boundary where no plan meets the deadline: finish late, or stop with the best so far")
    r.add_argument("--trial-runtime", default="rubberband.executor.trials")
    r.add_argument("--worker-egress", choices=("nat", "existing", "public"), default="nat",
                   help="GCP: workers without an external address behind the run's own Cloud NAT (nat), behind the "
                        "network's own egress (existing), or with an external address (public); cloud/gcp.py")
    r.add_argument("--head-grace", type=float, default=WatchdogSettings().done_grace_s,
                   help="the watchdog's results grace: the head is billed this long after the run ends")
    p = sub.add_parser("pack", help="print the run directory as base64 tar.gz")
    p.add_argument("--run-id", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    print_pack(head_run_dir(args.run_id))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
