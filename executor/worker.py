"""The worker process of a trial: a Ray actor that imports the user's code, joins the trial's
torch.distributed process group and runs ``train(config, ctx)``.

A worker is reusable: every :meth:`TrialWorker.run` builds a fresh process group for that run's
world size and destroys it at the end, so a warm process can serve the next stage or resize of
any trial (re-initialising a process group takes ~0.04 s; a fresh actor ~2 s). User errors are
returned as data (never raised), so the driver can report the first root cause in one line.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from rubberband.executor.context import ReportRecord, WorkerContext, WorkerTask
from rubberband.executor.notices import PreemptionNotice
from rubberband.net import free_port
from rubberband.devices import CPU_WORKER, WorkerDevice, observe_cuda, resolve
from rubberband.raytune import adapt as adapt_trainable


@dataclass(frozen=True)
class WorkerFailure:
    """The user's (or the runtime's) exception in one worker, as one line plus its traceback."""

    rank: int
    kind: str  # "import" | "device" | "setup" | "train" | "preempted"
    error_type: str
    message: str
    failed_at: float
    traceback: str = ""


@dataclass(frozen=True)
class WorkerResult:
    rank: int
    pid: int
    started_at: float
    setup_done_at: float | None
    finished_at: float
    failure: WorkerFailure | None = None
    iteration_latencies_s: tuple[float, ...] = ()
    reports: tuple[ReportRecord, ...] = ()
    checkpoint_epoch: int | None = None
    checkpoint_saved_s: tuple[float, ...] = ()
    pass_lengths: tuple[int | None, ...] = ()
    batch_size_seen: int | None = None
    first_iteration_at: float | None = None
    pass_times: tuple[tuple[float, float], ...] = ()
    #: The torch device this rank trained on ("cpu", "cuda:0") and its process group's backend.
    device: str = ""
    backend: str = ""
    #: ``ray.get_gpu_ids()`` of this rank (empty on CPU types).
    gpu_ids: tuple = ()


def load_entry_point(entry_point: str, code_dir: str) -> Callable:
    """Import ``module:function`` with ``code_dir`` first on ``sys.path``."""
    module_name, _, func_name = entry_point.partition(":")
    if code_dir:
        if code_dir in sys.path:
            sys.path.remove(code_dir)
        sys.path.insert(0, code_dir)  # first: this trial's code wins over an earlier trial's
        cached = sys.modules.get(module_name)
        origin = getattr(cached, "__file__", None) or ""
        if cached is not None and not os.path.abspath(origin).startswith(os.path.abspath(code_dir) + os.sep):
            del sys.modules[module_name]  # a warm worker imported a same-named module from elsewhere
    importlib.invalidate_caches()
    module = importlib.import_module(module_name)
    try:
        return getattr(module, func_name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no function {func_name!r}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400] + ("…" if len(text) > 400 else "")


class TrialWorker:
    """The actor class (wrapped with ``ray.remote`` by :func:`actor_class`)."""

    def __init__(self, warm_torch: bool = False) -> None:
        """``warm_torch``: import torch now, once per process (trials of several workers or on GPUs use it); a
        worker for one-worker CPU trials never imports it unless the training function does."""
        if warm_torch:
            import torch  # noqa: F401

        self._pid = os.getpid()

    def ping(self) -> int:
        return self._pid

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port for the process group's store."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def run(self, task: WorkerTask, master: tuple[str, int]) -> WorkerResult:
        started = time.time()
        saved_env = {k: os.environ.get(k) for k in task.env}
        os.environ.update({str(k): str(v) for k, v in task.env.items()})
        setup_done: float | None = None
        ctx: WorkerContext | None = None
        failure: WorkerFailure | None = None
        resolved = None
        stage = "device"
        try:
            # before the process group: a GPU rank without CUDA must fail here, not hang in nccl
            # (CUDA is looked at only where the type has GPUs: that needs torch)
            resolved = resolve(task.device, observe_cuda() if task.device.use_gpu else None)
            stage = "import"
            train = adapt_trainable(load_entry_point(task.entry_point, task.code_dir))  # Ray Tune's def f(config)
            stage = "setup"
            device, group = _torch_setup(task, resolved.device, resolved.backend, master)
            setup_done = time.time()
            ctx = WorkerContext(task, device=device, process_group=group)
            stage = "train"
            train(dict(task.config), ctx)
        except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything
            if isinstance(exc, PreemptionNotice):  # stopped on purpose after a checkpoint: not the user's fault
                stage = "preempted"
            failure = WorkerFailure(
                rank=task.rank,
                kind=stage,
                error_type=type(exc).__name__,
                message=_one_line(exc),
                failed_at=time.time(),
                traceback=traceback.format_exc(limit=20),
            )
        finally:
            dist = sys.modules.get("torch.distributed")  # imported only where a trial used torch
            if dist is not None and dist.is_initialized():
                try:
                    dist.destroy_process_group()  # closes sockets: peers blocked in a collective fail fast
                except Exception:  # noqa: BLE001
                    pass
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return WorkerResult(
            rank=task.rank,
            pid=self._pid,
            started_at=started,
            setup_done_at=setup_done,
            finished_at=time.time(),
            failure=failure,
            iteration_latencies_s=tuple(ctx.iteration_latencies_s) if ctx else (),
            reports=tuple(ctx.reports) if ctx else (),
            checkpoint_epoch=ctx.checkpoint_epoch if ctx else None,
            checkpoint_saved_s=tuple(ctx.checkpoint_saved_s) if ctx else (),
            pass_lengths=tuple(ctx.pass_lengths) if ctx else (),
            batch_size_seen=ctx.batch_size_seen if ctx else None,
            first_iteration_at=ctx.first_iteration_at if ctx else None,
            pass_times=tuple(ctx.pass_times) if ctx else (),
            device=resolved.device if resolved else "",
            backend=resolved.backend if resolved else "",
            gpu_ids=tuple(resolved.gpu_ids) if resolved else (),
        )


def _torch_setup(task: WorkerTask, device_name: str, backend: str, master: tuple[str, int]) -> tuple[Any, Any]:
    """The torch device and process group of one worker (its training module is imported by now). A training that
    does not use torch (scikit-learn, XGBoost, a sleep) on one CPU worker gets neither, and torch is never imported;
    one that does gets both even at one worker (its code may wrap the model in DDP, which needs a process group)."""
    if task.world_size == 1 and device_name == "cpu" and "torch" not in sys.modules:
        return None, None
    import torch
    import torch.distributed as dist

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    host, port = master
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=task.rank,
        world_size=task.world_size,
        timeout=timedelta(seconds=task.timeout_s),
    )
    return device, dist.group.WORLD


def actor_options(resource: str | None, device: WorkerDevice = CPU_WORKER) -> dict:
    """Ray options of one worker: its device's CPUs / GPU (rubberband.devices) and one slot of its instance."""
    return device.actor_options(resource)


def actor_class():
    """``TrialWorker`` as a Ray actor class (wrapped on demand so importing needs no Ray session)."""
    import ray

    return ray.remote(TrialWorker)
