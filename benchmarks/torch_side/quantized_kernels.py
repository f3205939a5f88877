"""nvllm's kept-quantized linear kernel against torch's weight-only quantized CPU matmuls, on a model's own
layer shapes, in the dtype `--dtype auto` picks on the active CPU tier: the measurement behind the choice of
kernel (`nvllm bench cpu` runs it; `python -m benchmarks.torch_side.quantized_kernels [MODEL]` prints one JSON
line).

Each kernel multiplies the same random Q4_1-shaped weights (4-bit integers in blocks of 32 with a scale and
an offset): nvllm's through the kernel the tier's table picks for that dtype (cpu_packing.pack_quantized),
torch's as `_weight_int4pack_mm_for_cpu` (groups of 32, a scale and a zero point) and
`_weight_int8pack_mm` (per-channel int8, 8 bits read per weight: an upper bound on what it could gain). A
layer's rate at M tokens is its FLOPs over the time of its four matmuls, the best of several repeats.
"""

import json
import sys
import time

import torch

from engine_core.cpu_kernels import tiers
from engine_core.engine_config import ModelConfig
from benchmarks.torch_side.gemm_peak import layer_shapes
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.platform.device import pick_dtype
from engine_core.weights.model_resolver import resolve_model

ROWS = (1, 32, 256)
GROUP = 32


def _q4_1(n: int, k: int, gen: torch.Generator) -> tuple[quant_bf16_dot.QuantizedTensor, torch.Tensor]:
    """Random Q4_1 rows of a [n, k] weight, and the 4-bit integers they hold ([n, k] int32)."""
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    blocks = torch.empty((n, k // GROUP, 20), dtype=torch.uint8)
    scale = (torch.rand(n, k // GROUP, generator=gen) * 0.01 + 0.001).half()
    offset = (-torch.rand(n, k // GROUP, generator=gen) * 0.05).half()
    blocks[:, :, 0:2] = scale.view(torch.uint8).view(n, -1, 2)
    blocks[:, :, 2:4] = offset.view(torch.uint8).view(n, -1, 2)
    pairs = q.view(n, k // GROUP, 2, 16).to(torch.uint8)  # GGUF Q4_1: byte j holds inputs j and j + 16
    blocks[:, :, 4:] = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
    return quant_bf16_dot.QuantizedTensor(blocks.view(n, -1), "q4_1", k), q


def _kernels(dtype: torch.dtype) -> dict:
    """name -> (weight rows, integers, dtype) -> a function of x; None where a kernel is not there."""
    ops = torch.ops.aten

    def nvllm(rows, q, k):
        packed = cpu_packing.pack_quantized(rows, dtype)
        return None if packed is None else packed.matmul

    def torch_int4(rows, q, k):
        if not hasattr(ops, "_weight_int4pack_mm_for_cpu"):
            return None
        packed = ops._convert_weight_to_int4pack_for_cpu(q, 1)
        scales_zeros = torch.rand(k // GROUP, q.shape[0], 2).to(dtype)
        return lambda x: ops._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros)

    def torch_int8(rows, q, k):
        if not hasattr(ops, "_weight_int8pack_mm"):
            return None
        weight, scales = (q - 8).to(torch.int8), torch.rand(q.shape[0]).to(dtype)
        return lambda x: ops._weight_int8pack_mm(x, weight, scales)

    return {"nvllm": nvllm, "torch_int4pack": torch_int4, "torch_int8pack": torch_int8}


def layer_rate(shapes: dict[str, tuple[int, int]], rows: int, make, dtype: torch.dtype, repeats: int = 3) -> float | None:
    """GFLOP/s of one layer's matmuls at `rows` tokens through the kernel `make` builds; None without it."""
    gen = torch.Generator().manual_seed(0)
    calls = []
    for k, n in shapes.values():
        weight, q = _q4_1(n, k, gen)
        x = torch.randn(rows, k, generator=gen).to(dtype)
        try:
            fn = make(weight, q, k)
            if fn is not None:
                fn(x)
        except RuntimeError:  # a torch build or a shape its op does not take
            fn = None
        if fn is None:
            return None
        calls.append((fn, x))
    flops = sum(2 * rows * k * n for k, n in shapes.values())
    count = max(2, int(5e8 / flops))
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms caches up
        start = time.perf_counter()
        for _ in range(count):
            for fn, x in calls:
                fn(x)
        best = min(best, (time.perf_counter() - start) / count)
    return round(flops / best / 1e9, 2)


def measure(model: str | None = None) -> dict:
    folder = resolve_model(model)
    shapes = layer_shapes(ModelConfig.from_folder(folder).spec)
    dtype = pick_dtype("auto", torch.device("cpu"))
    rates = {name: {rows: layer_rate(shapes, rows, make, dtype) for rows in ROWS}
             for name, make in _kernels(dtype).items()}
    return {"tier": tiers.describe(), "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "gflops_by_kernel": rates, "shapes": shapes}


if __name__ == "__main__":
    print("RESULT " + json.dumps(measure(sys.argv[1] if len(sys.argv) > 1 else None)), flush=True)
