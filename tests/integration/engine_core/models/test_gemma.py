"""Gemma 2 (Gemma2ForCausalLM) and Gemma 3 (Gemma3ForCausalLM): float32 logits equal transformers' through the
paged KV cache's paths, greedy tokens equal its generate through the whole engine (with preemption), TP=2 equal to
TP=1, and both forms of Gemma 3's config.json read alike. The tiny Gemma 2 caps its attention scores at 2.0, which
binds (the logits without the cap are far from transformers')."""

import json

import pytest
import torch
import transformers

from tests.support.tiny_models import build_tiny_model
from engine_core.families.catalog import read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.weights.model_folder import read_hf_config
from tests.support.paged_kv_logits import ATOL, TOKENS, hf_logits, make_runner, run_step

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, default_model_dir):
    return build_tiny_model(str(tmp_path_factory.mktemp("gemma") / "gemma3"), "gemma3", default_model_dir)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory, default_model_dir):
    return build_tiny_model(str(tmp_path_factory.mktemp("gemma") / "gemma2"), "gemma2", default_model_dir)


@pytest.fixture(scope="module", params=["gemma", "gemma2"])
def model(request):
    """Each tiny Gemma in turn: the tests both run alike."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def pair(model):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    return make_runner(model), hf


def test_the_spec_carries_gemmas_differences(gemma):
    spec = read_spec(read_hf_config(gemma))
    assert (spec.family, spec.activation, spec.norm_offset, spec.sandwich_norms) == ("gemma3", "gelu_tanh", 1.0, True)
    assert spec.embed_scale == 64 ** 0.5 and spec.attn_scale == 24 ** -0.5
    assert spec.layer_windows == (4096, None)
    assert (spec.rope_theta(0), spec.rope_theta(1)) == (10000.0, 1000000.0)


def test_an_older_config_reads_as_the_newer_one(tmp_path, gemma):
    """Configs on the Hub written before layer_types and per-layer-type rope_parameters: sliding_window_pattern,
    rope_theta and rope_local_base_freq."""
    with open(f"{gemma}/config.json") as f:
        config = json.load(f)
    old = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters", "_sliding_window_pattern")}
    old |= {"sliding_window_pattern": 2, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": None}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert read_spec(read_hf_config(str(tmp_path))) == read_spec(read_hf_config(gemma))


def test_gemma2s_spec(gemma2):
    """Sandwich norms, norm offset, embedding scale, query_pre_attn_scalar, GeGLU as Gemma 3; layers alternate
    (the first slides), one rotary base, no q/k norms, both soft caps."""
    spec = read_spec(read_hf_config(gemma2))
    assert (spec.family, spec.activation, spec.norm_offset, spec.sandwich_norms) == ("gemma2", "gelu_tanh", 1.0, True)
    assert spec.embed_scale == 64 ** 0.5 and spec.attn_scale == 24 ** -0.5 and not spec.qk_norm
    assert spec.layer_windows == (4096, None)
    assert spec.rope_theta(0) == spec.rope_theta(1) == 10000.0
    assert (spec.attn_logit_softcap, spec.final_logit_softcap) == (2.0, 5.0)


def test_a_published_gemma2_config_reads(tmp_path, gemma2):
    """google/gemma-2-2b's config.json form: hidden_act beside hidden_activation, top-level rope_theta,
    cache_implementation, no layer_types (alternating by default)."""
    with open(f"{gemma2}/config.json") as f:
        config = json.load(f)
    old = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters")}
    old |= {"hidden_act": "gelu_pytorch_tanh", "rope_theta": 10000.0, "cache_implementation": "hybrid"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert read_spec(read_hf_config(str(tmp_path))) == read_spec(read_hf_config(gemma2))


def test_gemma3_caps_its_scores_where_its_config_says(gemma):
    spec = read_spec(read_hf_config(gemma) | {"attn_logit_softcapping": 50.0})
    assert spec.attn_logit_softcap == 50.0


@pytest.mark.parametrize("field, value", [("attn_logit_softcapping", -1.0), ("use_bidirectional_attention", True)])
def test_what_nvllm_does_not_implement_is_refused_by_name(gemma, field, value):
    config = read_hf_config(gemma) | {field: value}
    with pytest.raises(UnsupportedConfig, match=field):
        read_spec(config)


def test_prefill_decode_and_chunked_prefill(pair):
    runner, hf = pair
    ref = hf_logits(hf, TOKENS)
    (prefill,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    torch.testing.assert_close(prefill, ref, atol=ATOL, rtol=0)
    table = [11, 4, 20, 8, 13, 6]
    chunks = [run_step(runner, [(TOKENS[:end], start, table)])[0] for start, end in ((0, 7), (7, 16), (16, 22))]
    (decode,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat(chunks + [decode]), ref, atol=ATOL, rtol=0)


def test_the_attention_cap_binds(gemma2):
    """Without its score cap the tiny Gemma 2 is far from transformers: the logits tests above check the cap."""
    runner = make_runner(gemma2)
    for layer in runner.model.layers:
        layer.self_attn.attn.softcap = None
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma2, torch_dtype=torch.float32).eval()
    (uncapped,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    assert (uncapped - hf_logits(hf, TOKENS)).abs().max() > 100 * ATOL


def test_gemma2_through_the_torch_backend(gemma2, monkeypatch):
    """The torch backend (what --no-batch-invariant and GPUs without Triton take; SDPA, spelled out where
    capped) gives the same logits as the generic C kernel the other tests run here."""
    from engine_core.attention import torch_backend
    from engine_core.attention.torch_backend import TorchAttentionBackend
    capped = []
    monkeypatch.setattr(torch_backend, "capped_attention",
                        lambda *args, spelled=torch_backend.capped_attention: capped.append(1) or spelled(*args))
    runner = make_runner(gemma2)
    runner.backend = TorchAttentionBackend()
    runner.model.cpu_decoder = None  # the layers call the backend (the float32 C loop calls the C kernel)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma2, torch_dtype=torch.float32).eval()
    table = [11, 4, 20, 8, 13, 6]
    chunks = [run_step(runner, [(TOKENS[:end], start, table)])[0] for start, end in ((0, 7), (7, 22))]
    (decode,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat(chunks + [decode]), hf_logits(hf, TOKENS), atol=ATOL, rtol=0)
    assert capped


def test_prefix_hit_in_a_mixed_batch(pair):
    runner, hf = pair
    a, b = TOKENS[:12] + [7, 8, 9], TOKENS[:12] + [100, 200, 300, 400, 500]
    run_step(runner, [(a[:-1], 0, [1, 2, 3, 4])])
    rows_a, rows_b = run_step(runner, [(a, len(a) - 1, [1, 2, 3, 4]), (b, 12, [1, 2, 3, 50, 51])])
    torch.testing.assert_close(rows_a[0], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows_b, hf_logits(hf, b)[12:], atol=ATOL, rtol=0)


def greedy(model: str, prompts, **engine) -> list[list[int]]:
    from frontend import LLM, SamplingParams

    llm = LLM(model, dtype="float32", block_size=4, max_model_len=96, **engine)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        stats = llm.get_stats()
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
        return [o.outputs[0].token_ids for o in outs], stats.totals.num_preemptions
    finally:
        llm.shutdown()


PROMPTS = [TOKENS[:9], TOKENS[3:20], TOKENS[5:11], TOKENS[:17]]


def test_greedy_generate_with_preemption_and_tp2(model):
    """A pool too small for the four requests (preempted, recomputed) gives transformers' tokens; so does TP=2."""
    gemma = model
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma, torch_dtype=torch.float32).eval()
    expected = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
        expected.append(out[0, len(prompt):].tolist())
    block = 2 * 2 * 4 * 2 * 16 * 4  # K and V, 2 layers, 4 tokens, 2 KV heads of 16 float32s
    # in-process: every request is queued before the first step, so the pool runs short whatever the machine's load
    tokens, preemptions = greedy(gemma, PROMPTS, kv_cache_memory=24 * block, max_num_batched_tokens=16,
                                 multiprocess=False)
    assert preemptions > 0 and tokens == expected
    assert greedy(gemma, PROMPTS, tensor_parallel_size=2)[0] == expected
