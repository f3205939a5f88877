"""A PEFT LoRA adapter folder read and checked against the model it is to run on.

A folder holds adapter_config.json and adapter_model.safetensors (never a torch.save adapter_model.bin), with
tensors named like `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` ([r, in]) and
`...lora_B.weight` ([out, r]). What nvllm applies: q/k/v/o and gate/up/down projections of the dense decoder
layers, scaling lora_alpha / r (use_rslora: lora_alpha / sqrt(r)). Everything else is refused with a
ValueError that names the adapter and the reason: DoRA, modules_to_save, biases, per-module rank or alpha
patterns, embedding or LM-head targets, a module the model lacks, a rank above max_lora_rank, tensors shaped
for another base model, missing files.
"""

import json
import math
import os
import re
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine_core.families.spec import ModelSpec

# PEFT's module name -> (the attention or MLP block, nvllm's layer, the piece of it the module is)
TARGETS = {"q_proj": ("self_attn", "qkv_proj", "q"), "k_proj": ("self_attn", "qkv_proj", "k"),
           "v_proj": ("self_attn", "qkv_proj", "v"), "o_proj": ("self_attn", "o_proj", None),
           "gate_proj": ("mlp", "gate_up_proj", 0), "up_proj": ("mlp", "gate_up_proj", 1),
           "down_proj": ("mlp", "down_proj", None)}
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
_NAME = re.compile(r"base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
_MLP_PART = re.compile(r"base_model\.model\.(?:model\.)?layers\.(\d+)\.mlp\.")


def target_shape(spec: ModelSpec, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a PEFT target module in the whole (unsharded) model."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    hidden, inter = spec.hidden_size, spec.intermediate_size
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}[module]


@dataclass
class LoRAWeights:
    """One module's factors: a [r, in], b [out, r] with the scaling folded in (float32, whole model shapes)."""
    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass
class PeftAdapter:
    name: str
    rank: int
    # (layer index, PEFT module name) -> its factors
    modules: dict[tuple[int, str], LoRAWeights]

    @property
    def nbytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for w in self.modules.values())


def _refuse(name: str, why: str) -> ValueError:
    return ValueError(f"LoRA adapter {name!r}: {why}")


def _read_config(name: str, path: str) -> dict:
    config_path = os.path.join(path, "adapter_config.json")
    if not os.path.isdir(path):
        raise _refuse(name, f"{path!r} is not a folder")
    if not os.path.isfile(config_path):
        raise _refuse(name, f"{path!r} has no adapter_config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise _refuse(name, f"adapter_config.json cannot be read: {e}") from None
    if not isinstance(config, dict):
        raise _refuse(name, "adapter_config.json is not a JSON object")
    return config


def _check_config(name: str, config: dict, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a config nvllm can apply; ValueError naming the first thing it cannot."""
    if config.get("peft_type", "LORA") != "LORA":
        raise _refuse(name, f"peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    unsupported = [("use_dora", "DoRA (use_dora)"), ("modules_to_save", "modules_to_save"),
                   ("rank_pattern", "per-module ranks (rank_pattern)"),
                   ("alpha_pattern", "per-module alphas (alpha_pattern)"), ("lora_bias", "LoRA biases (lora_bias)"),
                   ("layers_to_transform", "layers_to_transform"), ("target_parameters", "target_parameters")]
    for key, what in unsupported:
        if config.get(key):
            raise _refuse(name, f"{what} is not supported")
    if config.get("bias", "none") != "none":
        raise _refuse(name, f"bias {config.get('bias')!r} is not supported (only 'none')")
    r = config.get("r")
    if not isinstance(r, int) or r < 1:
        raise _refuse(name, f"adapter_config.json's r must be a positive integer, got {r!r}")
    if r > max_rank:
        raise _refuse(name, f"rank {r} exceeds max_lora_rank {max_rank} (--max-lora-rank)")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _refuse(name, f"lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    targets = config.get("target_modules")
    if isinstance(targets, list):
        for target in targets:
            if target not in TARGETS:
                raise _refuse(name, f"target module {target!r} is not in the model (LoRA targets: "
                                    f"{', '.join(TARGETS)})")
    return r, scaling


def read_peft_adapter(name: str, path: str, spec: ModelSpec, max_rank: int) -> PeftAdapter:
    """The adapter at `path`, checked against the model `spec` describes. Raises ValueError naming `name`."""
    config = _read_config(name, path)
    r, scaling = _check_config(name, config, max_rank)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(weights_path):
        torch_bin = os.path.isfile(os.path.join(path, "adapter_model.bin"))
        raise _refuse(name, f"{path!r} has no adapter_model.safetensors" +
                      (" (nvllm never reads adapter_model.bin, a torch.save file that can run code when loaded: "
                       "save the adapter with safetensors)" if torch_bin else ""))
    try:
        tensors = load_file(weights_path)
    except (SafetensorError, OSError, ValueError) as e:
        raise _refuse(name, f"adapter_model.safetensors cannot be read: {e}") from None
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in tensors.items():
        m = _NAME.fullmatch(tensor_name)
        moe = _MLP_PART.match(tensor_name)
        if moe is not None and int(moe.group(1)) in spec.sparse_layers:
            raise _refuse(name, f"layer {moe.group(1)}'s MLP is a mixture of experts: LoRA on its experts, shared "
                                f"expert or router (tensor {tensor_name!r}) is not supported")
        if m is None:
            raise _refuse(name, f"tensor {tensor_name!r} is not a LoRA factor of a q/k/v/o or gate/up/down "
                                f"projection of a decoder layer")
        layer, block, module, which = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in TARGETS or TARGETS[module][0] != block:
            raise _refuse(name, f"target module {block}.{module} (tensor {tensor_name!r}) is not in the model")
        if layer >= spec.num_layers:
            raise _refuse(name, f"tensor {tensor_name!r} is for layer {layer}; the model has {spec.num_layers}")
        factors.setdefault((layer, module), {})[which] = tensor
    modules = {}
    for (layer, module), pair in sorted(factors.items()):
        if set(pair) != {"A", "B"}:
            raise _refuse(name, f"layer {layer} {module} has lora_{''.join(pair)} but not both lora_A and lora_B")
        a, b = pair["A"], pair["B"]
        in_features, out_features = target_shape(spec, module)
        if tuple(a.shape) != (r, in_features) or tuple(b.shape) != (out_features, r):
            raise _refuse(name, f"layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                                f"fit this model (expected ({r}, {in_features}) and ({out_features}, {r})): an "
                                f"adapter of another base model?")
        modules[(layer, module)] = LoRAWeights(a.float().contiguous(), (b.float() * scaling).contiguous())
    if not modules:
        raise _refuse(name, "adapter_model.safetensors holds no LoRA factors")
    return PeftAdapter(name, r, modules)
