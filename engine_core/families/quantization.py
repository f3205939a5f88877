"""A checkpoint's quantization_config, answered by method: what its weights are, and what to run instead.

transformers' loader reads quantization_config to pick the quantizer that unpacks the weights (modeling_utils, not
an architecture's code), so it is never merely ignored. nvllm keeps GGUF files quantized (Q4_0, Q4_1, Q8_0, Q5_0,
Q5_1 and the K-quants) through the GGUF importer; of safetensors checkpoints it loads plain float weights, and FP8
block-quantized ones (quant_method "fp8": e4m3 weights, one scale per block, activations quantized on the fly, as
Qwen3's and DeepSeek's FP8 releases) dequantized at load (weights/loader.py: each weight times its block's scale,
in float32), which is exact but for that one rounding and doubles the weights' memory in bf16. Every other method
is refused, named.
"""

from typing import Any

from engine_core.families.errors import UnsupportedConfig

_GGUF = "a GGUF file of the same model (nvllm keeps its Q4/Q5/Q8 and K-quant blocks quantized)"
_INSTEAD = f"use the model's unquantized (bf16 or fp16) release, or {_GGUF}"

# quant_method -> what the weights are
METHODS = {
    "fbgemm_fp8": "FP8 weights with per-channel scales (fbgemm)",
    "compressed-tensors": "weights packed by llm-compressor (compressed-tensors: int4/int8/FP8 schemes)",
    "gptq": "GPTQ int2-8 weights packed in int32 with group scales",
    "awq": "AWQ int4 weights packed in int32 with group scales",
    "bitsandbytes": "bitsandbytes int8 / NF4 weights",
    "hqq": "HQQ low-bit weights",
    "aqlm": "AQLM additive codebook weights",
    "eetq": "EETQ int8 weights",
    "quanto": "optimum-quanto weights",
    "torchao": "torchao-quantized weights",
    "bitnet": "BitNet ternary weights",
    "mxfp4": "MXFP4 weights (4-bit floats with shared exponents)",
    "gguf": "GGUF blocks inside a safetensors folder",
}


def fp8_block(config: dict) -> tuple[int, int] | None:
    """(rows, columns) of an FP8 checkpoint's weight blocks where nvllm dequantizes it at load; else None."""
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "fp8":
        return None
    block = quantization.get("weight_block_size")
    if (quantization.get("fmt", "e4m3") == "e4m3" and quantization.get("activation_scheme", "dynamic") == "dynamic"
            and isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        return block[0], block[1]
    return None


def refuse_quantized(config: dict) -> None:
    """UnsupportedConfig naming the checkpoint's quantization method, where config.json has a quantization_config
    nvllm cannot load (FP8 weight blocks it can: fp8_block)."""
    quantization = config.get("quantization_config")
    if quantization is None or fp8_block(config):
        return
    method: Any = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "fp8":
        layout = {k: quantization.get(k) for k in ("fmt", "activation_scheme", "weight_block_size")}
        raise UnsupportedConfig("quantization_config", method, "FP8 weights are loaded (dequantized) with e4m3 "
                                "weight blocks (weight_block_size) and dynamic activations only; this one has "
                                f"{layout}: {_INSTEAD}")
    what = METHODS.get(str(method).lower(), f"weights quantized by {method!r}") if method else (
        "quantized weights (no quant_method named)")
    extra = ""
    if method == "bitsandbytes" or method == "eetq":
        extra = "; for int8 linears from an unquantized folder, `--quantization int8`"
    raise UnsupportedConfig("quantization_config", method,
                            f"{what} are not supported: {_INSTEAD}{extra}")
