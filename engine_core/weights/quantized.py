"""Which linear layers keep their weights quantized in memory, and from where (`--quantization`).

- gguf: a GGUF import's Q4_0 / Q4_1 / Q8_0 tensors (gguf_import.QUANTIZED_FILE) go to the layers as they
  are; a fused layer (qkv, gate/up) is kept quantized when all its pieces share one type. A quantized
  embedding serves its rows from the same blocks (a tied LM head and its embedding share them).
- int8: the decoder's linear layers quantized per output channel (cpu_quant.quantize_int8); the LM head
  and the embedding stay bf16.
- none: everything dequantized (the path compared with transformers).
- auto: gguf where the model has such tensors and the kernels run, else none.

The kernels run on one rank, on every CPU tier, in float32 and bfloat16 engines (cpu_packing.pack_quantized:
cpu_quant.c for bf16 on the avx512_bf16 and amx tiers, quant_dot.c elsewhere). Elsewhere auto means none,
and an explicit gguf / int8 is an error that says why.
"""

import logging
import os

import torch
from safetensors import safe_open

from engine_core.distributed.parallel_state import tp_size
from engine_core.layers import cpu_packing, cpu_quant
from engine_core.weights.gguf_import import QUANTIZED_FILE

logger = logging.getLogger("nvllm")

_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_INT8_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _why_not(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return f"the quantized kernels run in float32 or bfloat16 on the CPU (this engine: {dtype} on {device.type})"
    if tp_size() != 1:
        return "the quantized kernels run on one rank (tensor_parallel_size 1)"
    if not cpu_packing.keeps_quantized(dtype):
        return "the quantized kernels could not be built (no C compiler? the log above says why)"
    return None


def _read(folder: str) -> dict[str, tuple[torch.Tensor, str]]:
    """The folder's kept GGUF tensors by HF name: (uint8 rows, type); the input count is set per layer."""
    path = os.path.join(folder, QUANTIZED_FILE)
    if not os.path.exists(path):
        return {}
    with safe_open(path, framework="pt", device="cpu") as f:
        types = f.metadata() or {}
        return {name: (f.get_tensor(name), types[name]) for name in f.keys() if name in types}


def _checkpoint_names(model, module_name: str) -> list[str]:
    """The checkpoint tensors a packable layer's weight is made of, in the order its rows hold them."""
    if module_name == "lm_head":
        return ["model.embed_tokens.weight" if getattr(model, "tie_word_embeddings", False) else "lm_head.weight"]
    base, _, last = module_name.rpartition(".")
    pieces = _FUSED.get(last, (last,))
    return [f"model.{base}.{piece}.weight" for piece in pieces]


def _joined(raw: dict, names: list[str], in_features: int) -> cpu_quant.QuantizedTensor | None:
    """The pieces' rows stacked into one quantized weight; None where a piece is missing or they differ
    in type (that layer is then dequantized)."""
    if not all(name in raw for name in names) or len({raw[name][1] for name in names}) != 1:
        return None
    rows = torch.cat([raw[name][0] for name in names]) if len(names) > 1 else raw[names[0]][0]
    try:
        return cpu_quant.QuantizedTensor(rows, raw[names[0]][1], in_features)
    except ValueError:
        return None


def apply(model, folder: str, mode: str, device: torch.device, dtype: torch.dtype) -> str:
    """Gives the model's packable layers their quantized weights (packed later by cpu_packing.pack_model).
    Returns what was done, for the load log line."""
    if mode == "none":
        return "none"
    why = _why_not(device, dtype)
    raw = _read(folder) if why is None and mode in ("auto", "gguf") else {}
    if mode == "gguf" and why is None and not raw:
        why = f"{folder} has no GGUF Q4_0 / Q4_1 / Q8_0 tensors (quantization gguf takes a GGUF model)"
    if why is not None:
        if mode == "auto":
            logger.debug("weights dequantized: %s", why)
            return "none"
        raise ValueError(f"quantization {mode} cannot run here: {why}. Use --quantization none")
    if not raw and mode == "auto":
        return "none"
    kept: dict[str, int] = {}
    for name, module in model.named_modules():
        if not isinstance(module, cpu_packing.PackableWeight):
            continue
        in_features = module.weight.shape[1]
        if mode == "int8":
            weight = (cpu_quant.quantize_int8(module.weight)
                      if name.rpartition(".")[2] in _INT8_LAYERS and in_features % cpu_quant.BLOCK == 0 else None)
        else:
            weight = _joined(raw, _checkpoint_names(model, name), in_features)
        if weight is not None and weight.shape == tuple(module.weight.shape):
            module.quantized_weight = weight
            kept[weight.qtype] = kept.get(weight.qtype, 0) + 1
    embedding = getattr(model, "embed_tokens", None)
    if mode != "int8" and embedding is not None and "model.embed_tokens.weight" in raw:
        lm_head = getattr(model, "lm_head", None)
        shared = getattr(model, "tie_word_embeddings", False) and getattr(lm_head, "quantized_weight", None)
        embedding.quantized_weight = shared or _joined(raw, ["model.embed_tokens.weight"], embedding.weight.shape[1])
    return ", ".join(f"{count} layers {qtype}" for qtype, count in sorted(kept.items())) or "none"
