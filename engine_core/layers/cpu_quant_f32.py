"""Float32 linear layers whose GGUF Q4_0 / Q4_1 / Q8_0 weights stay quantized, on every CPU tier (quant_f32.c),
through ctypes.

The weights are unpacked to their exact values (d q + m) as the kernel reads them and multiplied with
cpu_gemm_f32.c's arithmetic, so a row's result is the dequantized float32 model's to the bit while a decode
step reads 5 (Q4) or 8.5 (Q8) bits per weight instead of 32; from a few rows on, slabs of panels are
unpacked once for every row and run at the dense kernel's rate.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table
from engine_core.layers.cpu_quant import GGUF_TYPES, QuantizedTensor

_ptr, _long, _int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


@table.loader("quant_f32")
def load(library):
    """The kernel library (every tier), or None where it cannot be built."""
    library.quant_f32_packed_bytes.argtypes = [_int, _long, _long]
    library.quant_f32_packed_bytes.restype = _long
    library.quant_f32_pack.argtypes = [_ptr, _long, _int, _long, _long, _ptr]
    library.quant_f32_pack.restype = _int
    library.quant_f32_linear.argtypes = [_ptr, _long, _long, _long, _ptr, _int, _long, _ptr, _ptr, _long, _int]
    library.quant_f32_linear.restype = _int
    library.quant_f32_rows.argtypes = [_ptr, _int, _long, _ptr, _long, _ptr]
    library.quant_f32_rows.restype = None
    return library


def can_pack(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and load() is not None


class QuantF32Weight:
    """A quantized weight [N, K] packed for quant_f32.c; `matmul` takes float32 inputs."""

    kernel = "linear/quant_f32.c"

    def __init__(self, weight: QuantizedTensor):
        library = load()
        assert library is not None
        self._library = library
        self.type_id = GGUF_TYPES[weight.qtype][0]
        self.qtype = weight.qtype
        self.out_features, self.in_features = weight.shape
        size = library.quant_f32_packed_bytes(self.type_id, self.out_features, self.in_features)
        self.panels = torch.empty(size, dtype=torch.uint8, device="cpu")
        rows = weight.rows.contiguous()
        status = library.quant_f32_pack(rows.data_ptr(), rows.shape[1], self.type_id, self.out_features,
                                        self.in_features, self.panels.data_ptr())
        assert status == 0
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        return self.panels.numel()

    def float_bias(self, bias: torch.Tensor) -> torch.Tensor:
        if self._bias is None or self._bias[0] is not bias:
            self._bias = (bias, bias.detach().float().contiguous())
        return self._bias[1]

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] float32 @ W^T (+ bias, added once after the sum) -> [..., N] float32."""
        if x.dtype is not torch.float32:
            raise TypeError(f"a float32 quantized linear got a {x.dtype} input")
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < self.in_features):
            x2 = x2.contiguous()
        rows = x2.shape[0]
        out = torch.empty((rows, self.out_features), dtype=torch.float32, device="cpu")
        if rows:
            bias32 = None if bias is None else self.float_bias(bias).data_ptr()
            if self._library.quant_f32_linear(x2.data_ptr(), rows, self.in_features, x2.stride(0),
                                              self.panels.data_ptr(), self.type_id, self.out_features, bias32,
                                              out.data_ptr(), self.out_features, torch.get_num_threads()):
                raise MemoryError("the quantized linear kernel could not allocate its scratch buffers")
        return out.view(*x.shape[:-1], self.out_features)

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Columns `ids` of W [len(ids), K] in float32 (an embedding's rows): d q + m, gguf-py's values."""
        assert dtype is torch.float32
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty((ids.numel(), self.in_features), dtype=torch.float32, device="cpu")
        if ids.numel():
            self._library.quant_f32_rows(self.panels.data_ptr(), self.type_id, self.in_features, ids.data_ptr(),
                                         ids.numel(), out.data_ptr())
        return out
