"""Start-ups as a run overlaps them on a shared host (the local cloud, whose instances share this machine's cores).

A local run provisions its instances one after another: the next node boots while the one before starts its
trial worker processes (Python, Ray, torch where the trials use DDP). Timed alone, each start is quick; timed side
by side on two cores, both are slower (21 real runs: a node's workers 3.5 s against 2.4 s alone, the next boot
4.0 s against 2.2 s). :func:`measure_overlap` times exactly that pair with the executor's own parts (the local
provider's ``ray start`` node, the run's ``WorkerPool`` of ``TrialWorker`` actors) on the start-up probe's head,
and then the second node's workers alone, so the planner adds what the overlap costs (profile
``startup_overlap``) and nothing it does not.

The probe's driver runs in a child process (``python -m rubberband.profiler.overlap``), as a run's executor is
its own process: a driver that connected to the probe's token-authenticated head leaves Ray state behind that
the profiling cluster started next in the same process cannot schedule actors with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rubberband.catalog import InstanceType, load_catalog
from rubberband.cloud.provider import InstanceRequest, node_resource
from rubberband.devices import WorkerDevice
from rubberband.errors import ExecutionError
from rubberband.profile import StartupOverlap

#: Seconds a probe's workers or node may take before the probe gives up (the profile notes it).
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class OverlapProbe:
    """What one overlap measurement needs: the instance type to start (its slots are the workers started), the
    workers' device, and whether they import torch as they start (as a run's do when trials use DDP)."""

    instance_type: InstanceType
    device: WorkerDevice
    warm_torch: bool


def measure_overlap(run_dir: Path, probe: OverlapProbe) -> StartupOverlap:
    """Measure on the head of the local provider whose run directory is ``run_dir`` (started by the caller, who
    also stops it and anything left on it), from a child process; raises ExecutionError when it fails."""
    argv = [
        sys.executable,
        "-m",
        "rubberband.profiler.overlap",
        str(run_dir),
        probe.instance_type.name,
        json.dumps({"device": dataclasses.asdict(probe.device), "warm_torch": probe.warm_torch}),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3 * PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ExecutionError(f"the start-up overlap probe took over {3 * PROBE_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExecutionError(f"the start-up overlap probe failed: {last}")
    return StartupOverlap.model_validate_json(done.stdout.strip().splitlines()[-1])


def _measure(provider: Any, probe: OverlapProbe) -> StartupOverlap:
    """Node A alone; then A's workers starting while node B boots; then B's workers alone. Every node it started is
    terminated; the driver it connected is disconnected."""
    from rubberband.executor.cluster import RayCluster
    from rubberband.executor.pool import WorkerPool

    itype = probe.instance_type
    count = max(1, itype.workers)
    cluster = RayCluster()
    started: list[str] = []
    try:
        head = provider.head()
        if head is None or not head.address:
            raise ExecutionError("the start-up probe's head is not running")
        cluster.connect(
            head.address,
            namespace="rb-startup-probe",
            runtime_env=None,
            auth_mode=provider.ray_auth_mode,
            auth_token_path=provider.ray_auth_token_path,
        )
        began = time.time()
        (a,) = provider.provision(InstanceRequest(run_id="startup-probe", stage=0, instance_type=itype))
        started.append(a.id)
        boot_alone = time.time() - began
        with WorkerPool(device=probe.device, warm_torch=probe.warm_torch) as pool:
            booted: dict[str, Any] = {}
            began = time.time()

            def boot_next() -> None:
                try:
                    (b,) = provider.provision(InstanceRequest(run_id="startup-probe", stage=0, instance_type=itype))
                    booted["b"], booted["s"] = b, time.time() - began
                except Exception as exc:  # noqa: BLE001 - handed to the caller's thread below
                    booted["error"] = exc

            second = threading.Thread(target=boot_next, name="rb-overlap-boot", daemon=True)
            second.start()
            pool.warm(node_resource(a.id), count, timeout_s=PROBE_TIMEOUT_S, device=probe.device)
            workers_overlapped = time.time() - began
            second.join(PROBE_TIMEOUT_S)
            if "error" in booted:
                raise booted["error"]
            if "b" not in booted:
                raise ExecutionError(f"the second probe node was not up within {PROBE_TIMEOUT_S:.0f} s")
            started.append(booted["b"].id)
            began = time.time()
            pool.warm(node_resource(booted["b"].id), count, timeout_s=PROBE_TIMEOUT_S, device=probe.device)
            workers_alone = time.time() - began
    finally:
        cluster.close()
        for instance_id in started:
            provider.terminate([instance_id])
    return StartupOverlap(
        cloud=itype.cloud,
        instance_type=itype.name,
        workers=count,
        boot_alone_s=round(boot_alone, 3),
        boot_overlapped_s=round(booted["s"], 3),
        workers_alone_s=round(workers_alone, 3),
        workers_overlapped_s=round(workers_overlapped, 3),
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m rubberband.profiler.overlap RUN_DIR TYPE PROBE_JSON``: print the measurement as JSON."""
    parser = argparse.ArgumentParser(prog="python -m rubberband.profiler.overlap")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("instance_type")
    parser.add_argument("probe", help='{"device": WorkerDevice fields, "warm_torch": bool}')
    args = parser.parse_args(argv)
    from rubberband.cloud.local.provider import LocalProvider

    given = json.loads(args.probe)
    itype = load_catalog(["local"]).find(args.instance_type, cloud="local")
    probe = OverlapProbe(itype, WorkerDevice(**given["device"]), bool(given["warm_torch"]))
    print(_measure(LocalProvider(args.run_dir), probe).model_dump_json())


if __name__ == "__main__":
    main()
