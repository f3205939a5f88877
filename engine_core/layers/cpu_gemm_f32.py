"""nvllm's fixed-order linear kernel for any x86-64 CPU (cpu_gemm_f32.c), through ctypes.

The batch-invariant linear layers where the AVX512-BF16 kernel (cpu_gemm.py) does not apply: every
float32 linear layer, and bfloat16 ones on CPUs without AVX512-BF16. Each output is one fp32 sum over
k = 0, 1, 2, ... in order (fused multiply-adds), so a row's result does not depend on how many rows
the step has, which tile or thread computed it (oneDNN / MKL choose their blocking, and so their sum
order, by the row count). Plain C with AVX512F or AVX2 intrinsics where the compiler has them.

Compiled with -ffp-contract=off: the bias add and the bf16 rounding must not be fused into a
multiply-add in one inlined copy of the tile code and not in another.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table
from engine_core.layers import cpu_gemm

LANES = 16  # output columns per packed panel (cpu_gemm_f32.c)


@table.loader("cpu_gemm_f32")
def load(library):
    """The kernel library, or None where it cannot be had (no compiler: logged once)."""
    ptr, long = ctypes.c_void_p, ctypes.c_long
    for name in ("pack_weight_f32", "pack_weight_bf16_generic"):
        getattr(library, name).argtypes = [ptr, long, long, long, ptr]
        getattr(library, name).restype = None
    for name in ("linear_f32", "linear_bf16_generic"):
        getattr(library, name).argtypes = [ptr, long, long, long, ptr, long, ptr, ptr, long, ctypes.c_int]
        getattr(library, name).restype = None
    return library


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.dtype in (torch.float32, torch.bfloat16) and weight.is_cpu and weight.dim() == 2
            and load() is not None)


class GenericPanelWeight:
    """A [N, K] float32 or bfloat16 weight packed into 16-column panels [ceil(N/16)][K][16].

    Invariant: matmul's row i depends only on x's row i (and the weight and bias)."""

    kernel = "linear/cpu_gemm_f32.c"

    def __init__(self, weight: torch.Tensor):
        library = load()
        assert library is not None and can_pack(weight)
        weight = weight.detach().contiguous()
        self.dtype = weight.dtype
        self.out_features, self.in_features = weight.shape
        panels = -(-self.out_features // LANES)
        self.panels = torch.empty(panels * LANES * self.in_features, dtype=self.dtype, device="cpu")
        pack = library.pack_weight_f32 if self.dtype is torch.float32 else library.pack_weight_bf16_generic
        pack(weight.data_ptr(), self.out_features, self.in_features, self.in_features, self.panels.data_ptr())
        self._kernel = library.linear_f32 if self.dtype is torch.float32 else library.linear_bf16_generic
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None  # (a bias, its float32 copy)

    @property
    def nbytes(self) -> int:
        return self.panels.numel() * self.panels.element_size()

    def float_bias(self, bias: torch.Tensor) -> torch.Tensor:
        if self._bias is None or self._bias[0] is not bias:
            self._bias = (bias, bias.detach().float().contiguous())
        return self._bias[1]

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ W^T (+ bias, added in fp32 after the sum) -> [..., N], in the weight's dtype."""
        bias32 = None if bias is None else self.float_bias(bias)
        return cpu_gemm.run_panel_kernel(self._kernel, self.panels, self.in_features, self.dtype, x, bias32,
                                         self.out_features)
