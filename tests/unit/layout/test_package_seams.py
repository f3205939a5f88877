"""The package seams hold (import-linter's contracts in pyproject.toml) and every import is declared
(deptry, configured in pyproject.toml); both tools really catch what they are there for: a frontend module
that imports torch, even lazily inside a function; an import declared nowhere; a package module that imports
a test-only dependency."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.unit


def _command(name: str) -> str:
    """The command installed beside this interpreter (a venv's bin/, active or not), else on PATH. The test
    extra declares both tools, so a missing one is a failure, never a skip."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def _lint(cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([_command("lint-imports"), "--no-logo", "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _deptry(cwd: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_command("deptry"), ".", "--no-ansi", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


# the packages alone, with the test extra as development dependencies: a test-only import there is DEP004
PACKAGES_ONLY = ("-e", "tests", "-e", r"(^|/)\.", "-e", "build", "-e", "dist",
                 "--optional-dependencies-dev-groups", "test")


def _copy_tree(tmp_path, with_tests: bool = False) -> str:
    for name in ("common", "frontend", "engine_core", "benchmarks") + (("tests",) if with_tests else ()):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    return str(tmp_path)


def test_the_tree_keeps_every_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("frontend/request_path/outputs.py", "\n\ndef _lazy():\n    import torch\n    return torch\n",
     "frontend is not allowed to import torch"),
    ("frontend/request_path/processor.py", "\nfrom engine_core.sched import scheduler\n",
     "frontend is not allowed to import engine_core"),
    ("common/limits.py", "\nimport frontend.request_path.outputs\n", "common is not allowed to import frontend"),
    # engine_core's stages: the scheduler below the worker, the layers below the models, kernels at the bottom
    ("engine_core/sched/request.py", "\nfrom engine_core.worker import model_runner\n",
     "engine_core.sched is not allowed to import engine_core.worker"),
    ("engine_core/layers/norm.py", "\n\ndef _lazy():\n    from engine_core.models import decoder\n",
     "engine_core.layers is not allowed to import engine_core.models"),
    ("engine_core/cpu_kernels/tiers.py", "\nfrom engine_core.platform import device\n",
     "engine_core.cpu_kernels.tiers is not allowed to import engine_core.platform"),
])
def test_a_broken_seam_fails(tmp_path, module, line, contract):
    tree = _copy_tree(tmp_path)
    with open(os.path.join(tree, module), "a") as f:
        f.write(line)
    result = _lint(tree)
    assert result.returncode != 0
    assert contract in result.stdout, result.stdout


@pytest.mark.parametrize("packages_only", [False, True], ids=["packages-and-tests", "packages-alone"])
def test_every_import_is_declared(packages_only):
    result = _deptry(ROOT, *(PACKAGES_ONLY if packages_only else ()))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module, line, packages_only, finding", [
    ("tests/unit/engine_core/sched/test_scheduler.py", "\nimport nvllm_undeclared_pkg\n", False,
     "DEP001 'nvllm_undeclared_pkg' imported but missing from the dependency definitions"),
    ("frontend/request_path/outputs.py", "\n\ndef _lazy():\n    import nvllm_undeclared_pkg\n", False,
     "DEP001 'nvllm_undeclared_pkg' imported but missing"),
    ("engine_core/platform/device.py", "\nimport scipy\n", True, "DEP004 'scipy' imported but declared as a dev dependency"),
])
def test_an_undeclared_import_fails_with_its_name(tmp_path, module, line, packages_only, finding):
    tree = _copy_tree(tmp_path, with_tests=True)
    with open(os.path.join(tree, module), "a") as f:
        f.write(line)
    result = _deptry(tree, *(PACKAGES_ONLY if packages_only else ()))
    assert result.returncode != 0
    assert finding in result.stdout + result.stderr, result.stdout + result.stderr
