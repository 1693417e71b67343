"""The architecture's layering, checked on the source: data flows one way and no module imports in a circle.

* ``planner/`` is pure: it imports nothing from the executor, the clouds, the profiler or the CLI;
* ``cloud/`` imports nothing from ``executor/`` nor the CLI (head mode's job, ``rubberband/head_job.py``, sits above
  both and is the one place that knows both);
* the modules' imports — all of them, inside functions too — form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
#: Source folder → its package (pyproject's ``package-dir``).
PACKAGES = {
    "rubberband": "rubberband",
    "planner": "rubberband.planner",
    "profiler": "rubberband.profiler",
    "cloud": "rubberband.cloud",
    "executor": "rubberband.executor",
}
CLI = ("rubberband.cli", "rubberband.commands", "rubberband.head_job")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            if folder == "rubberband" and path.relative_to(REPO / folder).parts[0] in (
                "planner",
                "profiler",
                "cloud",
                "executor",
            ):
                continue  # not there, but be safe
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(path: Path, module: str, *, top_level_only: bool) -> set[str]:
    """Modules of ours that ``module`` imports (``from x import y``: x.y when that is a module, else x)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # ``if TYPE_CHECKING:`` imports are not run
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    package = package.rsplit(".", 1)[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:  # a submodule when it is one, else a name from the module ``base``
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name.startswith("rubberband")}


def _graph(*, top_level_only: bool) -> nx.DiGraph:
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        for target in _imports(path, module, top_level_only=top_level_only):
            # a submodule importing its own package is no cycle: the package is initialised before its submodules
            if target in MODULES and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    return graph


def _offenders(graph: nx.DiGraph, source: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, b in graph.edges
        if a.startswith(source + ".") or a == source
        if any(b == f or b.startswith(f + ".") for f in forbidden)
    )


def test_the_module_list_is_real():
    assert "rubberband.executor.loop" in MODULES and "rubberband.cloud.aws.provider" in MODULES
    assert "rubberband.planner.simulator" in MODULES and "rubberband.cli" in MODULES


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        ("rubberband.planner", ("rubberband.executor", "rubberband.cloud", "rubberband.profiler", *CLI)),
        ("rubberband.cloud", ("rubberband.executor", *CLI)),
        ("rubberband.executor", CLI),
    ],
)
def test_a_layer_imports_nothing_above_it(layer, forbidden):
    assert _offenders(_graph(top_level_only=False), layer, forbidden) == []


def test_no_module_imports_in_a_circle():
    """Every import counts, those inside functions and under ``TYPE_CHECKING`` too: an import moved into a function
    hides a cycle from Python's loader, not from the design."""
    cycles = list(nx.simple_cycles(_graph(top_level_only=False)))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from rubberband.cloud.aws import provider as aws\n")
    assert "rubberband.cloud.aws.provider" in _imports(path, "rubberband.cloud.gcp.provider", top_level_only=False)
