"""Rotary position embeddings (rotate-half layout), with Llama 3 frequency scaling."""

import functools
import json
import math

import torch
from torch import nn

from engine_core.layers.forward_context import get_forward_context, has_forward_context
from engine_core.layers import cpu_ops
from engine_core.layers.rotary_plan import RotaryTables, lookup


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, blended, out)


@functools.lru_cache(maxsize=4)
def _cos_sin(head_dim: int, max_position: int, theta: float, scaling_key: str | None, device: str):
    scaling = json.loads(scaling_key) if scaling_key else None
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif rope_type not in (None, "default"):
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (supported: default, llama3)")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None = None):
        super().__init__()
        # one table shared by all layers: 30 copies of an 8k-position table would cost 125 MB
        key = json.dumps(scaling, sort_keys=True) if scaling else None
        cos, sin = _cos_sin(head_dim, max_position, float(theta), key, str(torch.get_default_device()))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q [T, H, D], k [T, Hkv, D] rotated by their token positions [T]."""
        return self.rotate(positions, q), self.rotate(positions, k)

    def rotate(self, positions: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """heads [T, any number of heads, D] (e.g. q and k side by side, in one pass) rotated by positions [T].

        bfloat16 on AVX512 CPUs: the fused kernel (cpu_ops) rotates `heads` in place, bit-identical,
        reading the float32 tables directly (no per-step tables)."""
        if cpu_ops.rotary(positions, heads, self.cos, self.sin):
            return heads
        tables = self._tables_for(positions, heads.dtype)
        return _rotate(heads, tables.cos, tables.sin)

    def _tables_for(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        # every layer rotates the same positions: the forward context looks them up once per step
        if not has_forward_context():
            return lookup(self.cos, self.sin, positions, dtype)
        return get_forward_context().rotary.tables(self.cos, self.sin, positions, dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
