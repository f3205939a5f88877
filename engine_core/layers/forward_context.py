"""Per-step state the attention layers read: set by the model runner around each forward pass.

Passing it through every layer's signature would clutter the model code; a module-level slot
keeps models written like their reference implementations.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.metadata import AttentionMetadata
from engine_core.layers.rotary_plan import RotaryPlan


@dataclass
class ForwardContext:
    """One forward pass: its attention metadata (with the backend's plan), the backend, and the rotary
    rows of its positions (built by the first layer, see RotaryPlan)."""
    meta: AttentionMetadata
    backend: AttentionBackend
    rotary: RotaryPlan = field(default_factory=RotaryPlan)
    # LoRA: (adapter slot, its rows or None for all) per adapter with rows in the step (lora/manager.py)
    lora_groups: list = field(default_factory=list)


_current: ForwardContext | None = None


def has_forward_context() -> bool:
    return _current is not None


def get_forward_context() -> ForwardContext:
    assert _current is not None, "attention ran outside a model runner step"
    return _current


@contextmanager
def forward_context(meta: AttentionMetadata, backend: AttentionBackend, lora_groups: list | None = None):
    global _current
    previous, _current = _current, ForwardContext(meta, backend, lora_groups=lora_groups or [])
    try:
        yield
    finally:
        _current = previous


def lora_groups() -> list:
    """The step's LoRA row groups; [] outside a step or when no row has an adapter."""
    return _current.lora_groups if _current is not None else []
