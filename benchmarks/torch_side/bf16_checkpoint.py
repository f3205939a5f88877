"""Writes the default model as a bf16 HF folder (its dequantized weights rounded to bfloat16): the dense
bf16 checkpoint that README's "bf16 storage" figures run, `python -m benchmarks.torch_side.bf16_checkpoint OUT`."""

import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

from engine_core.weights.loader import safetensors_files
from engine_core.weights.model_resolver import resolve_model


def main(out: str) -> None:
    source = resolve_model(None)
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):  # config, tokenizer and templates; not the import's own marker
        if (name.endswith((".json", ".jinja")) and not name.startswith(".")) or name == "tokenizer.model":
            shutil.copy(os.path.join(source, name), out)
    tensors = {}
    for path in safetensors_files(source):
        tensors.update({name: t.to(torch.bfloat16) for name, t in load_file(path).items()})
    save_file(tensors, os.path.join(out, "model.safetensors"))
    print(f"{out}: {sum(t.numel() for t in tensors.values())} bf16 weights")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "smollm2-bf16")
