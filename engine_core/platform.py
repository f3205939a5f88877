"""Device and dtype choices for this machine."""

import functools

import torch


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but torch sees no CUDA device")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux), empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


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
