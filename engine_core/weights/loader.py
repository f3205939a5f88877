"""Read the weights of an HF folder lazily, one tensor at a time, from its *.safetensors files."""

import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(folder: str) -> list[str]:
    """The folder's weight files: the shards named by model.safetensors.index.json when there is one
    (so stray extra files such as consolidated.safetensors are not read twice), else every *.safetensors."""
    index = os.path.join(folder, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"no *.safetensors files in model folder {folder}")
    return [os.path.join(folder, n) for n in names]


def load_safetensors_weights(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the folder, in file order, in the dtype it was stored in."""
    for path in safetensors_files(folder):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
