"""Linear layers whose GGUF Q4_0 / Q4_1 / Q8_0 weights stay quantized on every CPU tier (quant_dot.c),
in float32 and bfloat16 engines, through ctypes.

Each row of the input is quantized to 8 bits per block of 32 and meets the weight's integers in integer
dot products (llama.cpp's way; vpmaddubsw on AVX2, vpdpbusd with AVX512-VNNI, plain C on the portable
tier), so a decode step reads 4.5-8.5 bits per weight and does a few integer ops per 32 of them. Every
tier gives the same bits, and a row's result depends on that row alone. Where cpu_quant.c runs
(bfloat16 engines on the avx512_bf16 and amx tiers) it serves instead: no rounding of the input.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table
from engine_core.layers.cpu_quant import GGUF_TYPES, QuantizedTensor

_ptr, _long, _int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


@table.loader("quant_dot")
def load(library):
    """The kernel library (every tier), or None where it cannot be built."""
    library.quant_dot_packed_bytes.argtypes = [_int, _long, _long]
    library.quant_dot_packed_bytes.restype = _long
    library.quant_dot_pack.argtypes = [_ptr, _long, _int, _long, _long, _ptr]
    library.quant_dot_pack.restype = _int
    library.quant_dot_linear.argtypes = [_ptr, _int, _long, _long, _long, _ptr, _int, _long, _ptr, _ptr, _int, _long,
                                         _int]
    library.quant_dot_linear.restype = _int
    library.quant_dot_rows.argtypes = [_ptr, _int, _long, _ptr, _long, _ptr, _int]
    library.quant_dot_rows.restype = None
    return library


def can_pack(weight) -> bool:
    return isinstance(weight, QuantizedTensor) and load() is not None


class QuantDotWeight:
    """A quantized weight [N, K] packed for quant_dot.c; `matmul` takes float32 or bfloat16 inputs."""

    kernel = "linear/quant_dot.c"

    def __init__(self, weight: QuantizedTensor):
        library = load()
        assert library is not None
        self._library = library
        self.type_id = GGUF_TYPES[weight.qtype][0]
        self.qtype = weight.qtype
        self.out_features, self.in_features = weight.shape
        size = library.quant_dot_packed_bytes(self.type_id, self.out_features, self.in_features)
        self.panels = torch.empty(size, dtype=torch.uint8, device="cpu")
        rows = weight.rows.contiguous()
        status = library.quant_dot_pack(rows.data_ptr(), rows.shape[1], self.type_id, self.out_features,
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
        """x [..., K] (float32 or bfloat16) @ W^T (+ bias, added in float32) -> [..., N] in x's dtype."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"a quantized linear takes float32 or bfloat16 inputs, not {x.dtype}")
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < self.in_features):
            x2 = x2.contiguous()
        rows = x2.shape[0]
        out = torch.empty((rows, self.out_features), dtype=x.dtype, device="cpu")
        if rows:
            half = int(x.dtype is torch.bfloat16)
            bias32 = None if bias is None else self.float_bias(bias).data_ptr()
            if self._library.quant_dot_linear(x2.data_ptr(), half, rows, self.in_features, x2.stride(0),
                                              self.panels.data_ptr(), self.type_id, self.out_features, bias32,
                                              out.data_ptr(), half, self.out_features, torch.get_num_threads()):
                raise MemoryError("the quantized linear kernel could not allocate its scratch buffers")
        return out.view(*x.shape[:-1], self.out_features)

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Columns `ids` of W dequantized [len(ids), K] (an embedding's rows): d q + m, gguf-py's values."""
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty((ids.numel(), self.in_features), dtype=dtype, device="cpu")
        if ids.numel():
            self._library.quant_dot_rows(self.panels.data_ptr(), self.type_id, self.in_features, ids.data_ptr(),
                                         ids.numel(), out.data_ptr(), int(dtype is torch.bfloat16))
        return out
