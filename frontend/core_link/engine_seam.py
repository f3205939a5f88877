"""The frontend's one door into engine_core, which is where torch lives.

The frontend talks to a core over ZeroMQ; only these few uses need the core's code in this
process: the `nvllm` command line registering the core's own commands, `LLM(multiprocess=False)`
running a core in-process, and the benchmarks' torch baselines. Each function imports what it needs
when it is called, so importing the frontend never imports torch. import-linter holds every other
frontend module to that (the contracts in pyproject.toml).
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


def random_model_folder(name: str, **overrides) -> str:
    """A random-weight model of a named shape, written once into the model cache (bench throughput)."""
    from engine_core.bench.random_model import random_model_folder as folder
    return folder(name, **overrides)


def hf_generate_seconds(model: str | None, device: str, prompts: list[list[int]], out_lens: list[int],
                        dtype: str) -> float:
    """transformers' batched generate on a workload (bench throughput --backend hf)."""
    from engine_core.bench.hf_baseline import hf_generate_seconds as seconds
    return seconds(model, device, prompts, out_lens, dtype)


def random_lora_adapters(model: str | None, count: int, rank: int) -> list[str]:
    """Folders of random PEFT LoRA adapters for a model (bench throughput --lora-adapters)."""
    from engine_core.bench.random_lora import random_lora_adapters as adapters
    return adapters(model, count, rank)
