"""What rubberband knows about a cloud lives in that cloud's package (``cloud/aws/``, ``cloud/gcp/``) and in the
catalog data (``rubberband/catalogs/``): nothing else names a cloud to branch on it, and nothing else imports a
cloud's package but the registry, the one router (docs/adding-a-cloud.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rubberband.cloud.registry import CLOUD_PROVIDERS, DESCRIPTORS
from rubberband.clouds import CLOUDS

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("rubberband", "planner", "profiler", "executor", "cloud")
#: Clouds whose names may appear only in their own package.
PACKAGED = ("aws", "gcp")
#: The one module that imports the clouds' packages.
ROUTER = Path("cloud/registry.py")


def _sources() -> list[Path]:
    return [p.relative_to(REPO) for root in SOURCES for p in sorted((REPO / root).rglob("*.py"))]


def _own_package(path: Path) -> str | None:
    return path.parts[1] if path.parts[0] == "cloud" and len(path.parts) > 2 and path.parts[1] in PACKAGED else None


def _names_of_clouds(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant that is a cloud's name (``"aws"``, ``f"...{x == 'gcp'}"`` parts included)."""
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in PACKAGED]


def _imports_of_packages(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            if any(module == f"rubberband.cloud.{c}" or module.startswith(f"rubberband.cloud.{c}.") for c in PACKAGED):
                found.append((node.lineno, module))
    return found


def test_no_module_outside_a_clouds_package_branches_on_its_name():
    offenders = [
        f"{path}:{line}: {value!r}"
        for path in _sources()
        if _own_package(path) is None
        for line, value in _names_of_clouds(ast.parse((REPO / path).read_text(), str(path)))
    ]
    assert offenders == [], "ask the cloud's descriptor (cloud/registry.py) or its facts (rubberband/clouds.py)"


def test_a_clouds_package_names_no_other_cloud():
    offenders = [
        f"{path}:{line}: {value!r}"
        for path in _sources()
        if (own := _own_package(path)) is not None
        for line, value in _names_of_clouds(ast.parse((REPO / path).read_text(), str(path)))
        if value != own
    ]
    assert offenders == []


def test_only_the_registry_imports_a_clouds_package():
    offenders = [
        f"{path}:{line}: {module}"
        for path in _sources()
        if _own_package(path) is None and path != ROUTER
        for line, module in _imports_of_packages(ast.parse((REPO / path).read_text(), str(path)))
    ]
    assert offenders == []


def test_the_check_sees_a_branch(tmp_path):
    tree = ast.parse("def f(cloud):\n    return 1 if cloud == 'gcp' else 2\nfrom rubberband.cloud.aws.boot import X\n")
    assert _names_of_clouds(tree) == [(2, "gcp")]
    assert _imports_of_packages(tree) == [(3, "rubberband.cloud.aws.boot"), (3, "rubberband.cloud.aws.boot.X")]


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_every_cloud_has_facts_and_one_descriptor(name):
    described = DESCRIPTORS[name]
    assert described.facts is CLOUDS[name] or described.facts == CLOUDS[name]
    assert (described.head is not None) == (name in CLOUD_PROVIDERS) == (CLOUDS[name].head is not None)
    assert (described.notice_reader("http://127.0.0.1:9/", 0.1) is None) == (CLOUDS[name].notice_url is None)


def test_the_registry_and_the_facts_know_the_same_clouds():
    assert list(DESCRIPTORS) == list(CLOUDS)
