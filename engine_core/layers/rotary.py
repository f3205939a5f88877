"""Rotary position embeddings (rotate-half layout) over each head's leading `rotary_dim` dims (all of them, or
Phi-3's partial share; the rest pass unchanged), with the rope scalings families/rope_scaling.py reads: linear,
Llama 3, YaRN, LongRoPE."""

import functools
import json
import math

import torch
from torch import nn

from engine_core.layers.forward_context import get_forward_context, has_forward_context
from engine_core.cpu_kernels.ops import fused_ops
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


def _yarn_inv_freq(dim: int, theta: float, scaling: dict) -> torch.Tensor:
    # YaRN: each frequency blends its interpolated (slowed by `factor`) and extrapolated (kept) form, by how many
    # turns it makes over the original context: fast ones (over beta_fast turns) kept, slow ones (under beta_slow)
    # interpolated, a linear ramp between (the same arithmetic, in the same order, as transformers')
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

    def dim_of(turns: float) -> float:
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling["beta_fast"]), dim_of(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of no width
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    kept = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept


def _longrope_inv_freq(dim: int, theta: float, scaling: dict, max_position: int) -> torch.Tensor:
    # LongRoPE divides each frequency by its own factor: the short set for sequences within the original context,
    # the long set beyond it. transformers picks the set per forward call by the call's longest position, so a
    # token's result would depend on how long its sequence (or, batched, its neighbours) had grown, and keys
    # cached under one set would be read by queries under the other. nvllm, as vLLM, picks one set per engine:
    # the long set where it runs sequences longer than the original context (max_position here is the engine's
    # max_model_len, see spec.for_context), else the short set. An engine whose max_model_len is within the
    # original context equals transformers; one past it equals transformers for a prompt longer than the original
    # context prefilled in one call, and rotates a shorter sequence with the long set where transformers would not.
    long = max_position > scaling["original_max_position_embeddings"]
    factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    return 1.0 / (factors * theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


@functools.lru_cache(maxsize=4)
def _cos_sin(rotary_dim: int, max_position: int, theta: float, scaling_key: str | None, device: str):
    """cos/sin [max_position, rotary_dim] float32 tables, scaled by the rope type's attention factor."""
    scaling = json.loads(scaling_key) if scaling_key else {"rope_type": "default"}
    rope_type, dim = scaling["rope_type"], rotary_dim
    if rope_type == "yarn":
        inv_freq = _yarn_inv_freq(dim, theta, scaling)
    elif rope_type == "longrope":
        inv_freq = _longrope_inv_freq(dim, theta, scaling, max_position)
    else:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif rope_type == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif rope_type != "default":
            raise ValueError(f"rope_scaling type {rope_type!r} is not supported (families/rope_scaling.py)")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    attention = scaling.get("attention_factor", 1.0)
    if attention != 1.0:  # YaRN's and LongRoPE's: scales q.k (both are rotated) by its square
        cos, sin = cos * attention, sin * attention
    return cos.to(device), sin.to(device)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None = None,
                 rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        # one table shared by all layers: 30 copies of an 8k-position table would cost 125 MB
        key = json.dumps(scaling, sort_keys=True) if scaling else None
        cos, sin = _cos_sin(self.rotary_dim, max_position, float(theta), key, str(torch.get_default_device()))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q [T, H, D], k [T, Hkv, D] rotated by their token positions [T]."""
        return self.rotate(positions, q), self.rotate(positions, k)

    def rotate(self, positions: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """heads [T, any number of heads, D] (e.g. q and k side by side, in one pass) rotated by positions [T].

        bfloat16 on AVX512 CPUs: the fused kernel (fused_ops) rotates `heads` in place, bit-identical,
        reading the float32 tables directly (no per-step tables)."""
        if fused_ops.rotary(positions, heads, self.cos, self.sin):
            return heads
        tables = self._tables_for(positions, heads.dtype)
        if self.rotary_dim == self.head_dim:
            return _rotate(heads, tables.cos, tables.sin)
        rotated = _rotate(heads[..., :self.rotary_dim], tables.cos, tables.sin)
        return torch.cat([rotated, heads[..., self.rotary_dim:]], dim=-1)

    def _tables_for(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        # every layer rotates the same positions: the forward context looks them up once per step
        if not has_forward_context():
            return lookup(self.cos, self.sin, positions, dtype)
        return get_forward_context().rotary.tables(self.cos, self.sin, positions, dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
