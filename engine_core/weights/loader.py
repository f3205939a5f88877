"""Read the weights of an HF folder lazily, one tensor at a time, from its *.safetensors files (an FP8 checkpoint's
weights dequantized: fp8_blocks.py), and, in a GGUF import, the blocks of the tensors kept quantized
(gguf_import.QUANTIZED_FILE) dequantized where asked for."""

import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

from engine_core.families.quantization import fp8_block
from engine_core.weights.fp8_blocks import SCALE_SUFFIX, Fp8Tally

INDEX_FILE = "model.safetensors.index.json"
# a GGUF import's kept tensors as they are (uint8 rows of blocks, HF names, un-permuted like the floats), in
# safetensors format with {name: type} in its metadata; not *.safetensors, so that HF-folder readers (ours,
# transformers) do not take it for a float checkpoint
QUANTIZED_FILE = "weights.quantized"


def safetensors_files(folder: str) -> list[str]:
    """The folder's weight files: the shards named by model.safetensors.index.json when there is one
    (so stray extra files such as consolidated.safetensors are not read twice), else every *.safetensors."""
    index = os.path.join(folder, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names and not os.path.exists(os.path.join(folder, QUANTIZED_FILE)):
        raise FileNotFoundError(f"no *.safetensors files in model folder {folder}")
    return [os.path.join(folder, n) for n in names]


def load_safetensors_weights(folder: str, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the folder but those in `skip`, in file order, in the dtype it was
    stored in (an FP8 checkpoint's weights dequantized to float32 with their block scales, the scales not yielded);
    then the kept GGUF tensors the files lack (a GGUF import writes no float copy of them), dequantized to float32
    (gguf-py's values)."""
    seen = set()
    block = fp8_block(_config(folder))
    fp8 = Fp8Tally(block) if block else None
    for path in safetensors_files(folder):
        with safe_open(path, framework="pt", device="cpu") as f:
            names = set(f.keys()) if fp8 else set()  # to pair each FP8 weight with its scales
            for name in f.keys():
                seen.add(name)
                if name in skip or (fp8 and name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in names):
                    continue
                tensor = f.get_tensor(name)
                if fp8 and tensor.dtype == torch.float8_e4m3fn:
                    tensor = fp8.dequantized(name, tensor, f.get_tensor(name + SCALE_SUFFIX))
                yield name, tensor
    if fp8:
        fp8.log()
    for name, (rows, qtype) in quantized_tensors(folder).items():
        if name not in seen and name not in skip:
            yield name, dequantized(rows(), qtype)


def _config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def quantized_tensors(folder: str) -> dict[str, tuple]:
    """{name: (read, type)} of the folder's kept GGUF tensors; read() returns the uint8 rows (read when called)."""
    path = os.path.join(folder, QUANTIZED_FILE)
    if not os.path.exists(path):
        return {}
    with safe_open(path, framework="pt", device="cpu") as f:
        types = f.metadata() or {}
        names = [name for name in f.keys() if name in types]

    def reader(name: str):
        def read() -> torch.Tensor:
            with safe_open(path, framework="pt", device="cpu") as f:
                return f.get_tensor(name)
        return read

    return {name: (reader(name), types[name]) for name in names}


def dequantized(rows: torch.Tensor, qtype: str) -> torch.Tensor:
    """GGUF rows of type `qtype` as float32 values [rows, inputs]."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(rows.numpy(), GGMLQuantizationType[qtype.upper()]).astype("float32", copy=False))
