"""Speculative decoding end to end: greedy tokens identical to decoding without it (tiny random models in
float32 and bf16, and the default model), under batching, chunked prefill, prefix caching and preemption;
seeded sampling repeatable; logprobs of the kept tokens equal to plain decoding's."""

import pytest
import torch

from common.sampling_params import SamplingParams

pytestmark = pytest.mark.integration

HEAD_DIM = {"llama": 16, "qwen3": 32}  # of the tiny models (tests/support/tiny_models.py)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def loopy_models(tmp_path_factory, default_model_dir):
    """Tiny random models with tied embeddings and weights a little larger than usual: their greedy
    output falls into loops often but not always, so n-gram proposals are both kept and rejected."""
    from tests.support.tiny_models import build_tiny_model
    root = tmp_path_factory.mktemp("loopy")
    return {arch: build_tiny_model(str(root / arch), arch, default_model_dir, tie_word_embeddings=True,
                                   initializer_range=0.11) for arch in ("llama", "qwen3")}


def _copy_heavy_prompts(num: int, seed: int) -> list[list[int]]:
    """Random ids repeated with edits, so the n-gram lookup has something to propose from the start."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(num):
        base = torch.randint(3, 49152, (12 + 5 * i,), generator=g).tolist()
        edited = list(base)
        edited[len(base) // 2] = 7
        prompts.append(base + edited + base[: len(base) // 2])
    return prompts


def _run(model, prompts, params, **engine_args):
    from frontend.offline.llm import LLM
    llm = LLM(model, multiprocess=False, **engine_args)
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return outputs, llm.client.get_stats()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_tokens_identical_under_batching_chunking_and_preemption(loopy_models, arch):
    prompts = _copy_heavy_prompts(6, seed=1)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    # 14 blocks of 16 tokens for six requests of up to 120 tokens: some are preempted and recomputed;
    # a budget of 48 tokens chunks the prefills and splits proposals across steps
    engine = dict(dtype="float32", max_model_len=160, max_num_batched_tokens=48,
                  kv_cache_memory=14 * 2 * 2 * 16 * 2 * HEAD_DIM[arch] * 4)
    plain, _ = _run(loopy_models[arch], prompts, params, **engine)
    spec, stats = _run(loopy_models[arch], prompts, params, speculative_config=NGRAM, **engine)
    kept, rejected = stats.totals.spec_num_accepted_tokens, stats.totals.spec_num_draft_tokens - stats.totals.spec_num_accepted_tokens
    assert kept > 10 and rejected > 10 and stats.totals.num_preemptions > 0
    for a, b in zip(plain, spec):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        # equal up to the float32 rounding that a step's shape changes here (a preempted request
        # recomputes its cache as a prefill): bit-equality across shapes is the batch-invariance issue's
        assert _logprobs(b) == pytest.approx(_logprobs(a), rel=1e-4, abs=1e-4)


def test_bf16_verification_rows_are_the_decode_rows_bit_for_bit(loopy_models):
    """In bf16 on the C kernels every verified row is computed as the plain decode of that token: with
    the same prefill (one step for all prompts) tokens and logprobs are bit-identical."""
    prompts = _copy_heavy_prompts(6, seed=3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    plain, _ = _run(loopy_models["qwen3"], prompts, params, dtype="bfloat16")
    spec, stats = _run(loopy_models["qwen3"], prompts, params, dtype="bfloat16", speculative_config=NGRAM)
    assert stats.totals.spec_num_accepted_tokens > 10
    for a, b in zip(plain, spec):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids and _logprobs(b) == _logprobs(a)


def _logprobs(output) -> list[float]:
    return [lp[t].logprob for lp, t in zip(output.outputs[0].logprobs, output.outputs[0].token_ids)]


def test_default_model_greedy_identical_with_ngram_speculation(default_model_dir):
    from frontend.offline.llm import LLM
    llm = LLM(multiprocess=False)
    tok = llm.get_tokenizer()
    text = ("def area(width, height):\n    return width * height\n\n"
            "def perimeter(width, height):\n    return 2 * (width + height)\n")
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Rename width to w in this code:\n\n{text}"}],
                                       tokenize=False, add_generation_prompt=True),
               "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
               "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"]
    params = SamplingParams(temperature=0, max_tokens=48)
    try:
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()
    spec, stats = _run(None, prompts, params, speculative_config=NGRAM)
    assert [o.outputs[0].token_ids for o in spec] == plain
    assert stats.totals.spec_num_accepted_tokens > 30


def test_seeded_sampling_repeats_alone_and_in_a_batch(loopy_models):
    from frontend.offline.llm import LLM
    prompts = _copy_heavy_prompts(4, seed=2)
    seeded = SamplingParams(temperature=0.05, top_k=40, seed=11, max_tokens=30, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=25, ignore_eos=True)
    llm = LLM(loopy_models["llama"], multiprocess=False, dtype="float32", speculative_config=NGRAM)
    try:
        alone = llm.generate([prompts[0]], seeded, use_tqdm=False)[0].outputs[0].token_ids
        again = llm.generate([prompts[0]], seeded, use_tqdm=False)[0].outputs[0].token_ids
        batch = llm.generate(prompts[1:3] + [prompts[0]] + prompts[3:], [other, other, seeded, other], use_tqdm=False)
        assert alone == again == batch[2].outputs[0].token_ids and len(alone) == 30
        assert llm.client.get_stats().totals.spec_num_accepted_tokens > 0
    finally:
        llm.shutdown()


@pytest.mark.parametrize("draft", ["same", "other"])
def test_draft_model_greedy_identical_under_preemption(loopy_models, tiny_models, draft):
    """A draft model proposes; with the target as its own draft nearly every proposal is kept, with
    another model most are rejected: either way the target's greedy tokens are those of plain decoding."""
    prompts = _copy_heavy_prompts(5, seed=4)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    target = loopy_models["llama"]
    per_block = 2 * 2 * 16 * 2 * HEAD_DIM["llama"] * 4
    engine = dict(dtype="float32", max_model_len=128, max_num_batched_tokens=64)
    plain, _ = _run(target, prompts, params, kv_cache_memory=12 * per_block, **engine)
    spec_config = {"model": target if draft == "same" else tiny_models["llama"], "num_speculative_tokens": 3}
    # 12 blocks again: each block holds the draft model's keys and values too
    spec, stats = _run(target, prompts, params, speculative_config=spec_config, kv_cache_memory=24 * per_block, **engine)
    assert stats.totals.num_preemptions > 0 and stats.totals.spec_num_draft_tokens > 50
    kept = stats.totals.spec_num_accepted_tokens / stats.totals.spec_num_draft_tokens
    assert kept > 0.9 if draft == "same" else kept < 0.5
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]


def test_draft_model_errors_name_the_field(tiny_models, tmp_path):
    from tests.support.tiny_models import build_tiny_model
    from frontend.offline.llm import LLM
    small_vocab = build_tiny_model(str(tmp_path / "v"), "llama", tiny_models["llama"], vocab_size=1000)
    with pytest.raises(ValueError, match="speculative_config.model has a vocabulary of 1000 tokens"):
        LLM(tiny_models["llama"], multiprocess=False, dtype="float32",
            speculative_config={"model": small_vocab, "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="a draft model runs with tensor_parallel_size 1"):
        LLM(tiny_models["llama"], tensor_parallel_size=2, speculative_config={"model": small_vocab,
                                                                             "num_speculative_tokens": 2})


def test_bench_latency_times_real_prefills_never_prefix_cache_hits(loopy_models, tmp_path):
    """A fresh random prompt per request: nothing of one is in the cache when the next comes."""
    import json
    import subprocess
    import sys
    out = tmp_path / "latency.json"
    subprocess.run([sys.executable, "-m", "frontend.cli.main", "bench", "latency", loopy_models["llama"],
                    "--dtype", "float32", "--input-len", "40", "--output-len", "4", "--num-iters", "3",
                    "--output-json", str(out)], check=True, timeout=300)
    result = json.loads(out.read_text())["results"]
    assert result["input_len"] == 40 and len(result["tpot_ms_each"]) == 3
    assert result["prefix_cache_hit_tokens"] == 0 and "fresh prompt" in result["ttft_is"]


def test_bench_latency_with_speculation_reports_both_engines(loopy_models, tmp_path):
    """docs/features/speculative-decoding.md: `nvllm bench latency --prompt copy-edit --speculative-config ...`,
    scaled down."""
    import json
    import subprocess
    import sys
    out = tmp_path / "latency.json"
    subprocess.run([sys.executable, "-m", "frontend.cli.main", "bench", "latency", loopy_models["llama"],
                    "--dtype", "float32", "--prompt", "copy-edit", "--output-len", "12", "--num-iters", "2",
                    "--speculative-config", json.dumps(NGRAM), "--output-json", str(out)], check=True, timeout=300)
    result = json.loads(out.read_text())["results"]
    assert result["prompt"] == "copy-edit" and result["input_len"] > 100 and len(result["tpot_ms_each"]) == 2
    # the same text each time: the prefix cache is off, so each time to first token is a real prefill
    assert result["prefix_cache_hit_tokens"] == 0 and "prefix cache off" in result["ttft_is"]
    spec = result["speculative"]
    assert spec["config"]["num_speculative_tokens"] == 4 and spec["ms_per_output_token_without"] > 0
    assert spec["speedup"] > 0 and 0 <= spec["proposals_kept"] <= 1 and spec["tokens_per_verifying_step"] >= 1
