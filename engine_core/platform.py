"""Device and dtype choices for this machine."""

import torch

from common.cpu_info import cpu_flags  # noqa: F401 (engine_core's kernels import it from here)


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but torch sees no CUDA device")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def cpu_has_fast_bf16() -> bool:
    return "amx_bf16" in cpu_flags() or "avx512_bf16" in cpu_flags()


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """float32 | bfloat16 | float16 -> the torch dtype."""
    return _DTYPES[name]


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 where it is fast (CUDA with bf16, CPUs with AMX or AVX512-BF16), else float32."""
    if requested != "auto":
        return _DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
