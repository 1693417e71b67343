"""Run a Ray Tune function trainable, unchanged, as a rubberband training function.

A Ray Tune function trainable is ``def train_fn(config)`` that calls ``ray.tune.report(metrics,
checkpoint=...)`` (or ``ray.train.report``, ``ray.air.session.report``) once per training
iteration and restores from ``ray.tune.get_checkpoint()``. :func:`adapt` recognises a
one-argument function and wraps it into ``train(config, ctx)``; for the duration of the call it
replaces, in the Ray modules already imported and in the function's own module globals (so
``from ray.tune import report`` works too), ``report``, ``get_checkpoint`` and ``get_context``:

* the i-th ``report`` is epoch ``ctx.start_epoch + i``: its numeric metrics go to ``ctx.report``,
  its checkpoint directory (every file, as bytes) to ``ctx.save_checkpoint``, world-size
  independent; each epoch is one pass of ``ctx.batches`` with one timed "iteration" (from the
  end of the last report to this one), so the profiler sees a Ray Tune trainable as one iteration
  per epoch, the report and the checkpoint save as the time between epochs, and whole epochs of
  several configurations (their speed spread);
* ``get_checkpoint`` returns the trial's newest checkpoint, written back into a temporary
  directory as a ``Checkpoint`` of the module it was called through (``None`` on a fresh trial);
* at the rung boundary (``ctx.end_epoch``), or when profiling has timed ``ctx.max_iterations``
  epochs, the report call raises :class:`StopTrainable` (a ``BaseException``, so the trainable's
  ``except Exception`` does not swallow it) after recording the epoch, and the adapter returns.

A trainable is single-process: with more than one worker only rank 0 runs it (keep
``resources.max_workers_per_trial: 1``). Nothing here imports Ray Tune unless a trainable is
adapted.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import numbers
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

#: The Ray modules whose session functions are replaced, when they can be imported.
SESSION_MODULES = ("ray.tune", "ray.train", "ray.air.session")
#: The key of a Ray Tune checkpoint (relative path -> file bytes) in the rubberband checkpoint state.
STATE_KEY = "ray_tune_checkpoint"


class StopTrainable(BaseException):
    """Raised inside the trainable's ``report`` once the epochs asked for are done."""


def is_tune_trainable(fn: Callable) -> bool:
    """True for a function taking exactly one positional argument (``config``): a Ray Tune function trainable."""
    if inspect.isclass(fn):
        return False
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return not variadic and len(required) == 1 and len(positional) == 1


def adapt(fn: Callable) -> Callable:
    """``fn`` as a ``train(config, ctx)``: unchanged unless it is a Ray Tune function trainable."""
    if inspect.isclass(fn):
        raise TypeError(
            f"{fn.__name__} is a class; rubberband runs Ray Tune *function* trainables "
            f"(def train(config)) or train(config, ctx)"
        )
    if not is_tune_trainable(fn):
        return fn

    @functools.wraps(fn)
    def train(config: dict, ctx: Any) -> None:
        run_trainable(fn, config, ctx)

    train.ray_tune_trainable = fn  # type: ignore[attr-defined]
    return train


# -- the session ---------------------------------------------------------------------------------


class _TuneContext:
    """What ``get_context()`` returns inside an adapted trainable (the commonly used getters)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def get_trial_id(self) -> str:
        return self._ctx.trial_id

    def get_trial_name(self) -> str:
        return self._ctx.trial_id

    def get_experiment_name(self) -> str:
        return "rubberband"

    def get_trial_dir(self) -> str:
        return getattr(self._ctx, "checkpoint_dir", os.getcwd())

    def get_world_rank(self) -> int:
        return 0

    def get_local_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_local_world_size(self) -> int:
        return 1

    def get_node_rank(self) -> int:
        return 0


def _numeric(metrics: dict) -> dict[str, float]:
    return {str(k): float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}


def _read_directory(checkpoint: Any) -> dict[str, bytes]:
    """Every file of a reported checkpoint, by relative path."""
    files: dict[str, bytes] = {}
    with checkpoint.as_directory() as directory:
        root = Path(directory)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


class _Session:
    """One adapted call: counts reports as epochs, times them, keeps and restores checkpoints."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.reports = 0
        self._epoch: Iterator | None = None  # the running epoch's pass of ctx.batches
        self._restored: dict[str, bytes] | None = None
        self._latest: Any = None  # the newest checkpoint the trainable reported in this call
        self._dirs: list[str] = []

    def start(self) -> bool:
        """Load the trial's checkpoint (collective) and start the epoch timer; False if no epoch is to run."""
        state = self.ctx.load_checkpoint()
        if isinstance(state, dict) and isinstance(state.get(STATE_KEY), dict):
            self._restored = state[STATE_KEY]
        if self.ctx.end_epoch <= self.ctx.start_epoch:
            return False
        self._begin_epoch()
        return True

    def _begin_epoch(self) -> None:
        self._epoch = iter(self.ctx.batches(range(1)))
        next(self._epoch)  # this epoch's timer starts now

    def report(self, metrics: dict, *, checkpoint: Any = None, **_: Any) -> None:
        if self._epoch is None:
            raise StopTrainable()
        epoch = self.ctx.start_epoch + self.reports
        self.reports += 1
        for _ in self._epoch:  # ends the epoch's pass: its time is recorded
            pass
        limit = self.ctx.max_iterations
        more = epoch + 1 < self.ctx.end_epoch and (limit is None or self.reports < limit)
        self.ctx.report(epoch, **_numeric(dict(metrics or {})))
        if checkpoint is not None:
            self._latest = checkpoint
            self.ctx.save_checkpoint({STATE_KEY: _read_directory(checkpoint), "epoch": epoch})
        if not more:
            self._epoch = None
            raise StopTrainable()
        self._begin_epoch()

    def get_checkpoint(self, checkpoint_class: Any) -> Any:
        if self._latest is not None:
            return self._latest
        if self._restored is None:
            return None
        directory = tempfile.mkdtemp(prefix=f"rb-tune-{self.ctx.trial_id}-")
        self._dirs.append(directory)
        for rel, data in self._restored.items():
            target = Path(directory) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return checkpoint_class.from_directory(directory)

    def close(self) -> None:
        if self._epoch is not None and hasattr(self._epoch, "close"):
            self._epoch.close()
        for directory in self._dirs:
            shutil.rmtree(directory, ignore_errors=True)


def _checkpoint_class(module: Any) -> Any:
    cls = getattr(module, "Checkpoint", None)
    if cls is None:  # ray.air.session has none of its own
        cls = getattr(sys.modules.get("ray.train"), "Checkpoint", None)
    return cls


@contextmanager
def _patched(session: _Session, fn: Callable) -> Iterator[None]:
    """Replace the Ray session functions in the Ray modules and in ``fn``'s globals; restore them after."""
    for name in SESSION_MODULES:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - not installed (or its extras missing): nothing to patch there
                continue
    context = _TuneContext(session.ctx)
    swaps: dict[int, Any] = {}  # id(original) -> replacement
    restore: list[tuple[Any, str, Any]] = []
    for name in SESSION_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        cls = _checkpoint_class(module)
        replacements = {
            "report": session.report,
            "get_checkpoint": (lambda cls=cls: session.get_checkpoint(cls)),
            "get_context": (lambda: context),
        }
        for attr, replacement in replacements.items():
            original = getattr(module, attr, None)
            if original is None:
                continue
            swaps.setdefault(id(original), replacement)
            restore.append((module, attr, original))
            setattr(module, attr, replacement)
    namespace = getattr(fn, "__globals__", {})
    for key, value in list(namespace.items()):  # `from ray.tune import report` bound the original
        if id(value) in swaps and any(value is original for _, _, original in restore):
            restore.append((namespace, key, value))
            namespace[key] = swaps[id(value)]
    try:
        yield
    finally:
        for target, attr, original in reversed(restore):
            if isinstance(target, dict):
                target[attr] = original
            else:
                setattr(target, attr, original)


def run_trainable(fn: Callable, config: dict, ctx: Any) -> None:
    """Run a Ray Tune function trainable for ``ctx``'s epochs (see the module docstring)."""
    session = _Session(ctx)
    try:
        if not session.start() or ctx.rank != 0:
            return
        with _patched(session, fn):
            try:
                fn(config)
            except StopTrainable:
                pass
    finally:
        session.close()
