"""Tiny random models built with transformers (saved as HF folders with the SmolLM2 tokenizer), and the size of
a KV cache block, for tests that size a small cache."""

import json
import os
import shutil

import torch


def kv_block_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str = "auto", block_size: int = 16) -> int:
    """Bytes of one KV cache block (keys and values, every layer) in the dtype the engine resolves `dtype` to
    on this CPU (auto: bfloat16 with AVX512-BF16 or AMX, else float32): a test sizes a small cache in blocks."""
    from engine_core.platform.device import pick_dtype
    itemsize = torch.empty(0, dtype=pick_dtype(dtype, torch.device("cpu"))).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


DEFAULT_MODEL_KV = (30, 3, 64)  # the default model's layers, KV heads and head dim


def build_tiny_model(path: str, arch: str, tokenizer_dir: str, num_kv_heads: int = 2, num_heads: int = 4,
                     seed: int = 0, save_dtype: torch.dtype = torch.float32, **overrides) -> str:
    """A 2-layer random model of `arch` saved with save_pretrained (in `save_dtype`), with the SmolLM2 tokenizer."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    common.update(overrides)
    if arch == "llama":
        config = transformers.LlamaConfig(**({"head_dim": 16} | common))
        model = transformers.LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**({"head_dim": 32} | common))
        model = transformers.Qwen3ForCausalLM(config)
    elif arch == "mistral":  # every layer slides: a window smaller than the tests' 23-token prompts
        config = transformers.MistralConfig(**({"sliding_window": 8} | common))
        model = transformers.MistralForCausalLM(config)
    elif arch == "gemma3":
        # one sliding and one global layer, each with its own rotary base; a window wider than the tests' prompts
        # unless a test names one
        gemma = {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4096,
                 "query_pre_attn_scalar": 24, "rope_parameters": {
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}
        config = transformers.Gemma3TextConfig(**(gemma | common))
        model = transformers.Gemma3ForCausalLM(config)
    elif arch == "gemma2":
        # alternating layers (the first slides: transformers' default), one rotary base; caps of 2.0 (scores, which
        # the q/k scaling below makes reach it) and 5.0 (logits) that bind on random weights, unlike Gemma 2's
        # 50 and 30; a window wider than the tests' prompts unless a test names one
        gemma = {"head_dim": 16, "sliding_window": 4096, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0,
                 "final_logit_softcapping": 5.0}
        config = transformers.Gemma2Config(**(gemma | common))
        model = transformers.Gemma2ForCausalLM(config)
        with torch.no_grad():  # random q and k score ~0.02; these make them ~1-10, where a cap of 2 changes them
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8.0)
                layer.self_attn.k_proj.weight.mul_(8.0)
    elif arch == "qwen2_moe":  # 8 experts, top 2, a shared expert; layer 1 sparse, layer 0 dense by default
        moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                   decoder_sparse_step=1, mlp_only_layers=[0])
        config = transformers.Qwen2MoeConfig(**(moe | common))
        model = transformers.Qwen2MoeForCausalLM(config)
    elif arch == "qwen3_moe":  # 8 experts, top 4, renormalised
        moe = dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True, head_dim=32)
        config = transformers.Qwen3MoeConfig(**(moe | common))
        model = transformers.Qwen3MoeForCausalLM(config)
    elif arch == "mixtral":  # 8 experts of intermediate_size, top 2
        config = transformers.MixtralConfig(**(dict(num_local_experts=8, num_experts_per_tok=2, head_dim=16) | common))
        model = transformers.MixtralForCausalLM(config)
    elif arch == "phi3":  # q/k/v and gate/up stored fused; head_dim 16 (hidden / heads)
        config = transformers.Phi3Config(**common)
        model = transformers.Phi3ForCausalLM(config)
    else:
        raise ValueError(arch)
    # random init leaves norms at 1 and biases at 0 (and MoE routers at 0: every expert equally likely):
    # perturb them so those paths are checked
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    model.to(save_dtype).save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        src = os.path.join(tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copy(src, path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 2, "bos_token_id": 1}, f)
    return path
