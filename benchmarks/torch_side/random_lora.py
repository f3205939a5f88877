"""Random LoRA adapters for a model (`nvllm bench throughput --lora-adapters N`): PEFT folders with every
q/k/v/o and gate/up/down projection of the dense layers targeted, factors drawn from a seeded generator (B
too: PEFT's zero B would make an adapter that changes nothing), written into a fresh temporary folder."""

import json
import os
import tempfile

import torch
from safetensors.torch import save_file

from engine_core.families.catalog import read_spec
from engine_core.lora.peft_adapter import MLP_TARGETS, TARGETS, target_shape
from engine_core.weights.model_folder import read_hf_config
from engine_core.weights.model_resolver import resolve_model


def random_lora_adapters(model: str | None, count: int, rank: int, seed: int = 0) -> list[str]:
    """Folders of `count` random rank-`rank` adapters for `model` (a folder, a GGUF file, None: the default)."""
    spec = read_spec(read_hf_config(resolve_model(model)))
    root = tempfile.mkdtemp(prefix="nvllm-bench-lora-")
    generator = torch.Generator().manual_seed(seed)
    folders = []
    for i in range(count):
        folder = os.path.join(root, f"adapter-{i}")
        os.makedirs(folder)
        tensors = {}
        for layer in range(spec.num_layers):
            for module, (block, _, _) in TARGETS.items():
                if module in MLP_TARGETS and layer in spec.sparse_layers:
                    continue
                in_features, out_features = target_shape(spec, module)
                prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) / in_features**0.5
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.01
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(TARGETS),
                       "bias": "none"}, f)
        folders.append(folder)
    return folders
