"""A bench script (``bench/<name>.py``) imported as a module for its tests, and forgotten after them."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


@contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """``bench/<name>.py`` loaded as the module ``name`` (its dataclasses look their module up in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
