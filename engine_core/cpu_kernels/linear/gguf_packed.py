"""What the CPU kernels that multiply GGUF blocks directly share (quant_int8_rows.c, quant_exact_f32.c): a weight's
GGUF rows packed once by the kernel's own `<prefix>_pack`, its float32 bias, the input rows it reads."""

import ctypes

import torch

from engine_core.cpu_kernels.linear.quant_bf16_dot import QuantizedTensor
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES

_ptr, _long, _int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


def declare_packing(library, prefix: str, rows_out: list) -> None:
    """ctypes signatures of `<prefix>_packed_bytes`, `<prefix>_pack` and `<prefix>_rows` (whose trailing
    arguments after the ids and their count are `rows_out`)."""
    getattr(library, f"{prefix}_packed_bytes").argtypes = [_int, _long, _long]
    getattr(library, f"{prefix}_packed_bytes").restype = _long
    getattr(library, f"{prefix}_pack").argtypes = [_ptr, _long, _int, _long, _long, _ptr]
    getattr(library, f"{prefix}_pack").restype = _int
    getattr(library, f"{prefix}_rows").argtypes = [_ptr, _int, _long, _ptr, _long, *rows_out]
    getattr(library, f"{prefix}_rows").restype = None


class GgufPackedWeight:
    """A quantized weight [N, K] (GGUF rows of a gguf_types type) in a kernel's packed layout."""

    prefix = ""  # the C functions' prefix
    kernel = ""  # the source it runs (cpu_kernels/), for the load log
    load = None  # the kernel library's loader (a table.loader function)
    in_file_layout: frozenset[str] = frozenset()  # types the kernel reads as the file has them: no packed copy

    def __init__(self, weight: QuantizedTensor):
        library = type(self).load()
        assert library is not None
        self._library = library
        self.type_id = GGUF_TYPES[weight.qtype].type_id
        self.qtype = weight.qtype
        self.out_features, self.in_features = weight.shape
        size = getattr(library, f"{self.prefix}_packed_bytes")(self.type_id, self.out_features, self.in_features)
        rows = weight.rows.contiguous()
        if self.qtype in self.in_file_layout and rows.numel() == size:
            self.panels = rows.view(-1)  # the rows are the layout: served as they are, never held twice
        else:
            self.panels = torch.empty(size, dtype=torch.uint8, device="cpu")
            status = getattr(library, f"{self.prefix}_pack")(rows.data_ptr(), rows.shape[1], self.type_id,
                                                             self.out_features, self.in_features,
                                                             self.panels.data_ptr())
            assert status == 0
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        return self.panels.numel()

    def float_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """The bias in float32, converted once (a layer's bias is fixed)."""
        if self._bias is None or self._bias[0] is not bias:
            self._bias = (bias, bias.detach().float().contiguous())
        return self._bias[1]

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] as rows [M, K] the kernels read: contiguous within a row, rows at least K apart."""
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < self.in_features):
            x2 = x2.contiguous()
        return x2

    def _run(self, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, kernel) -> torch.Tensor:
        """x [..., K] -> [..., N] in out_dtype through kernel(x rows, their count, float32 bias pointer or
        None, out), which returns nonzero when it could not get its scratch memory."""
        x2 = self._rows(x)
        rows = x2.shape[0]
        out = torch.empty((rows, self.out_features), dtype=out_dtype, device="cpu")
        if rows:
            bias32 = None if bias is None else self.float_bias(bias).data_ptr()
            if kernel(x2, rows, bias32, out):
                raise MemoryError("the quantized linear kernel could not allocate its scratch buffers")
        return out.view(*x.shape[:-1], self.out_features)

    def _ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.reshape(-1).to(torch.int64).contiguous()
