"""GPU trials for real: the profiler at 1 and 2 workers on this machine's GPUs, and a 2-worker nccl DDP trial.

On a machine with CUDA this stands the machine in for one instance of a GPU type (``local.gpu<N>``:
its GPUs, its cores) and runs rubberband's own paths on it:

1. ``rubberband.profiler.runner.run_profile`` at 1 and 2 workers on one node (Ray node started
   with the machine's GPUs; every worker asks for one GPU and trains on it with nccl) and prints
   the median steady iteration latency per shape and the 2-worker scaling (throughput relative to
   one worker: 2 × t(1) / t(2); 2.0 would be perfect).
2. One 2-worker trial through ``TrialRun`` (the executor's runtime): prints each rank's device,
   Ray GPU id and backend, the median iteration latency, and checks both ranks end with identical
   parameters (DDP over nccl kept them in step).

The workload is a small CNN on synthetic CIFAR-shaped batches created on the GPU (no data
download: device machines have no network). Two workers need two GPUs (nccl refuses two ranks on
one device); with one GPU the 2-worker parts are skipped and say so. Without CUDA the script says
so and exits 0 (the GPU path is then covered on logical GPUs by tests/test_trials_gpu.py).

    python bench/bench_gpu.py [--iterations 40] [--budget 240] [--batch 256]
    python bench/bench_gpu.py --smoke-logical 2 --iterations 6 --batch 16   # no CUDA: check the script only

``--smoke-logical N`` runs the same steps on N *logical* GPUs with the test stand-in (CPU, gloo) so the
script itself can be checked on a machine without CUDA; its figures are CPU figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent


# -- the workload (imported by the workers as bench_gpu:train) ---------------------------------


def train(config, ctx):
    """A small CNN on synthetic 3×32×32 batches, DDP on ctx.device; every iteration ends synchronised."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1 + ctx.rank)  # different init per rank: DDP must broadcast rank 0's
    net = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1, stride=2),
        nn.BatchNorm2d(256),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 10),
    ).to(ctx.device)
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    model = DDP(net, device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05), momentum=0.9)
    batch = int(config.get("batch_size", 256))
    gen = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
    x = torch.randn(batch, 3, 32, 32, device=ctx.device, generator=gen)
    y = torch.randint(0, 10, (batch,), device=ctx.device, generator=gen)
    steps = int(config.get("steps_per_epoch", 50))
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        total = 0.0
        for _ in ctx.batches(range(steps)):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += float(loss)  # synchronises: the iteration's time is the GPU's, not the launch's
        ctx.report(epoch, loss=total / max(1, steps))
    out = config.get("params_out")
    if out:  # parameters only: BatchNorm's running statistics are each rank's own
        torch.save({k: v.detach().cpu() for k, v in model.module.named_parameters()}, f"{out}.rank{ctx.rank}")
    dist.barrier()


# -- the benchmark ---------------------------------------------------------------------------


def steady_median(latencies) -> float:
    values = np.asarray(latencies, dtype=float)
    if len(values) >= 5:
        values = values[max(1, len(values) // 10) :]  # drop warm-up, as the planner's fit does
    return float(np.median(values))


def gpu_type(gpus: int, name: str):
    """This machine as one instance of a GPU type: its GPUs and its cores (catalog-shaped)."""
    from rubberband.catalog import InstanceType

    return InstanceType(
        cloud="local",
        name=f"local.gpu{gpus}",
        region="local",
        zones=("local-a",),
        device=name,
        accelerator_count=gpus,
        vcpus=float(os.cpu_count() or gpus),
        memory_gib=0.0,
        price_hr=1.0,
        spot_price_hr=None,
    )


def job_spec(batch: int, steps: int):
    from rubberband.spec import parse_spec

    data = {
        "name": "bench-gpu",
        "train": "bench_gpu:train",
        "metric": {"name": "loss", "mode": "min"},
        "search_space": {"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        "config": {"batch_size": batch, "steps_per_epoch": steps, "dataset_size": batch * steps},
        "scheduler": {"kind": "sha", "trials": 3, "eta": 3, "min_epochs": 1, "max_epochs": 3},
        "deadline": "1h",
        "resources": {"clouds": ["local"]},
    }
    return parse_spec(data, source="bench_gpu", base_dir=BENCH)


def profile(itype, args, policy) -> dict[int, float]:
    from rubberband.profiler.measured import ProfileOptions
    from rubberband.profiler.runner import run_profile

    workers = (1, 2) if itype.accelerator_count >= 2 else (1,)
    run = run_profile(
        job_spec(args.batch, args.iterations),
        ProfileOptions(
            cloud="local",
            instance_type=itype,
            workers=workers,
            budget_s=args.budget,
            iterations=args.iterations,
            cross_node=False,
            measure_restart=False,
            device_policy=policy,
        ),
    )
    print(f"profile ({run.wall_s:.0f} s wall; {run.profile.sources['iteration_latencies']})")
    medians = {}
    for m in sorted(run.profile.measurements, key=lambda m: m.workers):
        medians[m.workers] = steady_median(m.iteration_latencies_s)
        print(
            f"  {m.workers} worker(s) on {m.nodes} node: median {medians[m.workers] * 1e3:8.2f} ms/iteration "
            f"({len(m.iteration_latencies_s)} iterations, device {m.device})"
        )
    for note in run.notes:
        print(f"  note: {note}")
    if 1 in medians and 2 in medians:
        print(
            f"  2-worker scaling: {2 * medians[1] / medians[2]:.2f}× one worker's throughput "
            f"(efficiency {medians[1] / medians[2]:.0%})"
        )
    return medians


def nccl_trial(itype, args, policy) -> None:
    import torch

    from rubberband.cloud.provider import node_resource
    from rubberband.devices import node_resources
    from rubberband.executor.trials import TrialRun, TrialSpec
    from rubberband.profiler.local_cluster import LocalCluster

    node = node_resources(itype)
    with tempfile.TemporaryDirectory(prefix="rb-bench-gpu-") as scratch, LocalCluster() as cluster:
        cluster.add_instance("g", node.slots, num_gpus=node.num_gpus, num_cpus=node.num_cpus)
        r = node_resource("g")
        spec = TrialSpec(
            trial_id="bench-nccl",
            config={"batch_size": args.batch, "steps_per_epoch": args.iterations, "params_out": f"{scratch}/p"},
            entry_point="bench_gpu:train",
            code_dir=str(BENCH),
            start_epoch=0,
            end_epoch=2,
            placement=(r, r),
            checkpoint_dir=f"{scratch}/ckpt",
            device=policy.for_type(itype),
            timeout_s=300,
        )
        began = time.monotonic()
        outcome = TrialRun.start(spec).result(timeout_s=600)
        wall = time.monotonic() - began
        p0, p1 = (torch.load(f"{scratch}/p.rank{k}", weights_only=True) for k in (0, 1))
        same = all(torch.equal(p0[k], p1[k]) for k in p0)
    print(f"2-worker DDP trial through TrialRun ({wall:.1f} s wall, setup {outcome.setup_s:.2f} s)")
    for rank, (device, ids) in enumerate(zip(outcome.devices, outcome.gpu_ids)):
        print(f"  rank {rank}: device {device}, Ray GPU id(s) {list(ids)}")
    print(
        f"  backend {outcome.backend}; median {steady_median(outcome.iteration_latencies_s) * 1e3:.2f} ms/iteration "
        f"over {len(outcome.iteration_latencies_s)} iterations; ranks' parameters identical: {same}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40, help="iterations timed per shape / per epoch")
    parser.add_argument("--budget", type=float, default=240.0, help="the profile's time budget (s)")
    parser.add_argument("--batch", type=int, default=256, help="per-worker batch size")
    parser.add_argument(
        "--part",
        choices=("all", "profile", "trial"),
        default="all",
        help="all: the profile, then the trial, each in a process of its own (one Ray session each)",
    )
    parser.add_argument(
        "--smoke-logical",
        type=int,
        default=0,
        metavar="N",
        help="no CUDA needed: N logical GPUs, training on CPU (checks the script, not GPUs)",
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import torch

    from rubberband.devices import DevicePolicy

    if args.smoke_logical:
        gpus, name, policy = args.smoke_logical, "logical", DevicePolicy(cpu_stand_in=True)
        print(f"smoke run on {gpus} logical GPU(s), training on CPU: these are not GPU figures")
    elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(
            f"no usable CUDA on this machine (torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            f"nothing to measure. The GPU path is tested on logical GPUs by tests/test_trials_gpu.py."
        )
        return 0
    else:
        gpus, policy = torch.cuda.device_count(), DevicePolicy()
        name = torch.cuda.get_device_name(0).replace("NVIDIA ", "").split()[0]
        print(f"{gpus} × {torch.cuda.get_device_name(0)}; torch {torch.__version__} (CUDA {torch.version.cuda})")
    itype = gpu_type(min(gpus, 2), name)
    if args.part == "all":
        print(f"standing in for {itype.name}: {itype.accelerator_count} GPU(s), {itype.vcpus:.0f} vCPUs", flush=True)
        codes = [
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--part", part]).returncode
            for part in (("profile", "trial") if gpus >= 2 else ("profile",))
        ]
        if gpus < 2:
            print("2-worker nccl trial: skipped, it needs 2 GPUs (nccl does not put two ranks on one device)")
        return max(codes)
    if args.part == "profile":
        profile(itype, args, policy)
    else:
        nccl_trial(itype, args, policy)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    sys.exit(main())
