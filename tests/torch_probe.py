"""A trial module that wraps an example's ``train`` so each report says whether its worker has imported torch (the
torch-free examples' tests run it in place of the example's own entry)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def torch_probe(module: str) -> str:
    """The source of ``probe.py``, whose ``train`` runs ``module.train`` and adds ``torch_loaded`` to every report."""
    return textwrap.dedent(f'''\
        import sys

        import {module}


        class Probe:
            """The trial's context, with each report saying whether this worker has imported torch."""

            def __init__(self, ctx):
                self._ctx = ctx

            def __getattr__(self, name):
                return getattr(self._ctx, name)

            def report(self, epoch, **metrics):
                self._ctx.report(epoch, **metrics, torch_loaded=float("torch" in sys.modules))


        def train(config, ctx):
            {module}.train(config, Probe(ctx))
        ''')


def probed_example(example: str, into: Path) -> Path:
    """``examples/<example>.py`` with its profile and spec copied into ``into``, the spec's ``train`` pointed at the
    probe (:func:`torch_probe`); the spec's path."""
    (into / "profiles").mkdir(parents=True)
    shutil.copy(EXAMPLES / f"{example}.py", into)
    shutil.copy(EXAMPLES / "profiles" / f"{example}.json", into / "profiles")
    (into / "probe.py").write_text(torch_probe(example))
    spec = into / f"{example}.yaml"
    spec.write_text((EXAMPLES / f"{example}.yaml").read_text().replace(f"train: {example}:train", "train: probe:train"))
    return spec
