"""Llama-family decoder (SmolLM2, Llama 3); Qwen2 and Qwen3 are variations of it.

Variations are switched by class attributes: Qwen2 adds biases to q/k/v, Qwen3 RMS-normalises
q and k per head before the rotary embedding.
"""

from typing import Iterable

import torch
from torch import nn

from engine_core.layers.attention import PagedAttention
from engine_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine_core.layers.linear import GateUpSiluLinear, QKVParallelLinear, RowParallelLinear
from engine_core.layers.norm import RMSNorm
from engine_core.layers.rotary import RotaryEmbedding


class DecoderAttention(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        hidden = config.hidden_size
        # Llama and Qwen3 configs may ask for biases on every attention projection
        o_bias = bool(getattr(config, "attention_bias", False)) and not qkv_bias
        qkv_bias = qkv_bias or bool(getattr(config, "attention_bias", False))
        self.total_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // self.total_heads
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, self.total_heads, config.num_key_value_heads, qkv_bias)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        # this rank's rows of o_proj are those of its query heads
        self.o_proj = RowParallelLinear(self.total_heads * head_dim, hidden, bias=o_bias,
                                        input_start=self.qkv_proj.heads.q_start * head_dim,
                                        input_size=self.num_heads * head_dim)
        self.rotary = RotaryEmbedding(head_dim, config.max_position_embeddings, config.rope_theta,
                                      config.rope_scaling)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5)
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = self.qkv_proj(x)
        v = qkv[:, q_size + kv_size:].view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:  # q and k sit side by side: rotate them in one pass
            qk = qkv[:, : q_size + kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = self.rotary.rotate(positions, qk).split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = self.q_norm(qkv[:, :q_size].view(T, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, q_size: q_size + kv_size].view(T, self.num_kv_heads, self.head_dim))
            q, k = self.rotary(positions, q, k)
        out = self.attn(q, k, v)
        return self.o_proj(out.reshape(T, q_size))


class DecoderMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = GateUpSiluLinear(config.hidden_size, inter)
        self.down_proj = RowParallelLinear(inter, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DecoderAttention(config, qkv_bias, qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DecoderMLP(config)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False
    cpu_decoder = None  # a CpuDecoder (cpu_decoder.py) runs the layers from C where the model runner sets one

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.qkv_bias, self.qk_norm)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] for the flat batch of new tokens."""
        hidden, residual = self.embed_tokens(input_ids), None
        ran = self.cpu_decoder.run(hidden, positions) if self.cpu_decoder is not None else None
        if ran is not None:
            hidden, residual = ran
        else:
            for layer in self.layers:
                hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head(hidden)

    # checkpoint name piece -> (our fused parameter piece, shard id)
    fused = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
             "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.tie_word_embeddings):
                continue
            shard = None
            for piece, (fused_piece, shard_id) in self.fused.items():
                if f".{piece}." in name:
                    name, shard = name.replace(piece, fused_piece), shard_id
                    break
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor.to(param.dtype), shard)
            loaded.add(name)
        missing = {n for n in params if n not in loaded and not (n == "lm_head.weight" and self.tie_word_embeddings)}
        # fused parameters are loaded through their pieces
        if missing:
            raise ValueError(f"checkpoint lacks tensors for: {sorted(missing)[:5]}")
