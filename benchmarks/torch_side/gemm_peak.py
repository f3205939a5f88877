"""The GEMM rate this machine reaches on a model's own linear shapes, in the dtype `--dtype auto` picks on
the active CPU tier (engine_core/cpu_kernels/tiers.py): the ceiling a prefill step can approach.
`python -m benchmarks.torch_side.gemm_peak [MODEL]` prints one JSON line.

The shapes are one decoder layer's fused projections (qkv, o, gate_up, down), run through each linear of
that dtype the tier has: bfloat16 (avx512_bf16, amx) through oneDNN's packed weights and nvllm's panels
(dense_linear.py); float32 (avx2, avx512, portable) through nvllm's fixed-order kernel built for the tier
(dense_fixed_order.c) and, where the tier is the CPU's own, torch's F.linear (MKL / oneDNN, which pick their
own instruction set: under NVLLM_CPU_ISA they would measure a higher tier than the one forced). A layer's
rate at M tokens is its FLOPs over the time of its four matmuls, the best of several repeats; the peak is
the best rate of any kernel over M in 128..2048, so a prefill's fraction of it does not flatter the kernel
the model runs with.
"""

import json
import sys
import time

import torch

from engine_core.cpu_kernels import tiers
from engine_core.engine_config import ModelConfig
from engine_core.families.spec import ModelSpec
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.platform.device import pick_dtype
from engine_core.weights.model_resolver import resolve_model

ROWS = (128, 512, 2048)


def layer_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of one layer's fused projections."""
    hidden, head_dim = spec.hidden_size, spec.head_dim
    q, kv = spec.num_heads * head_dim, spec.num_kv_heads * head_dim
    inter = spec.intermediate_size
    return {"qkv": (hidden, q + 2 * kv), "o": (q, hidden), "gate_up": (hidden, 2 * inter), "down": (inter, hidden)}


def layer_rate(shapes: dict[str, tuple[int, int]], rows: int, kernel, repeats: int = 5,
               dtype: torch.dtype = torch.bfloat16) -> float:
    """GFLOP/s of one layer's matmuls at `rows` tokens, through `kernel` (a weight -> packed weight; None:
    F.linear)."""
    gen = torch.Generator().manual_seed(0)
    mats = []
    for k, n in shapes.values():
        weight = torch.randn(n, k, generator=gen).to(dtype)
        packed = kernel(weight) if kernel is not None else None
        mats.append((torch.randn(rows, k, generator=gen).to(dtype), weight, packed))
    flops = sum(2 * rows * k * n for k, n in shapes.values())
    calls = max(2, int(2e9 / flops))  # about 2 GFLOP per timing
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms caches (and oneDNN's kernels) up
        start = time.perf_counter()
        for _ in range(calls):
            for x, weight, packed in mats:
                cpu_packing.linear(x, weight, packed)
        best = min(best, (time.perf_counter() - start) / calls)
    return flops / best / 1e9


def measure(model: str | None = None) -> dict:
    folder = resolve_model(model)
    shapes = layer_shapes(ModelConfig.from_folder(folder).spec)
    dtype = pick_dtype("auto", torch.device("cpu"))
    own = tiers.active_tier() == tiers.cpu_tier()
    if dtype is torch.bfloat16:
        kernels = {"onednn": cpu_packing.OneDnnWeight if cpu_packing.can_pack(torch.device("cpu"), dtype) else None}
        if dense_linear.load() is not None:
            kernels["nvllm"] = dense_linear.PanelWeight
    else:
        kernels = {"torch": None} if own else {}
        if dense_linear.load_fixed_order() is not None:
            kernels["nvllm"] = dense_linear.GenericPanelWeight
    by_kernel = {name: {rows: round(layer_rate(shapes, rows, kernel, dtype=dtype), 1) for rows in ROWS}
                 for name, kernel in kernels.items()}
    rates = {rows: max(r[rows] for r in by_kernel.values()) for rows in ROWS}
    return {"model_dir": folder, "threads": torch.get_num_threads(), "tier": tiers.describe(),
            "dtype": str(dtype).removeprefix("torch."), "gflops_by_rows": rates, "gflops_by_kernel": by_kernel,
            "peak_gflops": max(rates.values()), "shapes": shapes}


if __name__ == "__main__":
    print("RESULT " + json.dumps(measure(sys.argv[1] if len(sys.argv) > 1 else None)), flush=True)
