"""FP8 block-quantized weights (quant_method "fp8": Qwen3's and DeepSeek's FP8 releases) dequantized at load.

Such a checkpoint stores each quantized linear weight W [N, K] as float8 e4m3 values q and, beside it,
`<name>_scale_inv` [ceil(N / bn), ceil(K / bn)]: one float32 scale per (bn x bk) block, W = q * scale (the name
says inverse of the quantizer's scale; it is the factor that dequantizes). Each weight is q times its block's scale
in float32: q is exact in float32 and the product rounds once, so the result is the checkpoint's weight but for
that rounding, and the engine then casts it to its dtype like any float weight.
"""

import logging
import time

import torch

logger = logging.getLogger(__name__)

SCALE_SUFFIX = "_scale_inv"


def dequantize(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """q [..., N, K] float8 times each (block[0] x block[1]) block's scale [..., ceil(N / b0), ceil(K / b1)]."""
    n, k = q.shape[-2:]
    rows, columns = block
    expected = (-(-n // rows), -(-k // columns))
    if tuple(scale.shape[-2:]) != expected:
        raise ValueError(f"FP8 scales of shape {tuple(scale.shape)} for a weight of shape {tuple(q.shape)} in "
                         f"{rows} x {columns} blocks (expected {expected})")
    factors = scale.float().repeat_interleave(rows, dim=-2)[..., :n, :].repeat_interleave(columns, dim=-1)[..., :k]
    return q.float() * factors


class Fp8Tally:
    """Dequantizes a checkpoint's FP8 weights and says, once, what it cost."""

    def __init__(self, block: tuple[int, int]):
        self.block, self.tensors, self.weights, self.seconds = block, 0, 0, 0.0

    def dequantized(self, name: str, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            out = dequantize(q, scale, self.block)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from e
        self.tensors, self.weights = self.tensors + 1, self.weights + q.numel()
        self.seconds += time.perf_counter() - start
        return out

    def log(self) -> None:
        if self.tensors:
            logger.info("FP8 checkpoint: %d weights (%.2f GB as FP8, %d x %d blocks) dequantized at load in %.1f s; "
                        "in bf16 they take %.2f GB", self.tensors, self.weights / 1e9, *self.block, self.seconds,
                        2 * self.weights / 1e9)
