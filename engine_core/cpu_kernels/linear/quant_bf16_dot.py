"""Linear layers whose weights stay quantized in memory (quant_bf16_dot.c), through ctypes.

A weight arrives as its GGUF rows (uint8 [N, row bytes], Q4_0, Q4_1 or Q8_0, blocks of 32 inputs) or as a
bf16/float weight to quantize per channel to int8 (`--quantization int8`, kept as Q8_0 blocks whose scale
is the channel's). It is packed once into panels of 16 columns and never dequantized as a whole: decode
steps read 5 (Q4) or 8.5 (Q8) bits per weight instead of bf16's 16. Needs the same CPU as dense_linear.py
(AVX512-BF16; on AMX CPUs only batch-invariant runs; the kernel reuses dense_bf16_dot.c's bf16 tiles for prefills).
On the amx tier amx_quant.c serves instead, a drop-in library with this one's functions and packed layout: the
inputs as 16-bit integers per block, so every block sum is an exact integer (vpdpwssd register tiles for up to 64
rows, AMX tiles for more, the same bits), 1.5-2x this file's kernels at every row count, and for a step's prompt
tokens (forward_context.prompt_runs; the C decoder loop splits rows alike) the dequantized model's arithmetic on AMX
tiles, at the dense tiles' rate; quant_vnni.c (8-bit inputs, its own layout) where opted in with
NVLLM_CPU_QUANT_VNNI=1.
"""

import ctypes
import os

import torch

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.amx_grant import amx_granted
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.cpu_kernels.linear.prompt_rows import by_role
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES

BLOCK = 32  # inputs per quantized block of the Q4/Q5/Q8 types (a K-quant's super-block holds 256)


def load():
    """The kernel library (AVX512-BF16 tier: quant_bf16_dot.c; amx: amx_quant.c, or quant_vnni.c where opted in), or
    None where it cannot be had."""
    return _vnni_library() or _amx_library() or _library()


@table.loader("quant_vnni")
def _vnni_library(library):
    return _declare(library)


@table.loader("amx_quant")
def _amx_library(library):
    granted = amx_granted(library, "kept-quantized layers run quant_bf16_dot.c's AVX512-BF16 kernels")
    if not granted:
        return None
    ptr, long, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    library.quant_prompt_linear_bf16.argtypes = [ptr, long, long, long, ptr, int_, long, ptr, ptr, long, int_]
    library.quant_prompt_linear_bf16.restype = int_
    library.quant_prompt_linear_silu_mul_bf16.argtypes = [ptr, long, long, long, ptr, int_, long, ptr, ptr, long,
                                                          ptr, int_]
    library.quant_prompt_linear_silu_mul_bf16.restype = int_
    library.dot_prompt_linear_bf16.argtypes = [ptr, long, long, long, ptr, int_, long, ptr, ptr, long, int_]
    library.dot_prompt_linear_bf16.restype = int_
    return _declare(library)


def _declare(library):
    """The ctypes signatures of quant_bf16_dot.c's functions (quant_vnni.c has the same)."""
    ptr, long, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    library.quant_packed_bytes.argtypes = [int_, long, long]
    library.quant_packed_bytes.restype = long
    library.quant_pack.argtypes = [ptr, long, int_, long, long, int_, ptr]
    library.quant_pack.restype = int_
    library.quant_linear_bf16.argtypes = [ptr, long, long, long, ptr, int_, long, ptr, ptr, long, int_, int_]
    library.quant_linear_bf16.restype = int_
    library.quant_linear_silu_mul_bf16.argtypes = [ptr, long, long, long, ptr, int_, long, ptr, ptr, long, ptr,
                                                   int_, int_]
    library.quant_linear_silu_mul_bf16.restype = int_
    library.quant_rows_bf16.argtypes = [ptr, int_, long, ptr, long, ptr]
    library.quant_rows_bf16.restype = None
    return library


_library = table.loader("quant_bf16_dot")(_declare)


def has_prompt_arithmetic(library) -> bool:
    """Whether a loaded kernel library gives prompt rows their own arithmetic (amx_quant.c's
    quant_prompt_linear_bf16): the engine then keys cached blocks by which rows were prompt rows.
    NVLLM_CPU_PROMPT_TILES=0 keeps every row on the integer arithmetic (and every cached block shareable)."""
    return (library is not None and library is _amx_library()
            and os.environ.get("NVLLM_CPU_PROMPT_TILES", "1") != "0")


# quant_int8_rows.c's types whose prompt rows amx_quant.c's dot_prompt_linear_bf16 takes (the K-quants' prompts keep
# quant_int8_rows.c's int8 tiles, one arithmetic for every row)
DOT_PROMPT_TYPES = frozenset({"q5_0", "q5_1"})


def dot_prompt_library(qtype: str):
    """The library whose dot_prompt_linear_bf16 runs the prompt rows of a quant_int8_rows.c weight of `qtype`, or None
    where those rows keep quant_int8_rows.c's arithmetic."""
    library = load()
    return library if qtype in DOT_PROMPT_TYPES and has_prompt_arithmetic(library) else None


class QuantizedTensor:
    """A weight [N, K] as GGUF rows: `rows` uint8 [N, K / block inputs * block bytes] of type `qtype`."""

    def __init__(self, rows: torch.Tensor, qtype: str, in_features: int):
        if qtype not in GGUF_TYPES:
            raise ValueError(f"quantization type {qtype!r} not supported (supported: {', '.join(GGUF_TYPES)})")
        kind = GGUF_TYPES[qtype]
        if not kind.fits(in_features) or rows.shape[1] != kind.row_bytes(in_features):
            raise ValueError(f"a {qtype} weight of {in_features} inputs cannot have rows of {rows.shape[1]} bytes")
        self.rows, self.qtype, self.in_features = rows, qtype, in_features
        self.shape = (rows.shape[0], in_features)


def quantize_int8(weight: torch.Tensor) -> QuantizedTensor:
    """Per-channel symmetric int8 of a [N, K] weight (K a multiple of 32), as Q8_0 rows whose blocks all
    carry the channel's scale (max |w| / 127, in fp16, the scale the integers are rounded with)."""
    w = weight.detach().float()
    n, k = w.shape
    scale = (w.abs().amax(dim=1) / 127).clamp(min=2.0 ** -24).half()
    q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    blocks = torch.empty((n, k // BLOCK, 34), dtype=torch.uint8)
    blocks[:, :, :2] = scale.view(torch.uint8).view(n, 1, 2)
    blocks[:, :, 2:] = q.view(torch.uint8).view(n, k // BLOCK, BLOCK)
    return QuantizedTensor(blocks.view(n, -1), "q8_0", k)


def can_pack(weight) -> bool:
    return (isinstance(weight, QuantizedTensor) and GGUF_TYPES[weight.qtype].cpu_quant_format is not None
            and load() is not None)


class QuantPanelWeight(dense_linear.PanelWeight):
    """A quantized weight packed into quant_bf16_dot.c's panels; `matmul` as dense_linear.PanelWeight's."""

    gated = 0
    kernel = "linear/quant_bf16_dot.c"

    def __init__(self, weight: QuantizedTensor):
        library = load()
        assert library is not None
        type_id, self.format = GGUF_TYPES[weight.qtype].type_id, GGUF_TYPES[weight.qtype].cpu_quant_format
        self.qtype = weight.qtype
        self.out_features, self.in_features = weight.shape
        size = library.quant_packed_bytes(self.format, self.out_features, self.in_features)
        self.panels = torch.empty(size, dtype=torch.uint8, device="cpu")
        rows = weight.rows.contiguous()
        status = library.quant_pack(rows.data_ptr(), rows.shape[1], type_id, self.out_features, self.in_features,
                                    self.gated, self.panels.data_ptr())
        assert status == 0
        self._bias = None
        self._linear = self._kernel(library.quant_linear_bf16)
        # amx_quant.c's arithmetic for prompt rows (the dequantized model's, on AMX tiles); None elsewhere
        self._prompt_linear = (self._kernel(library.quant_prompt_linear_bf16, takes_alike=False)
                               if has_prompt_arithmetic(library) else None)
        if library is _vnni_library():
            self.kernel = "linear/quant_vnni.c"
        elif library is _amx_library():
            self.kernel = "linear/amx_quant.c"

    def _kernel(self, function, takes_alike: bool = True):
        """`function` with the packed format filled in, taking dense_linear's kernel arguments; raises when the
        kernel could not get its scratch memory. takes_alike: it takes the batch-invariance flag."""

        def call(x, rows, k, x_stride, panels, width, bias, out, out_stride, *rest):
            *extra, threads = rest  # batch-invariant: the same arithmetic at every row count (quant_bf16_dot.c)
            alike = (int(batch_invariant()),) if takes_alike else ()
            if function(x, rows, k, x_stride, panels, self.format, width, bias, out, out_stride, *extra, *alike,
                        threads):
                raise MemoryError("the quantized linear kernel could not allocate its scratch buffers")
        return call

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W^T (+ bias); in a step whose prompt rows have their own arithmetic (forward_context.prompt_runs),
        those rows through it, as the C decoder loop runs them."""
        return self._by_role(self._linear, self._prompt_linear, x, bias, self.out_features)

    def _by_role(self, kernel, prompt_kernel, x: torch.Tensor, bias, width: int, *extra) -> torch.Tensor:
        return by_role(x, lambda rows: self._run(kernel, rows, bias, width, *extra),
                       prompt_kernel and (lambda rows: self._run(prompt_kernel, rows, bias, width, *extra)))

    def prompt_matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """matmul with the arithmetic of prompt rows, for every row, where the kernel has one (amx_quant.c: the
        dequantized model's weights on AMX tiles)."""
        assert self._prompt_linear is not None, "this kernel has one arithmetic for every row"
        return self._run(self._prompt_linear, x, bias, self.out_features)

    def rows_of(self, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Columns `ids` of W, dequantized to bf16 [len(ids), K] (the rows of an embedding; `dtype`: the
        engine's, always bf16 where these panels serve)."""
        assert dtype is torch.bfloat16
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty((ids.numel(), self.in_features), dtype=torch.bfloat16, device="cpu")
        if ids.numel():
            load().quant_rows_bf16(self.panels.data_ptr(), self.format, self.in_features, ids.data_ptr(),
                                     ids.numel(), out.data_ptr())
        return out


class GatedQuantPanelWeight(QuantPanelWeight):
    """A quantized gate/up weight [2I, K] (I a multiple of 32); `silu_and_mul` as dense_linear.GatedPanelWeight's."""

    gated = 1

    def __init__(self, weight: QuantizedTensor, silu_table: torch.Tensor):
        assert weight.shape[0] % (4 * dense_linear.LANES) == 0
        super().__init__(weight)
        self.silu_table = silu_table
        self.intermediate = self.out_features // 2
        self._bias_order = dense_linear.gated_bias_order(self.out_features)
        self._gated = self._kernel(load().quant_linear_silu_mul_bf16)
        self._prompt_gated = (self._kernel(load().quant_prompt_linear_silu_mul_bf16, takes_alike=False)
                              if self._prompt_linear is not None else None)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise TypeError("a gated packed weight gives silu(gate) * up only: call silu_and_mul")

    def silu_and_mul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._by_role(self._gated, self._prompt_gated, x, bias, self.intermediate, self.silu_table.data_ptr())

    def prompt_silu_and_mul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """silu_and_mul with the arithmetic of prompt rows (prompt_matmul's)."""
        assert self._prompt_gated is not None, "this kernel has one arithmetic for every row"
        return self._run(self._prompt_gated, x, bias, self.intermediate, self.silu_table.data_ptr())
