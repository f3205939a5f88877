"""The weight-streaming bound of a decode step on this machine: the bytes a batch-1 decode step must
read (every linear layer's weights, as the engine holds them: bf16 panels or quantized blocks) over the
memory read bandwidth measured now. `python -m benchmarks.torch_side.weight_stream [MODEL] [--quantization Q]
[--dtype D]` prints one JSON line (`nvllm bench latency` runs it in a child, so that its own process
stays torch-free).

The bandwidth is the best of several float32 sums over 1 GiB (larger than any cache) on the engine's
threads; a decode step cannot be faster than bytes / bandwidth, whatever its kernels do.
"""

import argparse
import json
import time

import torch

from common.config import QUANTIZATIONS, EngineArgs
from engine_core.platform.cpu_threads import allowed_cpus
from engine_core.engine_config import resolve_engine_config
from engine_core.layers import cpu_packing
from engine_core.worker.model_runner import ModelRunner

BUFFER_BYTES = 1 << 30


def read_bandwidth(repeats: int = 6) -> float:
    """Bytes per second a reduction over BUFFER_BYTES reads, best of `repeats` (the first touches pages)."""
    buffer = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return BUFFER_BYTES / best


def streamed_bytes(model) -> int:
    """Bytes of weights one decode step reads: the linear layers' packed (or plain) weights and the norms;
    embeddings are looked up a row at a time and do not count."""
    total = 0
    for module in model.modules():
        if isinstance(module, cpu_packing.PackableWeight):
            packed, weight = module.packed_weight, module.weight
            total += packed.nbytes if packed is not None else weight.numel() * weight.element_size()
        elif type(module).__name__ == "RMSNorm":
            total += module.weight.numel() * module.weight.element_size()
    return total


def measure(model: str | None, quantization: str, dtype: str) -> dict:
    config = resolve_engine_config(EngineArgs(model=model, quantization=quantization, dtype=dtype, device="cpu"))
    torch.set_num_threads(len(allowed_cpus()))  # the engine's pool on an idle machine
    runner = ModelRunner(config)
    nbytes = streamed_bytes(runner.model)
    bandwidth = read_bandwidth()
    return {"streamed_bytes": nbytes, "bandwidth_gbs": round(bandwidth / 1e9, 2),
            "bound_ms": round(nbytes / bandwidth * 1e3, 3), "quantization": runner.quantization,
            "threads": torch.get_num_threads()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--quantization", default="auto", choices=QUANTIZATIONS)
    parser.add_argument("--dtype", default="auto")
    a = parser.parse_args()
    print("RESULT " + json.dumps(measure(a.model, a.quantization, a.dtype)), flush=True)
