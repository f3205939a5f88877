"""Mixture-of-experts families (Qwen2-MoE, Qwen3-MoE, Mixtral): their configs read into the spec, the grouped
expert path equals running each token's experts one by one, routing however uneven, a token's logits the same
alone and in any batch, and the models' float32 logits and greedy tokens equal transformers'."""

import json
import os

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from tests.support.tiny_models import build_tiny_model
from engine_core.families.catalog import read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.layers import moe
from engine_core.cpu_kernels.decoder.loop_avx512_bf16 import spec_issue
from engine_core.weights.model_folder import read_hf_config
from tests.support.preemption_check import assert_greedy_under_preemption
from tests.support.paged_kv_logits import (TOKENS, check_chunked_prefill, check_decode_after_prefill, check_prefill,
                                           check_prefix_hit_and_mixed_batch, hf_logits, make_runner, run_step)

pytestmark = pytest.mark.integration

ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral")
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2)


# ---- config.json -> ModelSpec ----------------------------------------------------------------------------

def saved_config(tmp_path, config_class, **fields) -> dict:
    folder = tmp_path / config_class.__name__
    config_class(**(SMALL | fields)).save_pretrained(folder)
    return read_hf_config(str(folder))


def test_qwen2_moe_reads_its_experts_shared_expert_and_sparse_layers(tmp_path):
    spec = read_spec(saved_config(tmp_path, transformers.Qwen2MoeConfig, num_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                  decoder_sparse_step=2, mlp_only_layers=[3]))
    assert (spec.family, spec.num_experts, spec.experts_per_token, spec.renormalize_topk) == ("qwen2_moe", 8, 2, False)
    assert (spec.moe_intermediate_size, spec.shared_expert_intermediate_size) == (32, 48)
    assert spec.sparse_layers == (1,)  # every 2nd layer (1 and 3), less the dense-only layer 3
    assert spec.qkv_bias and not spec.o_bias


def test_qwen3_moe_reads_either_expert_count_name_and_renormalisation(tmp_path):
    config = saved_config(tmp_path, transformers.Qwen3MoeConfig, num_experts=8, num_experts_per_tok=4,
                          moe_intermediate_size=32, norm_topk_prob=True)
    spec = read_spec(config)
    assert (spec.num_experts, spec.experts_per_token, spec.renormalize_topk) == (8, 4, True)
    assert spec.sparse_layers == (0, 1, 2, 3) and spec.shared_expert_intermediate_size == 0 and spec.qk_norm
    # transformers 5 writes num_local_experts; released Qwen3-MoE configs say num_experts
    released = {k: v for k, v in config.items() if k != "num_local_experts"} | {"num_experts": 8}
    assert read_spec(released) == spec


def test_mixtral_always_renormalises_and_slides_every_layer_by_its_window(tmp_path):
    config = saved_config(tmp_path, transformers.MixtralConfig, num_local_experts=8, num_experts_per_tok=2,
                          router_jitter_noise=0.1)
    spec = read_spec(config)
    assert (spec.num_experts, spec.experts_per_token, spec.renormalize_topk) == (8, 2, True)
    assert spec.moe_intermediate_size == 128 and spec.sparse_layers == (0, 1, 2, 3) and spec.layer_windows == ()
    assert read_spec(config | {"sliding_window": 4096}).layer_windows == (4096,) * 4


def test_a_released_qwen1_5_moe_config_reads():
    """Qwen1.5-MoE-A2.7B's config.json as published (older transformers: rope_theta at the top, no qkv_bias, a
    sliding window named but switched off)."""
    config = {"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
              "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
              "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
              "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
              "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
              "use_cache": True, "use_sliding_window": False, "vocab_size": 151936, "decoder_sparse_step": 1,
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
              "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
              "router_aux_loss_coef": 0.001}
    spec = read_spec(config | {"head_dim": 128, "rope_scaling": None})  # as model_folder.py fills them in
    assert (spec.num_experts, spec.experts_per_token, spec.shared_expert_intermediate_size) == (60, 4, 5632)
    assert spec.sparse_layers == tuple(range(24)) and spec.qkv_bias and spec.layer_windows == ()


def test_moe_fields_are_refused_by_name_where_they_make_no_sense(tmp_path):
    config = saved_config(tmp_path, transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2)
    with pytest.raises(UnsupportedConfig, match="num_experts_per_tok"):
        read_spec(config | {"num_experts_per_tok": 5})
    with pytest.raises(UnsupportedConfig, match="decoder_sparse_step"):
        read_spec(config | {"decoder_sparse_step": 0})
    with pytest.raises(UnsupportedConfig, match="attention_chunk_size"):  # read by transformers' mask code
        read_spec(config | {"attention_chunk_size": 64})
    # a Qwen3-MoE fine-tune's switches (what the family does anyway) and a loss term transformers' Qwen3-MoE never
    # reads: ignored
    fine_tune = {"router_z_loss_coef": 0.001, "qkv_bias": False, "use_qk_norm": True}
    assert read_spec(config | fine_tune) == read_spec(config)


def test_the_c_loop_refuses_experts_by_name(tmp_path):
    spec = read_spec(saved_config(tmp_path, transformers.MixtralConfig, num_local_experts=4))
    assert spec_issue(spec).startswith("num_experts = 4")


# ---- the grouped expert path --------------------------------------------------------------------------

class _Expert(torch.nn.Module):
    """A stand-in expert: a fixed nonlinear map, and a count of the rows it was run on."""

    def __init__(self, seed: int):
        super().__init__()
        self.weight = torch.randn(16, 16, generator=torch.Generator().manual_seed(seed))
        self.rows = 0

    def forward(self, x):
        self.rows += x.shape[0]
        return torch.tanh(x @ self.weight)


def one_by_one(x, experts, weights, mlps):
    return torch.stack([sum(weights[t, j] * mlps[int(experts[t, j])](x[t:t + 1])[0] for j in range(experts.shape[1]))
                        for t in range(x.shape[0])])


def test_uneven_routing_runs_each_expert_once_on_its_rows_only():
    """Expert 5 gets almost every token, experts 0, 6 and 7 none: the idle experts never run, each expert runs
    on just the rows that chose it, and each token's sum equals running its experts one by one."""
    torch.manual_seed(0)
    mlps = torch.nn.ModuleList(_Expert(e) for e in range(8))
    x = torch.randn(9, 16)
    experts = torch.tensor([[5, 1], [5, 2], [3, 5], [5, 1], [5, 4], [2, 5], [5, 3], [5, 1], [4, 5]])
    weights = torch.softmax(torch.randn(9, 2), dim=-1)
    got = moe.run_grouped(x, experts, weights, mlps)
    assert [m.rows for m in mlps] == [0, 3, 2, 2, 2, 9, 0, 0]
    torch.testing.assert_close(got, one_by_one(x, experts, weights, mlps), atol=1e-6, rtol=0)


def test_route_takes_the_top_k_of_a_float32_softmax_most_probable_first():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]], dtype=torch.bfloat16)
    weights, experts = moe.route(logits, 2, renormalize=False)
    probs = torch.softmax(torch.tensor([0.0, 3.0, 1.0, 2.0]), dim=-1)
    assert experts.tolist() == [[1, 3]] and weights.dtype == torch.float32
    torch.testing.assert_close(weights[0], probs[[1, 3]])
    weights, _ = moe.route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights[0], probs[[1, 3]] / probs[[1, 3]].sum())


# ---- the models against transformers --------------------------------------------------------------------

@pytest.fixture(scope="module")
def moe_models(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("moe")
    return {arch: build_tiny_model(str(root / arch), arch, default_model_dir) for arch in ARCHS}


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, moe_models):
    path = moe_models[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return make_runner(path), hf


# the logits comparisons of every family (test_model_vs_transformers.py's too), on this module's `pair`
def test_prefill(pair):
    check_prefill(pair)


def test_decode_after_prefill(pair):
    check_decode_after_prefill(pair)


def test_chunked_prefill(pair):
    check_chunked_prefill(pair)


def test_prefix_hit_and_mixed_batch(pair):
    check_prefix_hit_and_mixed_batch(pair)


def test_a_tokens_logits_are_the_same_alone_and_in_a_batch(pair):
    runner, _ = pair
    alone = run_step(runner, [(TOKENS[:9], 0, [20, 21, 22])])[0]
    others = [(TOKENS[9:], 0, [30, 31, 32, 33]), (TOKENS[4:6], 0, [40])]
    batched = run_step(runner, [others[0], (TOKENS[:9], 0, [23, 24, 25]), others[1]])[1]
    assert torch.equal(alone, batched)


def fused_copy(path: str, out: str) -> str:
    """The checkpoint at `path` with each MoE layer's experts fused into transformers 5's 3-D tensors."""
    os.makedirs(out)
    for name in os.listdir(path):
        if name != "model.safetensors":
            with open(os.path.join(path, name), "rb") as src, open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
    tensors = load_file(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    experts = config.get("num_experts") or config["num_local_experts"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.0.gate_proj.weight" not in tensors:
            continue
        pop = [lambda kind, e=e: tensors.pop(f"{prefix}.{e}.{kind}.weight") for e in range(experts)]
        tensors[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([p("gate_proj"), p("up_proj")]) for p in pop])
        tensors[f"{prefix}.down_proj"] = torch.stack([p("down_proj") for p in pop])
    save_file(tensors, os.path.join(out, "model.safetensors"))
    return out


def test_fused_3d_experts_load_as_the_per_expert_tensors(moe_models, tmp_path):
    """Qwen2-MoE's checkpoint as a per-expert one and as transformers 5's fused one: the same logits."""
    path = moe_models["qwen2_moe"]
    fused = fused_copy(path, str(tmp_path / "fused"))
    per_expert = run_step(make_runner(path), [(TOKENS, 0, [1, 2, 3, 4, 5, 6])])[0]
    assert torch.equal(run_step(make_runner(fused), [(TOKENS, 0, [1, 2, 3, 4, 5, 6])])[0], per_expert)


def mixtral_with_biased_router(path: str, out: str) -> str:
    """The tiny Mixtral with every token's hidden state leaning one way, and routers that send that way to expert
    2 and away from experts 6 and 7: expert 2 gets nearly every token, 6 and 7 none."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        lean = torch.randn(hf.config.hidden_size, generator=torch.Generator().manual_seed(3))
        hf.model.embed_tokens.weight.add_(lean)
        for layer in hf.model.layers:
            router = layer.mlp.gate.weight
            router[2] = 4 * lean / lean.norm()
            router[6:] = -4 * lean / lean.norm()
    hf.save_pretrained(out)
    for name in os.listdir(path):
        if not os.path.exists(os.path.join(out, name)):
            with open(os.path.join(path, name), "rb") as src, open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
    return out


def test_uneven_routing_in_a_model_matches_transformers(moe_models, tmp_path, monkeypatch):
    path = mixtral_with_biased_router(moe_models["mixtral"], str(tmp_path / "biased"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = make_runner(path)
    counts = []
    route = moe.route

    def counting_route(logits, top_k, renormalize):
        weights, experts = route(logits, top_k, renormalize)
        counts.append(torch.bincount(experts.reshape(-1), minlength=8).tolist())
        return weights, experts

    monkeypatch.setattr(moe, "route", counting_route)
    (ours,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=0)
    for layer in counts:
        assert layer[2] >= 20 and layer[6] == layer[7] == 0, counts


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_greedy_generate_with_preemption_matches(moe_models, arch):
    """Through the whole engine, with a pool so small that requests are preempted and recomputed."""
    prompts = [TOKENS[:9], TOKENS[3:20], TOKENS[5:11], TOKENS[:17]]
    assert_greedy_under_preemption(moe_models[arch], prompts, blocks=24)
