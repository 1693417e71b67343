"""What torch costs a trial worker: start latency and CPU of a TrialWorker with and without torch imported.

A job of one-worker CPU trials (scikit-learn, XGBoost, a sleep) starts its workers without torch
(``WorkerPool(warm_torch=False)``); trials of several workers or on GPUs import it as they start. This starts
``--samples`` workers of each kind on a local Ray node, one after another, and prints the median time from the
actor's creation to its first answer and the median CPU its process used by then, and the ratio.

    python bench/bench_worker_start.py [--samples 8]

Figures vary with machine load (run it on an idle machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(warm_torch: bool, samples: int) -> tuple[list[float], list[float]]:
    """Start ``samples`` workers (torch imported at start or not): each one's start seconds and CPU seconds."""
    import ray

    from rubberband.executor.worker import actor_class

    cls = actor_class()
    starts, cpus = [], []
    for _ in range(samples):
        began = time.monotonic()
        actor = cls.options(num_cpus=0).remote(warm_torch)
        pid = ray.get(actor.ping.remote())
        starts.append(time.monotonic() - began)
        cpus.append(_cpu_s(pid))
        ray.kill(actor)
        time.sleep(0.5)
    return starts, cpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8, help="workers started per kind")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        measure(False, 1)  # Ray's own first-worker costs out of the figures
        rows = {kind: measure(kind, args.samples) for kind in (False, True)}
    finally:
        ray.shutdown()
    (free_start, free_cpu), (torch_start, torch_cpu) = rows[False], rows[True]
    med = statistics.median
    print(f"{'worker':24} {'start s (median)':>17} {'CPU s (median)':>15}")
    print(f"{'without torch':24} {med(free_start):17.2f} {med(free_cpu):15.2f}")
    print(f"{'with torch imported':24} {med(torch_start):17.2f} {med(torch_cpu):15.2f}")
    print(
        f"without/with: start {med(free_start) / med(torch_start):.2f}x, CPU {med(free_cpu) / med(torch_cpu):.2f}x "
        f"({args.samples} workers each)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
