"""The frontend's one door into engine_core, which is where torch lives.

The frontend talks to a core over ZeroMQ; only these two uses need the core's code in this
process: the `nvllm` command line registering the core's own commands, and `LLM(multiprocess=False)`
running a core in-process (the benchmarks' torch side is the benchmarks package's own: benchmarks/torch_side/).
Each function imports what it needs when it is called, so importing the frontend never imports torch.
import-linter holds every other frontend module to that (the contracts in pyproject.toml).
"""


def register_core_commands(sub, formatter) -> None:
    """`nvllm engine-core` and `nvllm worker` (their modules load no torch until a command runs). An
    install without the engine core (the frontend image may leave it out) has no such commands."""
    try:
        import engine_core  # noqa: F401
    except ImportError:
        return
    from engine_core.cli import register_commands
    register_commands(sub, formatter)


def start_inproc_core(args):
    """An EngineCore in this process (torch and the model load here)."""
    from engine_core.proc.core import EngineCore
    return EngineCore(args)
