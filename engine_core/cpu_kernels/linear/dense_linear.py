"""Dense linear layers on nvllm's own kernels, through ctypes: one binding for both dtypes.

bfloat16 on AVX512-BF16 CPUs: dense_bf16_dot.c (PanelWeight, GatedPanelWeight; amx_gemm.c on the amx tier).
Against oneDNN's packed bf16 linear on the default model's shapes (2 Zen4 cores, no AMX): 1.5-1.7x
faster at 1-8 rows (decode steps, where the weights stream from memory), 1.07-1.3x at 16-64, the
same at 512 (prefill). Each output row is one fixed-order sum, so a row's result does not depend
on how many rows the step has.

On the amx tier the same panels run on AMX tiles (amx_gemm.c: TDPBF16PS, one fixed order per row at every
row count), a drop-in library with this one's functions; a process the OS refuses the tile state keeps
dense_bf16_dot.c, with the reason in the log. CPUs with AMX keep oneDNN with --no-batch-invariant.
NVLLM_CPU_GEMM=onednn picks oneDNN everywhere.

Float32 on every tier, and bfloat16 below avx512_bf16: dense_fixed_order.c (GenericPanelWeight, load_fixed_order,
can_pack_fixed_order), the batch-invariant linear layers where the AVX512-BF16 kernel does not apply: every
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

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table, tiers
from engine_core.cpu_kernels.amx_grant import amx_granted

LANES = 16  # output columns per packed panel (dense_bf16_dot.c and dense_fixed_order.c)
BF16_STORAGE_ENV = "NVLLM_CPU_BF16_STORAGE"


def load():
    """The kernel library, or None where it does not apply (no AVX512-BF16, turned off, no compiler;
    AMX present and batch invariance off: oneDNN's AMX kernels are faster, but choose their sum order
    by the row count, so batch-invariant runs keep this kernel on AMX CPUs too)."""
    if (tiers.at_least("amx") and not batch_invariant()) or not table.runs_here("dense_bf16_dot"):
        return None  # (NVLLM_CPU_GEMM=onednn turns amx_gemm.c off too)
    return _amx_library() or _library()


@table.loader("amx_gemm")
def _amx_library(library):
    """amx_gemm.c: dense_bf16_dot.c's functions on AMX tiles, or None where the tiles are refused."""
    granted = amx_granted(library, "bf16 linear layers run dense_bf16_dot.c's AVX512-BF16 panels")
    return _declare(library) if granted else None


def _declare(library):
    """The ctypes signatures of dense_bf16_dot.c's functions (amx_gemm.c has the same)."""
    ptr, long = ctypes.c_void_p, ctypes.c_long
    library.pack_weight_bf16.argtypes = [ptr, long, long, long, ptr]
    library.pack_weight_bf16.restype = None
    library.linear_bf16.argtypes = [ptr, long, long, long, ptr, long, ptr, ptr, long, ctypes.c_int]
    library.linear_bf16.restype = None
    library.pack_gated_weight_bf16.argtypes = [ptr, long, long, long, ptr]
    library.pack_gated_weight_bf16.restype = None
    library.linear_silu_mul_bf16.argtypes = [ptr, long, long, long, ptr, long, ptr, ptr, long, ptr, ctypes.c_int]
    library.linear_silu_mul_bf16.restype = None
    return library


_library = table.loader("dense_bf16_dot")(_declare)


class PanelWeight:
    """A [N, K] bf16 weight (K even) packed into 16-column panels."""

    _bias_order: torch.Tensor | None = None  # the output column of each packed column, where they differ
    kernel = "linear/dense_bf16_dot.c"  # the source it runs (cpu_kernels/), for the load log

    def __init__(self, weight: torch.Tensor):
        library = load()
        assert library is not None and weight.dtype is torch.bfloat16 and weight.shape[1] % 2 == 0
        weight = weight.detach().contiguous()
        self.out_features, self.in_features = weight.shape
        panels = -(-self.out_features // LANES)
        self.panels = torch.empty(panels * LANES * self.in_features, dtype=torch.bfloat16, device="cpu")
        self._pack(library, weight)
        self._library = library  # resolved once: load() checks the CPU and the batch-invariance switch
        if library is _amx_library():
            self.kernel = "linear/amx_gemm.c"
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None  # (a bias, its float32 copy)

    def _pack(self, library, weight: torch.Tensor) -> None:
        library.pack_weight_bf16(weight.data_ptr(), self.out_features, self.in_features, self.in_features,
                                 self.panels.data_ptr())

    @property
    def nbytes(self) -> int:
        """Bytes the packed weight takes (and a step that multiplies with it reads)."""
        return self.panels.numel() * self.panels.element_size()

    def float_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """The bias in float32, in the panels' column order (converted once: a layer's bias is fixed)."""
        if self._bias is None or self._bias[0] is not bias:
            converted = bias.detach().float()
            if self._bias_order is not None:
                converted = converted[self._bias_order]
            self._bias = (bias, converted.contiguous())
        return self._bias[1]

    def _run(self, kernel, x: torch.Tensor, bias: torch.Tensor | None, width: int, *extra) -> torch.Tensor:
        bias32 = None if bias is None else self.float_bias(bias)
        return run_panel_kernel(kernel, self.panels, self.in_features, torch.bfloat16, x, bias32, width, *extra)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] bf16 @ W^T (+ bias, added in float32 before rounding) -> [..., N] bf16."""
        return self._run(self._library.linear_bf16, x, bias, self.out_features)


class GatedPanelWeight(PanelWeight):
    """A gate/up weight [2I, K] (gate rows, then up rows) packed so that one call returns
    silu(x @ gate^T) * (x @ up^T), [..., I]: the [.., 2I] matmul output is never stored, and the
    result equals the unfused linear followed by silu_and_mul bit for bit (dense_bf16_dot.c)."""

    def __init__(self, weight: torch.Tensor, silu_table: torch.Tensor):
        assert weight.shape[0] % (4 * LANES) == 0
        self.silu_table = silu_table
        super().__init__(weight)
        self.intermediate = self.out_features // 2
        self._bias_order = gated_bias_order(self.out_features)

    def _pack(self, library, weight: torch.Tensor) -> None:
        library.pack_gated_weight_bf16(weight.data_ptr(), self.out_features // 2, self.in_features,
                                       self.in_features, self.panels.data_ptr())

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise TypeError("a gated packed weight gives silu(gate) * up only: call silu_and_mul")

    def silu_and_mul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """silu(x @ gate^T + gate bias) * (x @ up^T + up bias) -> [..., I] bf16."""
        return self._run(self._library.linear_silu_mul_bf16, x, bias, self.intermediate, self.silu_table.data_ptr())


def run_panel_kernel(kernel, panels: torch.Tensor, in_features: int, dtype: torch.dtype, x: torch.Tensor,
                     bias32: torch.Tensor | None, width: int, *extra) -> torch.Tensor:
    """`kernel` of a panel-packed weight (arguments: x, rows, K, x's row stride, panels, width, float32 bias
    or NULL, out, out's row stride, `extra`, threads) over x [..., K] -> [..., width] in `dtype`."""
    if x.dtype is not dtype:
        raise TypeError(f"a packed {str(dtype).removeprefix('torch.')} linear got a {x.dtype} input")
    x2 = x.reshape(-1, in_features)
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < in_features):
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, width), dtype=dtype, device="cpu")
    if rows:
        kernel(x2.data_ptr(), rows, in_features, x2.stride(0), panels.data_ptr(), width,
               None if bias32 is None else bias32.data_ptr(), out.data_ptr(), width, *extra, torch.get_num_threads())
    return out.view(*x.shape[:-1], width)


def gated_bias_order(width: int) -> torch.Tensor:
    """The column of a gate/up output [2I] at each place of the gated kernels' bias: the gate and up
    columns of 32 outputs side by side, as the panels hold them."""
    n = torch.arange(width).view(-1, 2 * LANES)
    return torch.stack([n[: len(n) // 2], n[len(n) // 2:]], dim=1).flatten()


def can_pack_gated(weight: torch.Tensor) -> bool:
    """A gate/up weight [2I, K] whose I is a whole number of gated tiles (32 columns)."""
    return can_pack(weight) and weight.shape[0] % (4 * LANES) == 0


def can_pack(weight: torch.Tensor) -> bool:
    return (load() is not None and weight.dtype is torch.bfloat16 and weight.is_cpu and weight.dim() == 2
            and weight.shape[1] % 2 == 0)


# dense_fixed_order.c: float32 engines, and bfloat16 ones below avx512_bf16


@table.loader("dense_fixed_order")
def load_fixed_order(library):
    """dense_fixed_order.c's library (every tier), or None where it cannot be had (no compiler: logged once)."""
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


def can_pack_fixed_order(weight: torch.Tensor) -> bool:
    return (weight.dtype in (torch.float32, torch.bfloat16) and weight.is_cpu and weight.dim() == 2
            and load_fixed_order() is not None)


class GenericPanelWeight:
    """A [N, K] float32 or bfloat16 weight packed into 16-column panels [ceil(N/16)][K][16], in `storage`
    (stored_as: bf16 for a float32 weight of bf16 values).

    Invariant: matmul's row i depends only on x's row i (and the weight and bias)."""

    kernel = "linear/dense_fixed_order.c"

    def __init__(self, weight: torch.Tensor):
        library = load_fixed_order()
        assert library is not None and can_pack_fixed_order(weight)
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
        return run_panel_kernel(self._kernel, self.panels, self.in_features, self.dtype, x, bias32, self.out_features)
