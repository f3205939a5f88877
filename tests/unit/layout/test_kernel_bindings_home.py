"""Each CPU kernel beside its binding: only engine_core/cpu_kernels/ loads a compiled library of ours through ctypes.
Elsewhere a module may ask the table to build (prebuild) or to describe the kernels, or open a system library by
its name (executor/rendezvous.py: libc's prctl), but never loads a kernel, declares a C signature or builds a loader;
that is a binding, and a binding lives in the kernel's folder, next to its C source."""

import ast
import os

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.unit

KERNELS = os.path.join(ROOT, "engine_core", "cpu_kernels")
DECLARATIONS = {"argtypes", "restype"}


def _python_files_outside_the_kernels():
    for package in ("common", "frontend", "engine_core", "benchmarks"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            if os.path.commonpath([folder, KERNELS]) == KERNELS:
                continue
            yield from (os.path.join(folder, name) for name in files if name.endswith(".py"))


def _name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _loads_a_kernel(call: ast.Call, tree_names: dict[str, str]) -> bool:
    """A call of ctypes' loaders on anything but a system library named as a literal (libc.so.6), or of the kernel
    build's or table's loaders (build.load_library, build.build_for, table.loader, table.load)."""
    name = _name(call.func)
    if name in ("CDLL", "PyDLL", "LoadLibrary"):
        first = call.args[0] if call.args else None
        return not (isinstance(first, ast.Constant) and isinstance(first.value, str) and ".so" in first.value
                    and "/" not in first.value)
    if name in ("load_library", "build_for"):
        return True
    if name in ("loader", "load") and isinstance(call.func, ast.Attribute):
        return tree_names.get(_name(call.func.value)) == "engine_core.cpu_kernels.table"
    return False


def test_no_module_outside_cpu_kernels_loads_or_declares_a_kernel_library():
    found = []
    for path in _python_files_outside_the_kernels():
        with open(path) as f:
            tree = ast.parse(f.read())
        aliases = {}  # local name -> the module it names, for `from engine_core.cpu_kernels import table as t`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            where = f"{os.path.relpath(path, ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and _loads_a_kernel(node, aliases):
                found.append(f"{where} loads a library ({ast.unparse(node.func)})")
            elif isinstance(node, ast.Attribute) and node.attr in DECLARATIONS and isinstance(node.ctx, ast.Store):
                found.append(f"{where} declares a C signature ({ast.unparse(node)})")
    assert not found, "ctypes bindings outside engine_core/cpu_kernels/ (move them beside their C source):\n" + \
        "\n".join(found)


def test_each_kernel_folder_holds_its_sources_and_their_bindings():
    """Every C source of the table sits in a folder that also holds Python: the binding that loads it."""
    from engine_core.cpu_kernels import table

    for name, kernel in table.KERNELS.items():
        folder = os.path.dirname(kernel.path)
        assert os.path.exists(kernel.path), f"{name}: {kernel.source} is missing"
        assert os.path.commonpath([folder, KERNELS]) == KERNELS and folder != KERNELS, kernel.source
        assert any(f.endswith(".py") and f != "__init__.py" for f in os.listdir(folder)), f"{folder}: no binding"
