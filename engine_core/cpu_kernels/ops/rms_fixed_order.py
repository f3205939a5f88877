"""RMSNorm's per-row statistic in a fixed order (rms_fixed_order.c), for batch-invariant runs on the CPU where
the fused bf16 kernel (fused_ops.py) does not run: float32, and bf16 on CPUs without AVX512.

torch's x.pow(2).mean(-1) splits one row's sum across threads when a step has fewer rows than threads
(and 32768+ elements), so its bits could depend on the row count; see rms_fixed_order.c.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table



@table.loader("rms_fixed_order")
def load(library):
    """The kernel library, or None where it cannot be had (no compiler: logged once)."""
    long = ctypes.c_long
    library.rms_scale_f32.argtypes = [ctypes.c_void_p, long, long, long, ctypes.c_float, ctypes.c_void_p,
                                      ctypes.c_int]
    library.rms_scale_f32.restype = None
    return library


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor | None:
    """1 / sqrt(mean(x^2, -1) + eps) of float32 x [..., n] as [..., 1], each row summed in one fixed
    order; None where the kernel does not apply (another device or dtype, no kernel)."""
    if x.dtype is not torch.float32 or not x.is_cpu or not x.shape[-1]:
        return None
    library = load()
    if library is None:
        return None
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) < n):
        rows = rows.contiguous()
    scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device="cpu")
    if rows.shape[0]:
        library.rms_scale_f32(rows.data_ptr(), rows.shape[0], n, rows.stride(0), eps, scale.data_ptr(),
                              torch.get_num_threads())
    return scale
