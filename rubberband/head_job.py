"""What runs ON the run's head instance: the executor, and the packing of its run directory.

The CLI (:mod:`rubberband.cloud.head_session`) submits both as Ray jobs to the head's job server:

* ``python -m rubberband.head_job run --cloud C --region R --head-id I --run-id X`` — the
  job's working directory is the user's training code with the run's spec, plan and profile under
  ``_rubberband/`` (:data:`STAGE_DIR`). It runs the executor with an :class:`OnHeadCloudBackend`
  (workers join this head; failover as anywhere), in ``$RUBBERBAND_RUN_ROOT/<cloud run id>``
  (default ``/var/lib/rubberband/runs``, the directory the head's watchdog watches), and writes
  the ``DONE`` marker when the executor is over, however it ended: the watchdog then ends the head
  and any worker after its grace. ``--image IMAGE`` carries the machine image the user chose on the CLI
  (``RUBBERBAND_AWS_AMI`` / ``RUBBERBAND_GCP_IMAGE``, which this job does not see) to the providers that boot the
  workers (:func:`provider_options`). In tests, when the CLI plays the head's boot (a
  :class:`~rubberband.cloud.boots.BootPlayer` passed in), the job is the player's own command, which calls
  :func:`main` with the player: the executor then plays its workers' boots too; and the CLI adds
  ``--metadata-url URL`` when the test serves spot notices from a local endpoint
  (:mod:`rubberband.executor.notices`).
* ``python -m rubberband.head_job pack --run-id X`` — prints the run directory (journal,
  result.json, plan.json, logs and the best trial's newest checkpoint when small; no other checkpoint and
  no Ray temp files) as one base64 tar.gz between
  :data:`PACK_BEGIN` and :data:`PACK_END`, which the CLI reads back with ``get_job_logs``.

Neither takes a credential: the head's cloud access comes from its instance role / service account.
Head mode's job sits above the executor and the cloud layer and is the one module that imports both;
what the CLI side shares with it (the run directory's layout, the pack markers, the on-head backend)
is in :mod:`rubberband.cloud.head_run`.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

from rubberband.cloud.bootstrap import WatchdogSettings, head_run_dir
from rubberband.cloud.watchdog_cli import add_head_arguments
from rubberband.cloud.head_run import (
    MAX_FETCHED_CHECKPOINT_BYTES,
    PACK_BEGIN,
    PACK_END,
    PACK_EXCLUDE,
    STAGE_DIR,
    OnHeadCloudBackend,
)
from rubberband.cloud.boots import BootPlayer


def _load_inputs(stage: Path):
    from rubberband.plan import load_plan
    from rubberband.spec import JobSpec

    data = json.loads((stage / "spec.json").read_text())
    data["base_dir"] = str(stage.parent)  # the job's working directory: the user's code
    profile = stage / "profile.json"
    return JobSpec.model_validate(data), load_plan(stage / "plan.json"), profile if profile.exists() else None


def head_deadline(args: argparse.Namespace, plan: Any, run_dir: Path) -> float:
    """The deadline handed to the head's executor: a fresh run's is the user's, counting from their command (the
    executor works to what its start leaves of it, :mod:`rubberband.executor.deadline`, after the CLI's planning,
    the head's boot and the code upload); a resumed one keeps what its first start worked to (the journal's)."""
    from rubberband.executor import journal as J

    if (run_dir / J.JOURNAL_NAME).exists():
        return float(J.read_state(run_dir).deadline_s)
    return float(args.deadline or plan.deadline_s)


def run(args: argparse.Namespace, boots: BootPlayer | None = None) -> int:
    """Execute the staged run on this head; always leave the DONE marker. ``boots``: who plays the workers' boots
    (a played head's, passed in by the test suite's ``tests/head_job_harness.py``); None: the cloud boots them."""
    import time

    from rubberband.catalog import load_catalog
    from rubberband.cloud.bootstrap import lifetime_cap_s
    from rubberband.cloud.head import DONE_MARKER
    from rubberband.cloud.registry import ProviderPool
    from rubberband.errors import RubberbandError
    from rubberband.execution import Execution, execute, print_summary

    run_dir = head_run_dir(args.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        spec, plan, profile = _load_inputs(Path.cwd() / STAGE_DIR)
        pool = ProviderPool(provider_options(args))
        (head,) = pool(args.cloud, args.region).wait([args.head_id], 120.0)
        from rubberband.cloud.ray_token import FileTokenPush, SshTokenPush

        # the run's Ray token for each worker: pushed over SSH with the head's key (a played head's stand-in
        # workers read it from this process's environment instead)
        if boots is not None:
            push = FileTokenPush() if os.environ.get("RAY_AUTH_MODE") == "token" else None
        else:
            push = SshTokenPush.from_env()

        backend = OnHeadCloudBackend(
            cloud=args.cloud,
            run_dir=boots.head_disk(args.head_id) if boots is not None else run_dir,
            regions=list(dict.fromkeys(s.region for s in plan.stages)),
            pool=pool,
            catalog=load_catalog([args.cloud]),
            boots=boots,
            head_instance=head,
            ray_address=os.environ.get("RAY_ADDRESS", ""),
            head_grace_s=args.head_grace,
            requirements=tuple(spec.requirements),
            expires_at=time.time() + lifetime_cap_s(args.deadline or plan.deadline_s, args.overrun_s, args.head_grace),
            token_push=push,
            ray_auth_mode="token" if push is not None else "disabled",
            metadata_url=args.metadata_url,
        )
        result = execute(
            Execution(
                spec=spec,
                plan=plan,
                catalog=backend.catalog,
                run_id=args.run_id,
                run_dir=run_dir,
                backend=backend,
                trial_runtime=args.trial_runtime,
                deadline_s=head_deadline(args, plan, run_dir),
                overrun_s=args.overrun_s,
                resume=(run_dir / "journal.jsonl").exists(),
                profile_path=profile,
                on_late=args.on_late,
                commanded_at=args.commanded_at,
            )
        )
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


def provider_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The options of the head's providers (the ones that start the workers), from the run job's command line: the
    GCP workers' egress, and the machine image the user chose on the CLI (``--image``: this job does not see the
    CLI's ``RUBBERBAND_AWS_AMI`` / ``RUBBERBAND_GCP_IMAGE``; without it the workers would boot the default image
    while the head boots the chosen one)."""
    from rubberband.cloud.registry import CLOUD_PROVIDERS, head_mode

    return {
        cloud: head_mode(cloud).provider_options(
            worker_egress=args.worker_egress, image=args.image if cloud == args.cloud else None
        )
        for cloud in CLOUD_PROVIDERS
    }


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


def print_pack(run_dir: Path) -> None:
    """Print :func:`pack` of ``run_dir`` between the markers (76-character lines, as base64 tools write)."""
    data = pack(run_dir)
    sys.stdout.flush()
    print(PACK_BEGIN)
    for i in range(0, len(data), 76):
        print(data[i : i + 76])
    print(PACK_END, flush=True)


def _metadata_url(value: str) -> str | None:
    """``--metadata-url``: checked as the CLI checks it (argparse's usage error for a malformed one)."""
    from rubberband.errors import InputError
    from rubberband.executor.notices import check_metadata_url

    try:
        return check_metadata_url(value)
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rubberband.head_job")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="execute the run staged in the working directory on this head")
    add_head_arguments(r)
    r.add_argument("--deadline", type=float, default=None)
    r.add_argument(
        "--commanded-at",
        type=float,
        default=None,
        help="when the user's command began (POSIX seconds): the result reports what went before the executor",
    )
    r.add_argument("--overrun-s", type=float, default=0.0, help="seconds a late run goes on (inf: no limit)")
    r.add_argument(
        "--on-late",
        choices=("finish", "stop"),
        default="finish",
        help="at a boundary where no plan meets the deadline: finish late, or stop with the best so far",
    )
    r.add_argument("--trial-runtime", default="rubberband.executor.trials")
    r.add_argument(
        "--worker-egress",
        choices=("nat", "existing", "public"),
        default="nat",
        help="GCP: workers without an external address behind the run's own Cloud NAT (nat), behind the "
        "network's own egress (existing), or with an external address (public); cloud/gcp/provider.py",
    )
    r.add_argument(
        "--image",
        default=None,
        help="the machine image workers boot on, as the user chose it on the CLI (RUBBERBAND_AWS_AMI / "
        "RUBBERBAND_GCP_IMAGE); default: the provider's own",
    )
    r.add_argument(
        "--head-grace",
        type=float,
        default=WatchdogSettings().done_grace_s,
        help="the watchdog's results grace: the head is billed this long after the run ends",
    )
    # tests only: the metadata server the notice watchers read (a local endpoint; executor/notices.py)
    r.add_argument("--metadata-url", type=_metadata_url, default=None, help=argparse.SUPPRESS)
    p = sub.add_parser("pack", help="print the run directory as base64 tar.gz")
    p.add_argument("--run-id", required=True)
    return parser


def main(argv: list[str] | None = None, *, boots: BootPlayer | None = None) -> int:
    """``python -m rubberband.head_job ...`` (``boots``: the test suite's player, passed in by its harness)."""
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args, boots)
    print_pack(head_run_dir(args.run_id))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
