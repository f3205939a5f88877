"""Device and dtype choices for this machine."""

import torch

from engine_core.cpu_kernels import tiers


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but torch sees no CUDA device")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def cpu_has_fast_bf16() -> bool:
    """bf16 dot products in hardware (the active tier: NVLLM_CPU_ISA=avx2 makes an AMX CPU answer no)."""
    return tiers.at_least("avx512_bf16")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """float32 | bfloat16 | float16 -> the torch dtype."""
    return _DTYPES[name]


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 where it is fast (CUDA with bf16, the CPU tiers avx512_bf16 and amx), else float32."""
    if requested != "auto":
        return _DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
