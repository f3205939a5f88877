"""Picks the attention backend by asking the backends' declared capabilities.

`--attention-backend` is an option: auto, torch, triton or flash_attn. BACKENDS lists every backend,
fastest first; an option is served by the backends that answer to it (the CPU kernels, the generic
CPU kernel and plain torch all answer to torch), auto by all of them. The first that can be had here
(`missing`) and serves the setup (`unsupported_reason`) is taken. So auto is flash_attn on CUDA when
it imports and serves the setup, else triton on CUDA; on CPU the C kernels where they are built and
take the model, else (batch invariance on, the default) the generic CPU kernel, else torch.

Auto passes silently over backends for other devices, ones that cannot be had, and a faster variant
of the option it takes (float32 on CPU: torch without the C kernels); passing over one of another
option that could be had (flash-attn installed, but the block size rules it out) it warns why. An
option asked for by name that none of its backends can serve is a ValueError that says why.
"""

import logging

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.capabilities import AttentionSetup
from engine_core.attention.cpu_generic_backend import CpuGenericAttentionBackend
from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
from engine_core.attention.flash_attn_backend import FlashAttnBackend
from engine_core.attention.torch_backend import TorchAttentionBackend
from engine_core.attention.triton_backend import TritonAttentionBackend

logger = logging.getLogger("nvllm")

BACKENDS: tuple[type[AttentionBackend], ...] = (
    FlashAttnBackend, TritonAttentionBackend, CpuKernelAttentionBackend, CpuGenericAttentionBackend,
    TorchAttentionBackend)
OPTIONS = ("auto", "torch", "triton", "flash_attn")


def select_attention_backend(option: str, setup: AttentionSetup, warn: bool = True) -> AttentionBackend:
    """An instance of the backend for `option` and `setup`; warn: log why auto passed over a backend
    (one rank does, so that the log says it once)."""
    if option not in OPTIONS:
        raise ValueError(f"attention_backend {option!r} is not one of auto, torch, triton, flash_attn")
    backend = auto_backend(setup, warn) if option == "auto" else named_backend(option, setup)
    return backend()


def auto_backend(setup: AttentionSetup, warn: bool = False) -> type[AttentionBackend]:
    """The fastest backend that runs on the setup's device, can be had here and serves the setup."""
    passed_over = []  # (backend, why) of those that run on this device but not this setup
    for backend in BACKENDS:
        if not backend.capabilities.runs_on(setup.device_type):
            continue
        why = backend.unsupported_reason(setup)  # before `missing`: cheap, and it may build a kernel library
        if why is not None:
            passed_over.append((backend, why))
        elif backend.missing() is None:
            if warn:
                for other, reason in passed_over:
                    if other.option != backend.option and other.missing() is None:
                        logger.warning("attention: %s; using the %s backend", reason, backend.option)
            return backend
    raise ValueError(f"no attention backend runs on {setup.device_type}")  # unreachable: torch runs anywhere


def named_backend(option: str, setup: AttentionSetup) -> type[AttentionBackend]:
    """The fastest backend answering to `option` that can be had here and serves the setup (devices it
    runs on only when named count); a ValueError saying why when none does."""
    candidates = [b for b in BACKENDS if b.option == option]
    for backend in candidates:
        if backend.unsupported_reason(setup, named=True) is None and backend.missing() is None:
            return backend
    first = candidates[0]  # the one the option stands for; its reason is the one to give
    missing = first.missing()
    if missing is not None:
        raise ValueError(missing)
    why = first.unsupported_reason(setup, named=True)
    raise ValueError(f"attention_backend {option} cannot run here: {why}. "
                     f"Use --attention-backend {auto_backend(setup).option} (or auto)")
