"""The house as the docs' architecture page (docs/architecture/index.md) draws it, measured from the code's own
imports: engine_core and the frontend each have fewer files at their top level than packages, no module imports
itself round a circle, no frontend stage imports one above it, and the numbers the page gives are today's."""

import ast
import os
import re
import tomllib

import pytest

from tests.support.doc_pages import page, section
from tests.support.paths import ROOT

PACKAGES = ("common", "frontend", "engine_core", "benchmarks")
pytestmark = pytest.mark.unit


def _modules() -> dict[str, str]:
    """{dotted module name: file} of the three packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                    found[rel.removesuffix(".__init__")] = os.path.join(folder, name)
    return found


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
    """{module: the modules of the three packages it imports, anywhere in its file (lazy imports too)}."""
    graph = {}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module and name not in PACKAGES:
                    targets.add(name)
        graph[module] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _top_level(package: str = "engine_core"):
    entries = sorted(os.listdir(os.path.join(ROOT, package)))
    files = [e for e in entries if e.endswith(".py")]
    packages = [e for e in entries if os.path.isfile(os.path.join(ROOT, package, e, "__init__.py"))]
    return files, packages


def _frontend_layers() -> list[list[str]]:
    """The frontend's stages, top to bottom, as its import-linter contract in pyproject.toml lists them: one list
    of package names per layer."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("containers") == ["frontend"])
    return [re.split(r"\s*[|:]\s*", line.strip()) for line in layers]


def test_engine_core_has_fewer_top_level_files_than_packages():
    files, packages = _top_level()
    assert len(files) < len(packages), (files, packages)


def test_the_frontend_has_fewer_top_level_files_than_packages():
    files, packages = _top_level("frontend")
    assert len(files) < len(packages), (files, packages)


def test_no_frontend_module_imports_itself_round_a_circle():
    graph = {m: {t for t in targets if t.startswith("frontend.")}
             for m, targets in _imports(_modules()).items() if m.startswith("frontend.")}
    assert _circles(graph) == []


def test_every_frontend_package_is_a_stage():
    _, packages = _top_level("frontend")
    staged = {name for layer in _frontend_layers() for name in layer}
    assert set(packages) <= staged, set(packages) - staged


def test_no_frontend_stage_imports_one_above_it():
    """What lint-imports checks with the layers contract, read from the code's own imports (lazy ones too): a
    module of one frontend stage imports only its own stage's modules and those of lower stages."""
    height = {name: i for i, layer in enumerate(_frontend_layers()) for name in layer}

    def stage(module: str):
        parts = module.split(".")
        return height.get(parts[1]) if len(parts) > 1 and parts[0] == "frontend" else None

    upward = [(m, t) for m, targets in _imports(_modules()).items() for t in targets
              if stage(m) is not None and stage(t) is not None and stage(t) < stage(m)]
    assert upward == []


def test_no_module_imports_itself_round_a_circle():
    assert _circles(_imports(_modules())) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_house_page_gives_todays_numbers():
    text = section(page("architecture/index.md"), "engine_core, stage by stage")
    files, packages = _top_level()
    said = re.search(r"(\d+) packages and (\d+) files at its top level", text)
    assert said, "the house page says how many packages and top-level files engine_core has"
    assert (int(said.group(1)), int(said.group(2))) == (len(packages), len(files))
    for name in packages:
        assert f"`{name}/`" in text, f"the house page does not name engine_core/{name}/"


def test_the_house_page_gives_the_frontends_numbers():
    text = section(page("architecture/index.md"), "frontend, stage by stage")
    files, packages = _top_level("frontend")
    said = re.search(r"(\d+) packages and (\d+) files? at its top level", text)
    assert said, "the house page says how many packages and top-level files the frontend has"
    assert (int(said.group(1)), int(said.group(2))) == (len(packages), len(files))
    for name in packages:
        assert f"`{name}/`" in text, f"the house page does not name frontend/{name}/"
