"""LoRA adapters offline (LLM(enable_lora=True).generate(lora_request=...)): PEFT adapters made here on tiny random
Llama and Qwen3 models and on the default model give transformers + peft's greedy tokens and logprobs (float32,
within 1e-4) per request, in one batch that mixes two adapters and the base model; a request alone and in a
mixed batch computes the same bits; max_loras=1 with two adapters alternating gives each its own answer; bad
adapters are refused by name and the engine goes on; two adapters never share prefix-cache blocks."""

import os

import pytest
import torch
import transformers

from common.lora import LoRARequest
from common.sampling_params import SamplingParams
from frontend.offline.llm import LLM
from tests.support.lora_adapters import make_adapter, peft_greedy, peft_logprobs

pytestmark = pytest.mark.integration

ATOL = 1e-4
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[int(t) for t in torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(n))]
           for n in (7, 21, 12)]
MAX_TOKENS = 4
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=0, prompt_logprobs=0)


def make_llm(path: str | None, **kwargs) -> LLM:
    return LLM(path, dtype="float32", kv_cache_memory="16MiB", max_model_len=256, multiprocess=False,
               enable_lora=True, **kwargs)


def check_against_peft(output, base_model, adapter: str | None, prompt: list[int]) -> None:
    """Greedy tokens equal to peft's, their logprobs and the prompt's within ATOL."""
    tokens, logprobs = peft_greedy(base_model, adapter, prompt, MAX_TOKENS)
    out = output.outputs[0]
    assert out.token_ids == tokens
    got = [entry[t].logprob for entry, t in zip(out.logprobs, out.token_ids)]
    assert got == pytest.approx(logprobs, abs=ATOL)
    expected = peft_logprobs(base_model, adapter, prompt)
    for p in range(1, len(prompt)):
        assert output.prompt_logprobs[p][prompt[p]].logprob == pytest.approx(expected[p - 1, prompt[p]].item(), abs=ATOL)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def family(request, tiny_models, tmp_path_factory):
    """(model folder, its transformers model, two adapters: q/v at r=8; every target at r=16 with rsLoRA)."""
    path = tiny_models[request.param]
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    small = make_adapter(base, str(root / "small"), seed=1)
    wide = make_adapter(base, str(root / "wide"), seed=2, r=16, alpha=32, targets=ALL_TARGETS, use_rslora=True)
    return path, base, LoRARequest("small", 1, small), LoRARequest("wide", 2, wide)


def test_mixed_batch_matches_peft_and_each_request_alone(family):
    path, base, small, wide = family
    llm = make_llm(path, max_loras=2)
    try:
        loras = [small, wide, None]
        mixed = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=loras)
        for output, lora, prompt in zip(mixed, loras, PROMPTS):
            check_against_peft(output, base, lora.lora_path if lora else None, prompt)
        # alone, each request computes the same bits as beside the others (and the adapters stay resident)
        for output, lora, prompt in zip(mixed, loras, PROMPTS):
            (alone,) = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lora)
            assert alone.outputs[0].token_ids == output.outputs[0].token_ids
            assert alone.outputs[0].logprobs == output.outputs[0].logprobs
            assert alone.prompt_logprobs == output.prompt_logprobs
    finally:
        llm.shutdown()


def test_one_slot_two_adapters_alternating(family):
    """max_loras=1: the scheduler runs one adapter's requests at a time, the slot reloads between them, and every
    request gets its own adapter's answer (the base model's rows beside either)."""
    path, base, small, wide = family
    llm = make_llm(path, max_loras=1, max_cpu_loras=1)
    try:
        loras = [small, wide, small, None, wide]
        prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[1]]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False,
                               lora_request=loras)
        for output, lora, prompt in zip(outputs, loras, prompts):
            tokens, _ = peft_greedy(base, lora.lora_path if lora else None, prompt, MAX_TOKENS)
            assert output.outputs[0].token_ids == tokens
    finally:
        llm.shutdown()


def test_ngram_speculation_keeps_each_adapters_tokens(family):
    """Verification rows carry their request's adapter: greedy tokens are peft's with prompt-lookup proposals."""
    path, base, small, wide = family
    llm = make_llm(path, max_loras=2, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    try:
        prompts = [PROMPTS[0] * 3, PROMPTS[2] * 2]  # repeats for the n-gram proposer to find
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False,
                               lora_request=[small, wide])
        for output, lora, prompt in zip(outputs, (small, wide), prompts):
            assert output.outputs[0].token_ids == peft_greedy(base, lora.lora_path, prompt, MAX_TOKENS)[0]
    finally:
        llm.shutdown()


def test_prefix_cache_never_shared_across_adapters(family):
    path, base, small, wide = family
    llm = make_llm(path, max_loras=2)
    try:
        prompt = PROMPTS[1] * 2  # 42 tokens: two full blocks to hit
        for lora in (None, small, wide):
            llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False, lora_request=lora)
        assert llm.get_stats().totals.prefix_cache_hits == 0
        llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False, lora_request=wide)
        assert llm.get_stats().totals.prefix_cache_hits == 32  # the same adapter again does hit
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def bad_adapters(tiny_models, tmp_path_factory):
    """{why: folder} of adapters made for the tiny llama that nvllm must refuse (max_lora_rank 16)."""
    llama = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32).eval()
    qwen3 = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"], dtype=torch.float32).eval()
    root = tmp_path_factory.mktemp("bad-lora")
    bad = {
        "rank 32 exceeds max_lora_rank 16": make_adapter(llama, str(root / "rank"), seed=3, r=32),
        "DoRA": make_adapter(llama, str(root / "dora"), seed=4, use_dora=True),
        "target module 'lm_head' is not in the model": make_adapter(llama, str(root / "head"), seed=5,
                                                                    targets=["q_proj", "lm_head"]),
        "another base model": make_adapter(qwen3, str(root / "qwen3"), seed=6),
        "modules_to_save": make_adapter(llama, str(root / "save"), seed=7, modules_to_save=["lm_head"]),
    }
    missing = make_adapter(llama, str(root / "missing"), seed=8)
    os.remove(os.path.join(missing, "adapter_model.safetensors"))
    bad["has no adapter_model.safetensors"] = missing
    bad["is not a folder"] = str(root / "nowhere")
    return bad


def test_bad_adapters_refused_by_name(tiny_models, bad_adapters):
    llm = make_llm(tiny_models["llama"], max_loras=1)
    try:
        for i, (why, folder) in enumerate(bad_adapters.items()):
            name = f"bad-{i}"
            with pytest.raises(ValueError, match=rf"LoRA adapter '{name}'.*{why}"):
                llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1), use_tqdm=False,
                             lora_request=LoRARequest(name, 10 + i, folder))
        assert llm.get_stats().gauges.num_free_blocks == llm.get_stats().gauges.num_total_blocks
        (out,) = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=2), use_tqdm=False)  # the engine goes on
        assert len(out.outputs[0].token_ids) == 2
    finally:
        llm.shutdown()


def test_lora_off_refuses_an_adapter(tiny_models, tmp_path):
    llm = LLM(tiny_models["llama"], dtype="float32", kv_cache_memory="16MiB", max_model_len=256, multiprocess=False)
    try:
        with pytest.raises(ValueError, match="LoRA serving is off"):
            llm.generate([PROMPTS[0]], use_tqdm=False, lora_request=LoRARequest("x", 1, str(tmp_path)))
    finally:
        llm.shutdown()


def test_default_model_with_an_adapter_matches_peft(default_model_dir, smollm2_transformers, tmp_path):
    """SmolLM2 dequantized (as transformers reads the GGUF) with an adapter on every target: the base model and
    the adapter side by side in one batch."""
    adapter = make_adapter(smollm2_transformers, str(tmp_path / "smol"), seed=9, r=8, alpha=8, targets=ALL_TARGETS)
    llm = make_llm(None, quantization="none", max_loras=1)
    try:
        lora = LoRARequest("smol", 1, adapter)
        prompts = [PROMPTS[0], PROMPTS[0]]
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=[lora, None])
        check_against_peft(outputs[0], smollm2_transformers, adapter, PROMPTS[0])
        check_against_peft(outputs[1], smollm2_transformers, None, PROMPTS[0])
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch, targets", [("gemma3", ALL_TARGETS), ("qwen2_moe", ["q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"])])
def test_other_families_match_peft(arch, targets, default_model_dir, tmp_path):
    """Gemma 3's sandwich norms and a MoE model's attention (its experts take no adapter: refused by name)."""
    from tests.support.tiny_models import build_tiny_model

    path = build_tiny_model(str(tmp_path / arch), arch, default_model_dir)
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    adapter = LoRARequest(arch, 1, make_adapter(base, str(tmp_path / "adapter"), seed=4, targets=targets))
    llm = make_llm(path)
    try:
        (out,) = llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False, lora_request=adapter)
        check_against_peft(out, base, adapter.lora_path, PROMPTS[1])
        if arch == "qwen2_moe":
            experts = LoRARequest("experts", 2, make_adapter(base, str(tmp_path / "experts"), seed=5,
                                                             targets=["down_proj"]))
            with pytest.raises(ValueError, match="'experts'.*mixture of experts"):
                llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False, lora_request=experts)
    finally:
        llm.shutdown()


def test_beam_search_under_an_adapter_matches_peft(family):
    """A beam search runs every beam with its request's adapter (forks keep it): peft's generate(num_beams=3)."""
    from peft import PeftModel

    from common.beam_search_params import BeamSearchParams
    from tests.support.beams import assert_same_beams, transformers_beams

    path, base, _, wide = family
    tuned = PeftModel.from_pretrained(base, wide.lora_path)
    try:
        expected = transformers_beams(tuned, PROMPTS[1], 3, 1.0, 6, eos=2)
    finally:
        tuned.unload()
    assert [t for t, _ in expected] != [t for t, _ in transformers_beams(base, PROMPTS[1], 3, 1.0, 6, eos=2)]
    llm = make_llm(path, max_loras=1)
    try:
        (out,) = llm.beam_search([PROMPTS[1]], BeamSearchParams(beam_width=3, max_tokens=6), lora_request=wide)
    finally:
        llm.shutdown()
    assert_same_beams(out, expected)
