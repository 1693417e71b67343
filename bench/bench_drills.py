"""Fault drills, counted (issue 17, item 5): kill the CLI, the head or the executor at each step of a cloud run, or
inject API errors into 5 % of calls; after each drill and a ``down --all-orphans``, count what is left.

Runs against a moto server (AWS) and the GCE fake (GCP) in this process; the drills themselves are in
``tests/drills.py`` (module docstring: what a kill is, what each role does, what is counted). Prints one row per kind
of fault and cloud: how many drills, what the run left by itself (before ``down``) and what is left after it, per
resource kind, as ``before→after`` summed over the drills. The goal is 0 after ``down`` in every cell, with the
user's look-alike resources and a live run spared.

    python bench/bench_drills.py [--per-phase 2] [--error-seeds 3] [--error-rate 0.05] [--mixed 2] [--clouds aws gcp]

About 3 minutes on 2 busy cores (AWS drills take ~5 s each: moto, and a boto3 session per provider; GCP ~0.3 s).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-phase", type=int, default=2, help="kill points per (role, phase), spread over its calls")
    parser.add_argument("--error-seeds", type=int, default=3, help="runs with random API errors, per cloud")
    parser.add_argument("--error-rate", type=float, default=0.05)
    parser.add_argument(
        "--mixed", type=int, default=2, help="runs with a kill at a random call and random API errors, per cloud"
    )
    parser.add_argument("--clouds", nargs="+", default=["aws", "gcp"], choices=["aws", "gcp"])
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("rubberband").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    tmp = Path(tempfile.mkdtemp(prefix="rb-drills-"))
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="AKIADRILLDRILLDRILL0",
        AWS_SECRET_ACCESS_KEY="drill",
        AWS_DEFAULT_REGION="us-east-1",
        RUBBERBAND_AWS_AMI="ami-12c6146b",
        AWS_CONFIG_FILE=str(tmp / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    from cloud_helpers import create_boundary
    from gce_fake import GceFake

    create_boundary()  # rubberband's permissions boundary, as an account's administrator creates it once
    fake = GceFake().start()
    os.environ["RUBBERBAND_GCE_ENDPOINT"] = fake.url
    import drills

    rows: dict[tuple[str, str], list] = defaultdict(list)
    started = time.perf_counter()
    try:
        for cloud in args.clouds:
            world = drills.make_world(
                cloud, tmp, moto_url=f"http://{host}:{port}", fake=fake if cloud == "gcp" else None
            )
            calls = drills.census(world)
            for kill in drills.kill_points(calls, args.per_phase):
                outcome = drills.run_drill(world, kill=kill)
                rows[(f"{kill.role} killed during {kill.phase}", cloud)].append(outcome)
            for seed in range(args.error_seeds):
                outcome = drills.run_drill(world, error_rate=args.error_rate, seed=seed)
                rows[(f"{args.error_rate:.0%} of API calls fail", cloud)].append(outcome)
            every = drills.kill_points(calls, per_phase=1000)
            pick = random.Random(17)
            for seed in range(args.mixed):
                outcome = drills.run_drill(world, kill=pick.choice(every), error_rate=args.error_rate, seed=100 + seed)
                rows[(f"a random kill + {args.error_rate:.0%} errors", cloud)].append(outcome)
    finally:
        server.stop()
        fake.stop()
    elapsed = time.perf_counter() - started
    head = ["fault", "cloud", "drills"] + list(drills.CATEGORIES) + ["spared", "notes"]
    table = []
    leaks = 0
    for (fault, cloud), outcomes in rows.items():
        before, after = Counter(), Counter()
        for o in outcomes:
            before.update(o.before)
            after.update(o.after)
        leaks += sum(after.values())
        notes = []
        injected = sum(o.injected for o in outcomes)
        if injected:
            notes.append(f"{injected} errors injected")
        retried = sum(o.sweep_errors for o in outcomes)
        if retried:
            notes.append(f"{retried} sweeps re-run")
        failed = sum(1 for o in outcomes for status in o.roles.values() if status.startswith("failed"))
        if failed:
            notes.append(f"{failed} roles failed")
        table.append(
            [fault, cloud, str(len(outcomes))]
            + [f"{before[c]}→{after[c]}" for c in drills.CATEGORIES]
            + ["yes" if all(o.survivors_ok for o in outcomes) else "NO", ", ".join(notes)]
        )
    widths = [max(len(r[i]) for r in [head] + table) for i in range(len(head))]
    print("Left by the run itself → left after `down --all-orphans --older-than 1h` (summed over the drills)")
    for row in [head, ["-" * w for w in widths]] + table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    print(
        f"\n{sum(len(o) for o in rows.values())} drills in {elapsed:.0f} s; resources left after down: {leaks}; "
        f"look-alikes and live runs spared: {all(o.survivors_ok for v in rows.values() for o in v)}"
    )
    return 0 if leaks == 0 and all(o.survivors_ok for v in rows.values() for o in v) else 1


if __name__ == "__main__":
    sys.exit(main())
