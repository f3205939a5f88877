"""Which linear layers keep their weights quantized in memory, and from where (`--quantization`).

- gguf: a GGUF import's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K tensors (gguf_import.QUANTIZED_FILE,
  cpu_kernels/linear/gguf_types.py) go to the layers as they are; a fused layer (qkv, gate/up) whose pieces differ in
  type (Q4_K_M's Q6_K v_proj beside Q4_K q/k) keeps each piece in its own (layers/quant_pieces.py). A quantized
  embedding serves its rows from the same blocks (a tied LM head and its embedding share them).
- int8: the decoder's linear layers quantized per output channel (quant_bf16_dot.quantize_int8); the LM head
  and the embedding stay bf16.
- none: everything dequantized (the path compared with transformers).
- auto: as gguf where a kernel runs (measured on every tier: a kept layer decodes faster than its dequantized
  copy, 1.7-2.2x for Q4_K_M files in bf16 on the AMX Xeon, and prefills within 20% of it); else none.

The kernels run on every CPU tier, in float32 and bfloat16 engines (cpu_packing.pack_quantized: quant_exact_f32.c
for float32 and quant_bf16_dot.c for bf16 on the avx512_bf16 and amx tiers where they take the type,
quant_int8_rows.c for the rest); off the CPU, or without a C compiler, auto means none and an explicit gguf /
int8 is an error that says why.

With tensor parallelism each rank keeps its own shard quantized: the layer's weight loader picks the rows
of column-parallel layers from the GGUF rows as it picks dense ones, and a row-parallel layer's input
slice is cut at block boundaries (a layer whose slice would split a block of 32, or a K-quant's super-block
of 256, is dequantized).
"""

import logging

import torch

from engine_core.layers import cpu_packing, linear
from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES
from engine_core.layers.quant_pieces import QuantizedPieces
from engine_core.weights.loader import quantized_tensors

logger = logging.getLogger("nvllm")

_INT8_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _why_not(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return f"the quantized kernels run in float32 or bfloat16 on the CPU (this engine: {dtype} on {device.type})"
    if not cpu_packing.keeps_quantized(dtype):
        return "the quantized kernels could not be built (no C compiler? the log above says why)"
    return None


def _checkpoint_pieces(model, module_name: str) -> list[tuple[str, object]]:
    """The checkpoint tensors a packable layer's weight is made of, with the shard id its loader takes."""
    if module_name == "lm_head":
        return [("model.embed_tokens.weight" if getattr(model, "tie_word_embeddings", False) else "lm_head.weight",
                 None)]
    base, _, last = module_name.rpartition(".")
    pieces = [(piece, shard) for piece, (fused, shard) in model.fused.items() if fused == last] or [(last, None)]
    return [(f"model.{base}.{piece}.weight", shard) for piece, shard in pieces]


def _shard(module, rows: torch.Tensor, qtype: str, shard, out: torch.Tensor) -> bool:
    """Copies this rank's part of one checkpoint piece's GGUF rows into `out` (the layer's rows, uint8),
    as the layer's weight loader does for a dense tensor. False where a row-parallel slice splits a block."""
    kind = GGUF_TYPES[qtype]
    if isinstance(module, linear.RowParallelLinear):
        start, size = module.in_start, module.in_per_rank
        if start % kind.block_inputs or size % kind.block_inputs or rows.shape[1] < kind.row_bytes(start + size):
            return False
        out.copy_(rows.narrow(1, kind.row_bytes(start), kind.row_bytes(size)))
        return True
    if rows.shape[1] != out.shape[1]:
        return False
    module.weight_loader(out, rows, shard)
    return True


def _piece_rows(module, rows: int, shard) -> tuple[int, int, int]:
    """(first checkpoint row, row count, first output row) of this rank's part of one piece of a fused layer,
    read off the layer's own weight loader run on row numbers."""
    where = torch.full((module.weight.shape[0], 1), -1.0, dtype=torch.float64)
    module.weight_loader(where, torch.arange(rows, dtype=torch.float64)[:, None], shard)
    taken = (where[:, 0] >= 0).nonzero()[:, 0]
    if not len(taken):
        return 0, 0, 0
    offset = int(taken[0])
    return int(where[offset, 0]), len(taken), offset


def _pieces(module, raw: dict, pieces: list[tuple[str, object]]) -> QuantizedPieces | None:
    """This rank's rows of a fused layer's pieces, each kept in its own type (the file's mix of types stays as it
    is); None where a piece's type or shape cannot be kept (that layer is then dequantized)."""
    in_features = module.weight.shape[1]
    parts = []
    for name, shard in pieces:
        read, qtype = raw[name]
        kind = GGUF_TYPES.get(qtype)
        rows = read()
        if kind is None or not kind.fits(in_features) or rows.shape[1] != kind.row_bytes(in_features):
            return None
        start, count, offset = _piece_rows(module, rows.shape[0], shard)
        if count:
            mine = rows if count == rows.shape[0] else rows[start:start + count].clone()  # no other rank's rows
            parts.append((offset, quant_bf16_dot.QuantizedTensor(mine, qtype, in_features)))
    parts.sort(key=lambda part: part[0])
    return QuantizedPieces([piece for _, piece in parts]) if parts else None


def _joined(module, raw: dict,
            pieces: list[tuple[str, object]]) -> quant_bf16_dot.QuantizedTensor | QuantizedPieces | None:
    """This rank's rows of the pieces as one quantized weight of the layer's shape (its pieces apart where they
    differ in type); None where a piece is missing or a shard would split a block (that layer is then
    dequantized)."""
    names = [name for name, _ in pieces]
    if not all(name in raw for name in names):
        return None
    if len({raw[name][1] for name in names}) != 1:
        return _pieces(module, raw, pieces)
    qtype = raw[names[0]][1]
    out_features, in_features = module.weight.shape
    if qtype not in GGUF_TYPES or not GGUF_TYPES[qtype].fits(in_features):
        return None
    shape = (out_features, GGUF_TYPES[qtype].row_bytes(in_features))
    read = {name: raw[name][0]() for name in names}
    if len(pieces) == 1 and tuple(read[names[0]].shape) == shape:  # all of one piece on this rank: no copy
        return quant_bf16_dot.QuantizedTensor(read[names[0]], qtype, in_features)
    rows = torch.zeros(shape, dtype=torch.uint8)
    for name, shard in pieces:
        if not _shard(module, read.pop(name), qtype, shard, rows):
            return None
    try:
        return quant_bf16_dot.QuantizedTensor(rows, qtype, in_features)
    except ValueError:
        return None


def _refusal(folder: str, mode: str, device: torch.device, dtype: torch.dtype, has_blocks: bool) -> str | None:
    """Why `mode` keeps nothing quantized here (None: it can), raised for an explicit mode, logged for auto."""
    why = _why_not(device, dtype)
    if why is None and mode == "gguf" and not has_blocks:
        why = f"{folder} has no GGUF tensors of the kept types (quantization gguf takes a GGUF model)"
    if why is not None and mode != "auto":
        raise ValueError(f"quantization {mode} cannot run here: {why}. Use --quantization none")
    if why is not None:
        logger.debug("weights dequantized: %s", why)
    return why


def _summary(kept: dict[str, int]) -> str:
    return ", ".join(f"{count} layers {qtype}" for qtype, count in sorted(kept.items())) or "none"


def keep_gguf_blocks(model, folder: str, mode: str, device: torch.device,
                     dtype: torch.dtype) -> tuple[str, frozenset[str]]:
    """Before the float weights load (`mode` auto or gguf): gives the model's layers and embedding their GGUF
    blocks where a kernel takes them (packed later by cpu_packing.pack_model). Returns what was done, for the load
    log line, and the checkpoint tensors no layer then needs as floats: the loader skips them, so a kept tensor is
    never dequantized nor resident twice."""
    if mode not in ("auto", "gguf"):
        return "none", frozenset()
    raw = quantized_tensors(folder)
    if _refusal(folder, mode, device, dtype, bool(raw)) is not None or not raw:
        return "none", frozenset()
    def keeps(weight) -> bool:  # wherever a kernel runs, auto and gguf alike
        return cpu_packing.can_pack_quantized(weight, dtype)

    kept: dict[str, int] = {}
    as_floats: set[str] = set()  # checkpoint tensors a layer that is not kept reads
    for name, module in model.named_modules():
        if not isinstance(module, cpu_packing.PackableWeight):
            continue
        pieces = _checkpoint_pieces(model, name)
        weight = _joined(module, raw, pieces)
        if weight is not None and weight.shape == tuple(module.weight.shape) and keeps(weight):
            module.quantized_weight = weight
            kept[weight.qtype] = kept.get(weight.qtype, 0) + 1
        else:
            as_floats.update(piece for piece, _ in pieces)
    embedding = getattr(model, "embed_tokens", None)
    if embedding is not None and "model.embed_tokens.weight" in raw:
        lm_head = getattr(model, "lm_head", None)
        shared = getattr(model, "tie_word_embeddings", False) and getattr(lm_head, "quantized_weight", None)
        weight = shared or _joined(embedding, raw, [("model.embed_tokens.weight", None)])
        if weight is not None and keeps(weight):
            embedding.quantized_weight = weight
        else:
            as_floats.add("model.embed_tokens.weight")
    return _summary(kept), frozenset(raw) - as_floats


def quantize_int8(model, mode: str, device: torch.device, dtype: torch.dtype) -> str:
    """After the float weights load (`mode` int8): the decoder's linear layers quantized per output channel.
    Returns what was done, for the load log line."""
    if mode != "int8":
        return "none"
    _refusal("", mode, device, dtype, True)
    kept: dict[str, int] = {}
    for name, module in model.named_modules():
        in_features = getattr(module, "weight", torch.empty(0, 0)).shape[-1]
        if (isinstance(module, cpu_packing.PackableWeight) and name.rpartition(".")[2] in _INT8_LAYERS
                and in_features % quant_bf16_dot.BLOCK == 0):
            module.quantized_weight = quant_bf16_dot.quantize_int8(module.weight)
            kept["q8_0"] = kept.get("q8_0", 0) + 1
    return _summary(kept)
