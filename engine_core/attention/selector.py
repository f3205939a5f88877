"""Picks the attention backend: `auto` is flash_attn on CUDA when it imports, else triton on
CUDA, else torch."""

import importlib.util

import torch

from engine_core.attention.backend import AttentionBackend


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        if device.type != "cuda":
            name = "torch"
        elif importlib.util.find_spec("flash_attn") is not None:
            name = "flash_attn"
        else:
            name = "triton"
    if name == "torch":
        from engine_core.attention.torch_backend import TorchAttentionBackend
        return TorchAttentionBackend()
    if name == "triton":
        from engine_core.attention.triton_backend import TritonAttentionBackend
        return TritonAttentionBackend()
    if name == "flash_attn":
        if importlib.util.find_spec("flash_attn") is None:
            raise ValueError("attention_backend flash_attn needs the flash-attn package: pip install 'nvllm[cuda]'")
        from engine_core.attention.flash_attn_backend import FlashAttnBackend
        return FlashAttnBackend()
    raise ValueError(f"attention_backend {name!r} is not one of auto, torch, triton, flash_attn")
