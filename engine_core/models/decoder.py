"""The decoder of every family nvllm runs (families/catalog.py), built from a ModelSpec (families/spec.py).

What sets the families apart is data in the spec, not subclasses: Qwen2's q/k/v biases, Qwen3's per-head
q/k norms, a config's attention or MLP biases, the MLP's activation, the rotary scaling, Phi-3's partial
rotary, each layer's sliding window (Mistral, Mixtral, Phi-3, Qwen2's use_sliding_window, Gemma 3), which
layers' MLP is a mixture of experts (layers/moe.py), Gemma's norm offset, embedding scale, softmax scale,
per-layer rotary base and sandwich norms (SandwichDecoderLayer). Checkpoints that store q/k/v or gate/up
fused (Phi-3's qkv_proj, gate_up_proj) load through the same layers, whose weight loaders split the fused
tensor.
"""

from typing import Iterable

import torch
from torch import nn

from engine_core.layers.attention import PagedAttention
from engine_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine_core.families.spec import ModelSpec
from engine_core.layers.linear import GateUpLinear, QKVParallelLinear, RowParallelLinear
from engine_core.layers.moe import SparseMoeBlock
from engine_core.models.moe_checkpoint import per_expert
from engine_core.layers.norm import RMSNorm
from engine_core.layers.rotary import RotaryEmbedding


class DecoderAttention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__()
        hidden = spec.hidden_size
        self.total_heads = spec.num_heads
        head_dim = spec.head_dim
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, self.total_heads, spec.num_kv_heads, spec.qkv_bias)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        # this rank's rows of o_proj are those of its query heads
        self.o_proj = RowParallelLinear(self.total_heads * head_dim, hidden, bias=spec.o_bias,
                                        input_start=self.qkv_proj.heads.q_start * head_dim,
                                        input_size=self.num_heads * head_dim)
        self.rotary = RotaryEmbedding(head_dim, spec.max_position, spec.rope_theta(layer), spec.rope_scaling(layer),
                                      spec.rope.rotary_dim)
        scale = spec.attn_scale if spec.attn_scale is not None else head_dim**-0.5
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, head_dim, scale, spec.window(layer),
                                   spec.attn_logit_softcap)
        self.q_norm = RMSNorm(head_dim, spec.norm_eps, spec.norm_offset) if spec.qk_norm else None
        self.k_norm = RMSNorm(head_dim, spec.norm_eps, spec.norm_offset) if spec.qk_norm else None

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
    def __init__(self, spec: ModelSpec):
        super().__init__()
        inter = spec.intermediate_size
        self.gate_up_proj = GateUpLinear(spec.hidden_size, inter, spec.activation, bias=spec.mlp_bias)
        self.down_proj = RowParallelLinear(inter, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, spec.norm_offset)
        self.self_attn = DecoderAttention(spec, layer)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, spec.norm_offset)
        self.mlp = SparseMoeBlock(spec) if layer in spec.sparse_layers else DecoderMLP(spec)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class SandwichDecoderLayer(DecoderLayer):
    """Gemma's layer: the attention's and the MLP's outputs are normed too before they join the residual
    stream, and the MLP has its own input norm. Named as Gemma's checkpoints name them, post_attention_layernorm
    is the norm of the attention's output here (in DecoderLayer it is the MLP's input norm)."""

    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__(spec, layer)
        self.pre_feedforward_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, spec.norm_offset)
        self.post_feedforward_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, spec.norm_offset)

    def forward(self, positions, hidden, residual):
        # (hidden, residual) is the stream split in two, as in DecoderLayer: their sum is what Gemma adds to
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class DecoderForCausalLM(nn.Module):
    cpu_decoder = None  # a CpuDecoder (cpu_kernels/decoder/) runs the layers from C where the model runner sets it

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size)
        layer_class = SandwichDecoderLayer if spec.sandwich_norms else DecoderLayer
        self.layers = nn.ModuleList(layer_class(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps, spec.norm_offset)
        self.tie_word_embeddings = spec.tie_word_embeddings
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        self.lm_head.keeps_weight = spec.tie_word_embeddings
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] for the flat batch of new tokens."""
        hidden, residual = self.embed_tokens(input_ids), None
        if self.spec.embed_scale is not None:  # rounded to the model's dtype first, as transformers' Gemma does
            hidden = hidden * torch.tensor(self.spec.embed_scale, dtype=hidden.dtype)
        ran = self.cpu_decoder.run(hidden, positions) if self.cpu_decoder is not None else None
        if ran is not None:
            hidden, residual = ran
        else:
            for layer in self.layers:
                hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = self.lm_head(hidden)
        cap = self.spec.final_logit_softcap
        if cap is not None and logits is not None:  # cap * tanh(logits / cap), as Gemma 2 computes it
            logits = torch.tanh(logits / cap) * cap
        return logits

    # checkpoint name piece -> (our fused parameter piece, shard id)
    fused = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
             "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], head_optional: bool = False) -> None:
        """head_optional: a checkpoint without lm_head.weight loads too (an embedding engine never runs the head)."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in per_expert(weights):
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.tie_word_embeddings):
                continue
            shard = None
            for piece, (fused_piece, shard_id) in self.fused.items():
                if f".{piece}." in name:
                    name, shard = name.replace(piece, fused_piece), shard_id
                    break
            # a fused checkpoint tensor (qkv_proj, gate_up_proj) keeps shard None: its loader splits it
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor.to(param.dtype), shard)
            loaded.add(name)
        # a layer given its GGUF blocks before the load (weights/quantized.py) needs no float weight
        blocks = {f"{m_name}.weight" for m_name, m in self.named_modules()
                  if getattr(m, "quantized_weight", None) is not None}
        missing = {n for n in params if n not in loaded and n not in blocks
                   and not (n == "lm_head.weight" and (self.tie_word_embeddings or head_optional))}
        # fused parameters are loaded through their pieces
        if missing:
            raise ValueError(f"checkpoint lacks tensors for: {sorted(missing)[:5]}")
