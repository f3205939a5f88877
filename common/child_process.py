"""Starting one of our modules in a fresh interpreter (`python -m MODULE ...`): the engine core a
frontend starts, the tensor-parallel ranks a core starts. Arguments go on the command line as text, so
nothing pickled crosses between the processes; the child imports this checkout first."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds common/, engine_core/, frontend/


def checkout_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with this checkout first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn_module(module: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], env=checkout_env(env))
