"""The package seams hold (import-linter's contracts in pyproject.toml), and the tool really catches a
frontend module that imports torch, even lazily inside a function."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = shutil.which("lint-imports")
pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[test]')")]


def _lint(cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-logo", "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300)


def _copy_tree(tmp_path) -> str:
    for name in ("common", "frontend", "engine_core"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    return str(tmp_path)


def test_the_tree_keeps_every_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("frontend/outputs.py", "\n\ndef _lazy():\n    import torch\n    return torch\n",
     "frontend is not allowed to import torch"),
    ("frontend/processor.py", "\nfrom engine_core import scheduler\n",
     "frontend is not allowed to import engine_core"),
    ("common/limits.py", "\nimport frontend.outputs\n", "common is not allowed to import frontend"),
])
def test_a_broken_seam_fails(tmp_path, module, line, contract):
    tree = _copy_tree(tmp_path)
    with open(os.path.join(tree, module), "a") as f:
        f.write(line)
    result = _lint(tree)
    assert result.returncode != 0
    assert contract in result.stdout, result.stdout
