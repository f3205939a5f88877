"""nvllm's own bfloat16 linear kernel for AVX512-BF16 CPUs (dense_bf16_dot.c), through ctypes.

Against oneDNN's packed bf16 linear on the default model's shapes (2 Zen4 cores, no AMX): 1.5-1.7x
faster at 1-8 rows (decode steps, where the weights stream from memory), 1.07-1.3x at 16-64, the
same at 512 (prefill). Each output row is one fixed-order sum, so a row's result does not depend
on how many rows the step has.

On the amx tier the same panels run on AMX tiles (amx_gemm.c: TDPBF16PS, one fixed order per row at every
row count), a drop-in library with this one's functions; a process the OS refuses the tile state keeps
dense_bf16_dot.c, with the reason in the log. CPUs with AMX keep oneDNN with --no-batch-invariant.
NVLLM_CPU_GEMM=onednn picks oneDNN everywhere.
"""

import ctypes

import torch

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table, tiers
from engine_core.cpu_kernels.amx_grant import amx_granted

LANES = 16  # output columns per packed panel (dense_bf16_dot.c)



def load():
    """The kernel library, or None where it does not apply (no AVX512-BF16, turned off, no compiler;
    AMX present and batch invariance off: oneDNN's AMX kernels are faster, but choose their sum order
    by the row count, so batch-invariant runs keep this kernel on AMX CPUs too)."""
    if (tiers.at_least("amx") and not batch_invariant()) or not table.runs_here("cpu_gemm"):
        return None  # (NVLLM_CPU_GEMM=onednn turns amx_gemm.c off too)
    return _amx_library() or _library()


@table.loader("amx_gemm")
def _amx_library(library):
    """amx_gemm.c: dense_bf16_dot.c's functions on AMX tiles, or None where the tiles are refused."""
    return _declare(library) if amx_granted(library, "bf16 linear layers run dense_bf16_dot.c's AVX512-BF16 panels") else None


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


_library = table.loader("cpu_gemm")(_declare)


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
