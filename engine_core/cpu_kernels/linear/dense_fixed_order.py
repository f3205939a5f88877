"""nvllm's fixed-order linear kernel for any x86-64 CPU (dense_fixed_order.c), through ctypes.

The batch-invariant linear layers where the AVX512-BF16 kernel (dense_linear.py) does not apply: every
float32 linear layer, and bfloat16 ones on CPUs without AVX512-BF16. Each output is one fp32 sum over
k = 0, 1, 2, ... in order (fused multiply-adds), so a row's result does not depend on how many rows
the step has, which tile or thread computed it (oneDNN / MKL choose their blocking, and so their sum
order, by the row count). Plain C with AVX512F or AVX2 intrinsics where the compiler has them.

A float32 weight whose every value is a bfloat16 value (a bf16 checkpoint run in a float32 engine, what
`--dtype auto` gives below avx512_bf16) is stored in bf16 panels and widened as it is read: the same
products and sums, so the same bits, at half the bytes a decode step reads (NVLLM_CPU_BF16_STORAGE=0 keeps
float32 panels).

Compiled with -ffp-contract=off: the bias add and the bf16 rounding must not be fused into a
multiply-add in one inlined copy of the tile code and not in another.
"""

import ctypes
import os

import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear import dense_linear

LANES = 16  # output columns per packed panel (dense_fixed_order.c)
BF16_STORAGE_ENV = "NVLLM_CPU_BF16_STORAGE"


@table.loader("cpu_gemm_f32")
def load(library):
    """The kernel library, or None where it cannot be had (no compiler: logged once)."""
    ptr, long = ctypes.c_void_p, ctypes.c_long
    for name in ("pack_weight_f32", "pack_weight_bf16_generic"):
        getattr(library, name).argtypes = [ptr, long, long, long, ptr]
        getattr(library, name).restype = None
    for name in ("linear_f32", "linear_bf16_generic", "linear_f32_bf16w"):
        getattr(library, name).argtypes = [ptr, long, long, long, ptr, long, ptr, ptr, long, ctypes.c_int]
        getattr(library, name).restype = None
    return library


def stored_as(weight: torch.Tensor) -> torch.dtype:
    """The panels' element type: bf16 for a float32 weight that bf16 holds exactly (lossless), else its own."""
    if (weight.dtype is torch.float32 and os.environ.get(BF16_STORAGE_ENV, "1") != "0"
            and torch.equal(weight, weight.to(torch.bfloat16).float())):
        return torch.bfloat16
    return weight.dtype


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.dtype in (torch.float32, torch.bfloat16) and weight.is_cpu and weight.dim() == 2
            and load() is not None)


class GenericPanelWeight:
    """A [N, K] float32 or bfloat16 weight packed into 16-column panels [ceil(N/16)][K][16], in `storage`
    (stored_as: bf16 for a float32 weight of bf16 values).

    Invariant: matmul's row i depends only on x's row i (and the weight and bias)."""

    kernel = "linear/dense_fixed_order.c"

    def __init__(self, weight: torch.Tensor):
        library = load()
        assert library is not None and can_pack(weight)
        weight = weight.detach().contiguous()
        self.dtype = weight.dtype  # of the inputs and outputs
        self.storage = stored_as(weight)
        if self.storage is not weight.dtype:
            weight = weight.to(self.storage)
        self.out_features, self.in_features = weight.shape
        panels = -(-self.out_features // LANES)
        self.panels = torch.empty(panels * LANES * self.in_features, dtype=self.storage, device="cpu")
        pack = library.pack_weight_f32 if self.storage is torch.float32 else library.pack_weight_bf16_generic
        pack(weight.data_ptr(), self.out_features, self.in_features, self.in_features, self.panels.data_ptr())
        self._kernel = {(torch.float32, torch.float32): library.linear_f32,
                        (torch.float32, torch.bfloat16): library.linear_f32_bf16w,
                        (torch.bfloat16, torch.bfloat16): library.linear_bf16_generic}[self.dtype, self.storage]
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
        return dense_linear.run_panel_kernel(self._kernel, self.panels, self.in_features, self.dtype, x, bias32,
                                         self.out_features)
