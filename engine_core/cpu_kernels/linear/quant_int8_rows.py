"""Linear layers whose GGUF weights (every kept type, cpu_kernels/linear/gguf_types.py) stay quantized on every CPU tier
(quant_int8_rows.c), in float32 and bfloat16 engines, through ctypes.

Each row of the input is quantized to 8 bits per block of 32 (per super-block of 256 for the K-quants, whose
integer sub-block scales then stay inside the integer sums) and meets the weight's integers in integer
dot products (llama.cpp's way; vpmaddubsw on AVX2, vpdpbusd with AVX512-VNNI, plain C on the portable
tier), so a decode step reads 4.5-8.5 bits per weight and does a few integer ops per 32 of them. Every
tier gives the same bits, and a row's result depends on that row alone. Where quant_bf16_dot.c runs
(bfloat16 engines on the avx512_bf16 and amx tiers) it serves instead: no rounding of the input.
"""

import ctypes
import functools

import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.cpu_kernels.linear.quant_bf16_dot import QuantizedTensor
from engine_core.cpu_kernels.linear.prompt_rows import by_role
from engine_core.cpu_kernels.linear.gguf_packed import GgufPackedWeight, declare_packing

_ptr, _long, _int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


@table.loader("quant_int8_rows")
def load(library):
    """The kernel library (every tier), or None where it cannot be built."""
    declare_packing(library, "quant_dot", [_ptr, _int])
    library.quant_dot_linear.argtypes = [_ptr, _int, _long, _long, _long, _ptr, _int, _long, _ptr, _ptr, _int, _long,
                                         _int]
    library.quant_dot_linear.restype = _int
    return library


def can_pack(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and load() is not None


class QuantDotWeight(GgufPackedWeight):
    """A quantized weight [N, K] packed for quant_int8_rows.c; `matmul` takes float32 or bfloat16 inputs."""

    prefix = "quant_dot"
    kernel = "linear/quant_int8_rows.c"
    load = staticmethod(load)
    in_file_layout = frozenset({"q5_0", "q5_1", "q4_k", "q5_k", "q6_k"})  # quant_dot_pack copies them as they are

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] (float32 or bfloat16) @ W^T (+ bias, added in float32) -> [..., N] in x's dtype; in a step
        whose prompt rows have their own arithmetic (forward_context.prompt_runs), a Q5 weight's prompt rows in
        bfloat16 through amx_quant.c's dot_prompt_linear_bf16, as the C decoder loop runs them."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"a quantized linear takes float32 or bfloat16 inputs, not {x.dtype}")
        half = int(x.dtype is torch.bfloat16)

        def every_row(rows_in):
            return self._run(rows_in, bias, x.dtype, lambda x2, rows, bias32, out: self._library.quant_dot_linear(
                x2.data_ptr(), half, rows, self.in_features, x2.stride(0), self.panels.data_ptr(), self.type_id,
                self.out_features, bias32, out.data_ptr(), half, self.out_features, torch.get_num_threads()))

        prompt = self._prompt_library if half else None
        if prompt is None:
            return every_row(x)

        def prompt_rows(rows_in):
            return self._run(rows_in, bias, x.dtype, lambda x2, rows, bias32, out: prompt.dot_prompt_linear_bf16(
                x2.data_ptr(), rows, self.in_features, x2.stride(0), self.panels.data_ptr(), self.type_id,
                self.out_features, bias32, out.data_ptr(), self.out_features, torch.get_num_threads()))

        flat = x.reshape(-1, self.in_features)
        return by_role(flat, every_row, prompt_rows).view(*x.shape[:-1], self.out_features)

    @functools.cached_property
    def _prompt_library(self):
        """amx_quant.c's library where it takes this weight's bfloat16 prompt rows, else None: asked once, as
        QuantPanelWeight asks at construction."""
        return quant_bf16_dot.dot_prompt_library(self.qtype)

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Columns `ids` of W dequantized [len(ids), K] (an embedding's rows): d q + m, gguf-py's values."""
        ids = self._ids(ids)
        out = torch.empty((ids.numel(), self.in_features), dtype=dtype, device="cpu")
        if ids.numel():
            self._library.quant_dot_rows(self.panels.data_ptr(), self.type_id, self.in_features, ids.data_ptr(),
                                         ids.numel(), out.data_ptr(), int(dtype is torch.bfloat16))
        return out
