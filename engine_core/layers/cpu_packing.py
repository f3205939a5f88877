"""Linear layers on the CPU with each weight packed once at load, through the kernels' bindings
(cpu_kernels/linear/): this module picks the packed form; the bindings load and call the kernels.

bfloat16: where the CPU has AVX512-BF16 (and no AMX, or batch invariance on), weights go into
nvllm's own panels (dense_bf16_dot.c): faster than oneDNN for the few rows of decode steps, as fast for
prefills, and a fixed reduction order per row. Batch-invariant runs on CPUs without AVX512-BF16 take
the generic fixed-order kernel (dense_fixed_order.c) instead. Elsewhere (--no-batch-invariant) oneDNN
reorders the weight into the blocked layout its bf16 (AMX / AVX512-BF16) kernels read; plain F.linear
would do that reorder on every call. oneDNN's bf16 path needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: an
AVX2-only CPU, which oneDNN refuses at the first reorder, takes the generic kernel with or without
batch invariance.

float32: packed only when batch-invariant, into the generic kernel's fp32 panels (MKL's F.linear picks
its blocking, and so a row's sum order, by the row count); --no-batch-invariant keeps F.linear.

The packed copy replaces the weight (which is freed, except a tied LM head's, which the embedding
still reads).
"""

import logging

import torch
import torch.nn.functional as F

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot, quant_exact_f32, quant_int8_rows
from engine_core.layers.quant_pieces import PiecewiseQuantWeight, QuantizedPieces

logger = logging.getLogger("nvllm")

BATCH_HINT = 32  # the row count oneDNN tunes its packed layout for; any row count works


class OneDnnWeight:
    """A weight in oneDNN's blocked layout."""

    kernel = "oneDNN"

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


PackedWeight = (dense_linear.PanelWeight | dense_linear.GenericPanelWeight | OneDnnWeight
                | quant_int8_rows.QuantDotWeight | quant_exact_f32.QuantF32Weight | PiecewiseQuantWeight)
QuantizedPack = (quant_bf16_dot.QuantPanelWeight | quant_int8_rows.QuantDotWeight | quant_exact_f32.QuantF32Weight
                 | PiecewiseQuantWeight)


def keeps_quantized(dtype: torch.dtype) -> bool:
    """Whether a quantized kernel serves linear layers of a `dtype` engine on this tier."""
    return ((dtype is torch.bfloat16 and quant_bf16_dot.load() is not None)
            or (dtype is torch.float32 and quant_exact_f32.load() is not None)
            or (dtype in (torch.float32, torch.bfloat16) and quant_int8_rows.load() is not None))


def pack_quantized(weight: quant_bf16_dot.QuantizedTensor | QuantizedPieces,
                   dtype: torch.dtype) -> QuantizedPack | None:
    """A quantized weight packed for the kernel that serves a `dtype` engine, or None where none does:
    float32, quant_exact_f32.c (the dequantized model's results, to the bit); bfloat16, quant_bf16_dot.c's bf16 panels
    on the avx512_bf16 and amx tiers; else, and for the types only it takes, quant_int8_rows.c (8-bit input rows,
    integer dot products). A fused weight of pieces of different types packs each piece so."""
    if isinstance(weight, QuantizedPieces):
        packs = [pack_quantized(piece, dtype) for piece in weight.pieces]
        return None if None in packs else PiecewiseQuantWeight(packs)
    if dtype is torch.float32 and quant_exact_f32.can_pack(weight):
        return quant_exact_f32.QuantF32Weight(weight)
    if dtype is torch.bfloat16 and quant_bf16_dot.can_pack(weight):
        return quant_bf16_dot.QuantPanelWeight(weight)
    if dtype in (torch.float32, torch.bfloat16) and quant_int8_rows.can_pack(weight):
        return quant_int8_rows.QuantDotWeight(weight)
    return None


def can_pack_quantized(weight: quant_bf16_dot.QuantizedTensor | QuantizedPieces, dtype: torch.dtype) -> bool:
    """Whether pack_quantized has a kernel for this weight in a `dtype` engine (asked before the float weights
    load: a layer that will be kept quantized is never given floats)."""
    if isinstance(weight, QuantizedPieces):
        return all(can_pack_quantized(piece, dtype) for piece in weight.pieces)
    return ((dtype is torch.float32 and quant_exact_f32.can_pack(weight))
            or (dtype is torch.bfloat16 and quant_bf16_dot.can_pack(weight))
            or (dtype in (torch.float32, torch.bfloat16) and quant_int8_rows.can_pack(weight)))


def _onednn_bf16_runs() -> bool:
    """oneDNN is built in and its bf16 kernels run on this CPU (torch's own test for the ISA it needs)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _generic_first() -> bool:
    """Whether the generic fixed-order panels come before oneDNN: batch invariance asks for them, and
    they are what an AVX2 CPU has for bf16 anyway."""
    return batch_invariant() or not _onednn_bf16_runs()


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model of this device and dtype gets packed weights (pack_model) at load."""
    if device.type != "cpu":
        return False
    if dtype == torch.float32:
        return batch_invariant() and dense_linear.load_fixed_order() is not None
    return dtype == torch.bfloat16 and (_onednn_bf16_runs()
                                        or (_generic_first() and dense_linear.load_fixed_order() is not None))


def pack(weight: torch.Tensor) -> PackedWeight:
    """The packed copy of a 2-D CPU weight: nvllm's AVX512-BF16 panels where they run, else (batch-invariant,
    or a CPU whose oneDNN has no bf16) the generic fixed-order panels, else oneDNN's layout (bf16 only)."""
    if dense_linear.can_pack(weight):
        return dense_linear.PanelWeight(weight)
    if _generic_first() and dense_linear.can_pack_fixed_order(weight):
        return dense_linear.GenericPanelWeight(weight)
    if weight.dtype != torch.bfloat16 or not _onednn_bf16_runs():
        raise ValueError(f"no packed linear kernel for a {weight.dtype} weight here")
    _warn_not_invariant()
    return OneDnnWeight(weight)


_warned = False


def _warn_not_invariant() -> None:
    global _warned
    if batch_invariant() and not _warned:
        _warned = True
        logger.warning("no fixed-order linear kernel could be built here (see above): bf16 linear layers run in "
                       "oneDNN, and a request's last bits may depend on its batch")


def linear(x: torch.Tensor, weight: torch.Tensor, packed: PackedWeight | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, through the packed weight when there is one."""
    if packed is None:
        return F.linear(x, weight, bias)
    return packed.matmul(x, bias)


class PackableWeight:
    """For layers whose `weight` [out, in] multiplies their input: `matmul` goes through the packed
    copy once `pack_weight` has made it. A layer given a `quantized_weight` (weights/quantized.py) packs
    that instead, and keeps it quantized."""

    packed_weight: PackedWeight | None = None
    quantized_weight: quant_bf16_dot.QuantizedTensor | QuantizedPieces | None = None
    keeps_weight = False  # True where another layer reads the weight too (a tied LM head's embedding)

    def pack_weight(self, dense: bool = True) -> None:
        """Packs the quantized weight where there is one and a kernel takes it, else (`dense`) the weight."""
        quantized = None
        if self.quantized_weight is not None:
            quantized = self.quantized_form(self.quantized_weight, self.weight.dtype)
        if quantized is None and not dense:
            return
        self.packed_weight = quantized if quantized is not None else self.packed_form(self.weight)
        if not self.keeps_weight:
            self.weight.data = self.weight.data.new_empty(0)

    def packed_form(self, weight: torch.Tensor) -> PackedWeight:
        """The packed copy of `weight` this layer computes with (a layer may pick a special layout)."""
        return pack(weight)

    def quantized_form(self, weight: quant_bf16_dot.QuantizedTensor, dtype: torch.dtype) -> QuantizedPack | None:
        return pack_quantized(weight, dtype)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.packed_weight, bias)


def kernels_used(model: torch.nn.Module) -> str:
    """'30 linear/quant_bf16_dot.c, 1 linear/dense_bf16_dot.c': how many linear layers each kernel serves."""
    counts: dict[str, int] = {}
    for module in model.modules():
        packed = getattr(module, "packed_weight", None)
        if isinstance(module, PackableWeight):
            name = packed.kernel if packed is not None else "torch"
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items(), key=lambda kv: -kv[1]))


def pack_model(model: torch.nn.Module, dense: bool = True) -> int:
    """Packs every layer that can take it (dense weights too where `dense`: can_pack); returns how many
    layers there are. An embedding with a quantized weight then serves its rows from the packed blocks
    (those of its tied LM head where it has one)."""
    layers = [m for m in model.modules() if isinstance(m, PackableWeight)]
    for layer in layers:
        layer.pack_weight(dense)
    packed = {id(layer.quantized_weight): layer.packed_weight for layer in layers
              if isinstance(layer.packed_weight, QuantizedPack)}
    for module in model.modules():
        weight = getattr(module, "quantized_weight", None)
        if isinstance(module, PackableWeight) or weight is None or not hasattr(module, "quantized_rows"):
            continue
        rows = packed.get(id(weight)) or pack_quantized(weight, module.weight.dtype)
        if rows is not None:
            module.quantized_rows = rows
            module.weight.data = module.weight.data.new_empty(0)  # a tied head's float copy goes too
    for module in model.modules():  # the packed copies serve now: the GGUF rows they came from can go
        served = any(getattr(module, name, None) is not None for name in ("packed_weight", "quantized_rows"))
        if getattr(module, "quantized_weight", None) is not None and served:
            module.quantized_weight = None
    return len(layers)
