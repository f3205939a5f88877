"""Float32 linear layers whose GGUF Q4_0 / Q4_1 / Q8_0 weights stay quantized, on every CPU tier (quant_exact_f32.c),
through ctypes.

The weights are unpacked to their exact values (d q + m) as the kernel reads them and multiplied with
dense_fixed_order.c's arithmetic, so a row's result is the dequantized float32 model's to the bit while a decode
step reads 5 (Q4) or 8.5 (Q8) bits per weight instead of 32; from a few rows on, slabs of panels are
unpacked once for every row and run at the dense kernel's rate.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear.quant_bf16_dot import QuantizedTensor
from engine_core.cpu_kernels.linear.gguf_packed import GgufPackedWeight, declare_packing
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES

_ptr, _long, _int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


@table.loader("quant_exact_f32")
def load(library):
    """The kernel library (every tier), or None where it cannot be built."""
    declare_packing(library, "quant_f32", [_ptr])
    library.quant_f32_linear.argtypes = [_ptr, _long, _long, _long, _ptr, _int, _long, _ptr, _ptr, _long, _int]
    library.quant_f32_linear.restype = _int
    return library


def can_pack(weight) -> bool:
    return (isinstance(weight, QuantizedTensor) and GGUF_TYPES[weight.qtype].exact_f32_kernel
            and load() is not None)


class QuantF32Weight(GgufPackedWeight):
    """A quantized weight [N, K] packed for quant_exact_f32.c; `matmul` takes float32 inputs."""

    prefix = "quant_f32"
    kernel = "linear/quant_exact_f32.c"
    load = staticmethod(load)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] float32 @ W^T (+ bias, added once after the sum) -> [..., N] float32."""
        if x.dtype is not torch.float32:
            raise TypeError(f"a float32 quantized linear got a {x.dtype} input")
        return self._run(x, bias, torch.float32, lambda x2, rows, bias32, out: self._library.quant_f32_linear(
            x2.data_ptr(), rows, self.in_features, x2.stride(0), self.panels.data_ptr(), self.type_id,
            self.out_features, bias32, out.data_ptr(), self.out_features, torch.get_num_threads()))

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Columns `ids` of W [len(ids), K] in float32 (an embedding's rows): d q + m, gguf-py's values."""
        assert dtype is torch.float32
        ids = self._ids(ids)
        out = torch.empty((ids.numel(), self.in_features), dtype=torch.float32, device="cpu")
        if ids.numel():
            self._library.quant_f32_rows(self.panels.data_ptr(), self.type_id, self.in_features, ids.data_ptr(),
                                         ids.numel(), out.data_ptr())
        return out
