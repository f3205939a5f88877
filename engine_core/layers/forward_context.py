"""Per-step state the attention layers read: set by the model runner around each forward pass.

Passing it through every layer's signature would clutter the model code; a module-level slot
keeps models written like their reference implementations.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.metadata import AttentionMetadata
from engine_core.cpu_kernels.linear.prompt_rows import read_prompt_runs_with
from engine_core.layers.rotary_plan import RotaryPlan


@dataclass
class ForwardContext:
    """One forward pass: its attention metadata (with the backend's plan), the backend, and the rotary
    rows of its positions (built by the first layer, see RotaryPlan)."""
    meta: AttentionMetadata
    backend: AttentionBackend
    rotary: RotaryPlan = field(default_factory=RotaryPlan)
    # LoRA: which rows use which adapter slot (lora/layers.LoRAStep); None: no row uses an adapter
    lora_step: object = None
    # the rows that are prompt tokens, as StepInput.prompt_runs: flat [first row, end row) pairs
    prompt_runs: list[int] = field(default_factory=list)


_current: ForwardContext | None = None


def has_forward_context() -> bool:
    return _current is not None


def get_forward_context() -> ForwardContext:
    assert _current is not None, "attention ran outside a model runner step"
    return _current


@contextmanager
def forward_context(meta: AttentionMetadata, backend: AttentionBackend, lora_step=None,
                    prompt_runs: list[int] = ()):
    global _current
    previous, _current = _current, ForwardContext(meta, backend, lora_step=lora_step, prompt_runs=list(prompt_runs))
    try:
        yield
    finally:
        _current = previous


def lora_step():
    """The step's LoRA rows (lora/layers.LoRAStep); None outside a step or when no row uses an adapter."""
    return _current.lora_step if _current is not None else None


def prompt_runs() -> list[int]:
    """The step's prompt rows as flat [first row, end row) pairs, where the model gives them their own arithmetic
    (the model runner passes them then only); [] outside a step or otherwise."""
    return _current.prompt_runs if _current is not None else []


# the quantized kernels split a matmul's rows by role (cpu_kernels/linear/prompt_rows.py); they sit below the
# layers, so the reader is handed down rather than imported up
read_prompt_runs_with(prompt_runs)
