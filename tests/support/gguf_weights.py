"""Random GGUF weights of every kept type (cpu_kernels/linear/gguf_types.py) and their dequantized values, for the kernel
tests: gguf-py quantizes a random matrix where it can (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); it has no K-quant
quantizer, so K-quant super-blocks are random bytes with their fp16 scales set to sizes real files have."""

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES

# byte offsets of a K-quant super-block's fp16 scales -> the range drawn for them
_K_SCALES = {"q4_k": {0: (1e-3, 1e-2), 2: (1e-3, 1e-2)}, "q5_k": {0: (1e-3, 1e-2), 2: (1e-3, 1e-2)},
             "q6_k": {208: (1e-4, 2e-3)}}


def gguf_rows(qtype: str, n: int, k: int, seed: int, size: float = 1.0) -> np.ndarray:
    """GGUF rows uint8 [n, row bytes] of a random [n, k] weight of type `qtype`, values about `size` x N(0, 1)."""
    rng = np.random.default_rng(seed)
    if qtype not in _K_SCALES:
        w = size * rng.standard_normal((n, k)).astype(np.float32)
        return quants.quantize(w, GGMLQuantizationType[qtype.upper()]).view(np.uint8).reshape(n, -1)
    kind = GGUF_TYPES[qtype]
    blocks = rng.integers(0, 256, (n, k // kind.block_inputs, kind.block_bytes), dtype=np.uint8)
    for offset, (low, high) in _K_SCALES[qtype].items():
        scale = (size * rng.uniform(low, high, blocks.shape[:2])).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def quantized_weight(qtype: str, n: int, k: int, seed: int) -> tuple[quant_bf16_dot.QuantizedTensor, torch.Tensor]:
    """A random [n, k] weight of type `qtype`, and its dequantized float32 values (gguf-py's)."""
    raw = gguf_rows(qtype, n, k, seed)
    dequantized = quants.dequantize(raw, GGMLQuantizationType[qtype.upper()]).reshape(n, k)
    return (quant_bf16_dot.QuantizedTensor(torch.from_numpy(raw.copy()), qtype, k),
            torch.from_numpy(np.ascontiguousarray(dequantized, dtype=np.float32)))
