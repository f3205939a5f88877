"""MoE GGUFs as llama.cpp writes them (qwen2moe, qwen3moe, and Mixtral as a "llama" with experts): 3-D expert
tensors, the router, Qwen2-MoE's shared expert, the expert metadata keys. Written here from a tiny transformers
model, imported, and run: the logits equal transformers' on the model the file was written from; experts stored
Q8_0 stay quantized, one tensor per expert."""

import json
import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from common.config import EngineArgs
from tests.support.tiny_models import build_tiny_model
from engine_core.engine_config import resolve_engine_config
from engine_core.layers import cpu_packing
from engine_core.models.moe_checkpoint import per_expert
from engine_core.weights.gguf_import import QUANTIZED_FILE, import_gguf
from engine_core.weights.loader import quantized_tensors
from engine_core.worker.model_runner import ModelRunner
from tests.support.gguf_writing import add_tensor, add_tiny_tokenizer, permute_qk
from tests.support.paged_kv_logits import hf_logits, make_runner, run_step

pytestmark = pytest.mark.integration

VOCAB = 261  # add_tiny_tokenizer's
GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
TOKENS = [5, 200, 17, 260, 31, 99, 3, 150, 42, 77, 8, 180, 64]
# HF name piece -> llama.cpp's, per layer
_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
                "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
                "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
                "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def write_moe_gguf(hf_folder: str, path: str, arch: str, q8_experts: bool = False) -> None:
    """The HF checkpoint at `hf_folder` as llama.cpp's converter writes it."""
    import gguf

    with open(os.path.join(hf_folder, "config.json")) as f:
        config = json.load(f)
    checkpoint = load_file(os.path.join(hf_folder, "model.safetensors"))
    tensors = {k.removeprefix("model."): v.numpy() for k, v in per_expert(checkpoint.items())}  # Mixtral's as Qwen's
    name = GGUF_ARCH[arch]
    writer = gguf.GGUFWriter(path, name)
    add_tiny_tokenizer(writer)
    layers, heads, kv = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(VOCAB)
    writer.add_expert_count(config.get("num_experts") or config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    if arch != "mixtral":
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_weights_norm(config["norm_topk_prob"])
    if arch == "qwen2_moe":
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])

    def add(gguf_name, values, quantize=False):
        add_tensor(writer, gguf_name, values, quantize)

    add("token_embd.weight", tensors.pop("embed_tokens.weight"))
    add("output_norm.weight", tensors.pop("norm.weight"))
    add("output.weight", tensors.pop("lm_head.weight"))
    for i in range(layers):
        experts = sorted({int(k.split(".")[4]) for k in tensors if k.startswith(f"layers.{i}.mlp.experts.")})
        for hf, cpp in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            if experts:  # every expert's matrix in one 3-D tensor [experts, rows, columns]
                stacked = np.stack([tensors.pop(f"layers.{i}.mlp.experts.{e}.{hf}.weight") for e in experts])
                add(f"blk.{i}.{cpp}.weight", stacked, quantize=q8_experts)
        for key in sorted(k for k in tensors if k.startswith(f"layers.{i}.")):
            piece, _, suffix = key.removeprefix(f"layers.{i}.").rpartition(".")
            values = tensors.pop(key)
            if arch == "mixtral" and piece in ("self_attn.q_proj", "self_attn.k_proj"):
                values = permute_qk(values, heads if piece.endswith("q_proj") else kv)
            if piece == "mlp.shared_expert_gate":
                values = values[0]  # llama.cpp keeps it as a vector
            add(f"blk.{i}.{_LAYER_NAMES[piece]}.{suffix}", values)
    assert not tensors, sorted(tensors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("moe-gguf")
    return {arch: build_tiny_model(str(root / arch), arch, default_model_dir, vocab_size=VOCAB)
            for arch in GGUF_ARCH}


@pytest.mark.parametrize("arch", sorted(GGUF_ARCH))
def test_an_moe_gguf_imports_as_its_family_and_runs_as_transformers(hf_models, arch, tmp_path):
    write_moe_gguf(hf_models[arch], str(tmp_path / "m.gguf"), arch)
    folder = import_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "imported"))
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == arch and config["num_experts_per_tok"] == (4 if arch == "qwen3_moe" else 2)
    if arch == "qwen2_moe":  # layer 0 of the tiny Qwen2-MoE is dense: it has no router in the file
        assert config["mlp_only_layers"] == [0] and config["shared_expert_intermediate_size"] == 48
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_models[arch], dtype=torch.float32).eval()
    (ours,) = run_step(make_runner(folder), [(TOKENS, 0, [3, 1, 2, 0])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=0)


def test_q8_0_experts_stay_quantized_one_tensor_per_expert(hf_models, tmp_path):
    write_moe_gguf(hf_models["qwen3_moe"], str(tmp_path / "q.gguf"), "qwen3_moe", q8_experts=True)
    folder = import_gguf(str(tmp_path / "q.gguf"), str(tmp_path / "imported"))
    kept = quantized_tensors(folder)
    assert os.path.exists(os.path.join(folder, QUANTIZED_FILE))
    assert sorted(kept) == sorted(f"model.layers.{i}.mlp.experts.{e}.{p}.weight" for i in range(2) for e in range(8)
                                  for p in ("gate_proj", "up_proj", "down_proj"))
    quantized = make_runner(folder)  # quantization auto: kept where a kernel takes them
    experts = quantized.model.layers[1].mlp.experts
    assert all(isinstance(layer.packed_weight, cpu_packing.QuantizedPack)
               for expert in experts for layer in (expert.gate_up_proj, expert.down_proj))
    dequantized = ModelRunner(resolve_engine_config(EngineArgs(model=folder, dtype="float32", device="cpu",
                                                               block_size=4, kv_cache_memory="16MiB",
                                                               quantization="none")))
    dequantized.allocate_kv_cache(64)
    (kept_logits,) = run_step(quantized, [(TOKENS, 0, [3, 1, 2, 0])])
    (float_logits,) = run_step(dequantized, [(TOKENS, 0, [3, 1, 2, 0])])
    torch.testing.assert_close(kept_logits, float_logits, atol=1e-4, rtol=0)


def test_tp2_keeps_each_ranks_expert_shards_quantized(default_model_dir, tmp_path):
    """Q8_0 experts 64 wide over two ranks: each rank keeps its 32 rows of gate/up and its 32 inputs of down (one
    whole block) quantized, and the greedy tokens and logprobs equal the dequantized TP=2 engine's."""
    from frontend.offline.llm import LLM
    from common.sampling_params import SamplingParams

    hf_folder = build_tiny_model(str(tmp_path / "hf"), "qwen3_moe", default_model_dir, vocab_size=VOCAB,
                                 moe_intermediate_size=64)
    write_moe_gguf(hf_folder, str(tmp_path / "q.gguf"), "qwen3_moe", q8_experts=True)
    folder = import_gguf(str(tmp_path / "q.gguf"), str(tmp_path / "imported"))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    answers = {}
    for mode in ("auto", "none"):
        llm = LLM(folder, tensor_parallel_size=2, quantization=mode, multiprocess=False, dtype="float32",
                  kv_cache_memory="16MiB", max_model_len=64)
        try:
            runner = llm.client.core.executor.runner
            # 2 layers x 8 experts x (gate_up, down)
            assert runner.quantization == ("none" if mode == "none" else "32 layers q8_0")
            answers[mode] = [(o.outputs[0].token_ids, o.outputs[0].logprobs)
                             for o in llm.generate([TOKENS, TOKENS[:5]], params, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert answers["auto"] == answers["none"]
