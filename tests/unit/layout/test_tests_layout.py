"""The tests' own layout: test modules live under tests/unit/ or tests/integration/ as their pytestmark says, and
none imports another test module (shared helpers live in tests/support, fixtures in conftest files)."""

import ast
import os

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.unit

TESTS = os.path.join(ROOT, "tests")
KINDS = ("unit", "integration")


def _python_files() -> list[str]:
    """Every .py file below tests/ (data/ holds none), relative to the repository root."""
    found = []
    for folder, dirs, files in os.walk(TESTS):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "data"))
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in sorted(files) if f.endswith(".py")]
    return found


def _is_test_module(path: str) -> bool:
    return os.path.basename(path).startswith("test_")


def _module_name(path: str) -> str:
    return path[:-3].replace(os.sep, ".").removesuffix(".__init__")


def _imported_modules(path: str, root: str = ROOT) -> set[str]:
    """Every module an import statement of the file names, function-level ones too, relative ones resolved."""
    with open(os.path.join(root, path)) as f:
        tree = ast.parse(f.read(), path)
    package = _module_name(path).rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from package import module` may name a module as well as a value
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def _names_a_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[-1] == "conftest" or any(part.startswith("test_") for part in parts)


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path} imports {module}" for path in _python_files() for module in sorted(_imported_modules(path))
                 if _names_a_test_module(module)]
    assert not offenders, "shared helpers belong in tests/support, fixtures in conftest.py:\n" + "\n".join(offenders)


def _markers(path: str, root: str = ROOT) -> set[str]:
    """The pytest.mark.NAME names of the module's `pytestmark` (one mark or a list of them)."""
    with open(os.path.join(root, path)) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            names = set()
            for mark in marks:
                while isinstance(mark, ast.Call):  # pytest.mark.skipif(...)
                    mark = mark.func
                if isinstance(mark, ast.Attribute):
                    names.add(mark.attr)
            return names
    return set()


def test_every_test_module_sits_in_the_folder_its_pytestmark_names():
    wrong = []
    for path in filter(_is_test_module, _python_files()):
        parts = path.split(os.sep)
        folder = parts[1] if len(parts) > 2 else None
        kinds = _markers(path) & set(KINDS)
        if folder not in KINDS or kinds != {folder}:
            wrong.append(f"{path}: in {folder or 'tests/'}, pytestmark says {sorted(kinds) or 'nothing'}")
    assert not wrong, "a test module is unit or integration by its pytestmark, and sits in that folder:\n" + \
        "\n".join(wrong)


@pytest.mark.parametrize("source, offends", [
    ("from tests.integration.engine_core.models.test_moe import pair\n", True),
    ("from tests.integration.engine_core.models import test_moe\n", True),
    ("def f():\n    from tests.unit.engine_core.sched.test_scheduler import FakeModel\n", True),
    ("from .test_gemma import hf\n", True),
    ("from tests.conftest import tiny_models\n", True),
    ("from tests.support.paged_kv_logits import run_step\n", False),
    ("from tests.support import docker_engine\n", False),
])
def test_the_import_check_catches_a_test_module_by_any_spelling(tmp_path, source, offends):
    folder = tmp_path / "tests" / "integration" / "engine_core" / "models"
    folder.mkdir(parents=True)
    (folder / "test_probe.py").write_text(source)
    path = os.path.join("tests", "integration", "engine_core", "models", "test_probe.py")
    assert any(_names_a_test_module(m) for m in _imported_modules(path, str(tmp_path))) == offends


@pytest.mark.parametrize("source, markers", [
    ("import pytest\npytestmark = pytest.mark.unit\n", {"unit"}),
    ("import pytest\npytestmark = [pytest.mark.integration, pytest.mark.skipif(True, reason='x')]\n",
     {"integration", "skipif"}),
    ("import pytest\n\n@pytest.mark.unit\ndef test_a():\n    pass\n", set()),
])
def test_the_marker_check_reads_pytestmark_in_each_form(tmp_path, source, markers):
    (tmp_path / "test_probe.py").write_text(source)
    assert _markers("test_probe.py", str(tmp_path)) == markers
