"""The engine core's own commands (`nvllm engine-core`, `nvllm worker`), registered into the `nvllm`
parser by the frontend's seam (frontend/core_link/engine_seam.py). Importing these modules loads no torch: the
model code is imported when a command runs."""

from engine_core.cli.core_cmd import register_engine_core
from engine_core.cli.worker_cmd import register_worker


def register_commands(sub, formatter) -> None:
    register_engine_core(sub, formatter)
    register_worker(sub, formatter)
