"""Sliding-window attention through the model runner: tiny random Mistral (every layer slides, window 8) and
Qwen2 with use_sliding_window (layer 0 global, layer 1 sliding), float32 logits against transformers' on a
prompt three windows long, over blocks of 4 tokens: prefill, decode, chunked prefill, a prefix-cache hit.
Keys that fell out of every window are never read: blocks holding only them may be anything."""

import json
import os

import pytest
import torch
import transformers

from common.config import EngineArgs
from tests.support.tiny_models import build_tiny_model
from engine_core.engine_config import resolve_engine_config
from engine_core.worker.model_runner import ModelRunner
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from tests.support.preemption_check import assert_greedy_under_preemption
from tests.support.paged_kv_logits import (ATOL, TOKENS, check_chunked_prefill, check_decode_after_prefill,
                                           check_prefill, check_prefix_hit_and_mixed_batch, hf_logits, make_runner,
                                           run_step)

pytestmark = pytest.mark.integration

WINDOW = 8
SLIDING = {"mistral": ("mistral", dict(sliding_window=WINDOW)),
           "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1))}


@pytest.fixture(scope="session")
def sliding_models(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("sliding")
    return {name: build_tiny_model(str(root / name), arch, default_model_dir, **fields)
            for name, (arch, fields) in SLIDING.items()}


@pytest.fixture(scope="module", params=tier_params("own", "portable"))
def tier(request):
    """The generic attention kernel's AVX2 code (this machine's own tier here) and its portable C."""
    with forced_tier(request.param):
        yield request.param


@pytest.fixture(scope="module", params=sorted(SLIDING))
def pair(request, sliding_models, tier):
    path = sliding_models[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
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


def test_the_spec_gives_each_layer_its_window(pair):
    runner, _ = pair
    windows = [layer.self_attn.attn.sliding_window for layer in runner.model.layers]
    assert windows in ([WINDOW, WINDOW], [None, WINDOW])


def test_blocks_out_of_every_window_are_never_read(sliding_models, tier):
    """Mistral (every layer slides): once the prompt is cached, its first blocks hold keys no later query sees.
    Filled with NaN (as if the scheduler had given them to another request), the decodes' logits do not move."""
    path = sliding_models["mistral"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    runner = make_runner(path)
    table = [11, 4, 20, 8, 13, 6, 21]
    run_step(runner, [(TOKENS[:22], 0, table)])
    # the decode at position 22 sees keys 15..22: blocks 0-2 (positions 0..11) and 3 (12..15, partly) are out
    for layer in runner.model.layers:
        for cache in (layer.self_attn.attn.k_cache, layer.self_attn.attn.v_cache):
            cache[table[:3]] = float("nan")
    (ours,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(ours[0], hf_logits(hf, TOKENS)[22], atol=ATOL, rtol=0)
    longer = TOKENS + [42, 43, 44]
    (rows,) = run_step(runner, [(longer, 23, table)])  # a chunk after cached blocks: rows 23..25 see 16..25
    torch.testing.assert_close(rows, hf_logits(hf, longer)[23:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", sorted(SLIDING))
def test_the_torch_backend_honours_the_window(sliding_models, name):
    """--no-batch-invariant: the torch (SDPA) backend serves the same steps, out-of-window blocks NaN as above."""
    path = sliding_models[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    args = EngineArgs(model=path, dtype="float32", device="cpu", block_size=4, kv_cache_memory="16MiB",
                      batch_invariant=False)
    runner = ModelRunner(resolve_engine_config(args))
    runner.allocate_kv_cache(64)
    assert runner.backend.name == "torch"
    ref = hf_logits(hf, TOKENS)
    table = [30, 31, 17, 40, 2, 9]
    (first,) = run_step(runner, [(TOKENS[:13], 0, table)])
    if name == "mistral":  # the next chunk's first row (13) sees keys 6..13: block 0 is out of every window
        for layer in runner.model.layers:
            layer.self_attn.attn.k_cache[table[0]] = layer.self_attn.attn.v_cache[table[0]] = float("nan")
    (second,) = run_step(runner, [(TOKENS[:22], 13, table)])
    (decode,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat([first, second, decode]), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", sorted(SLIDING))
def test_greedy_generate_with_preemption_matches(sliding_models, name):
    """Through the whole engine, a pool of 12 blocks of 4 tokens (each request up to 17 + 24 tokens, seven of
    them): requests are preempted and recomputed, Mistral's blocks out of the window go back to the pool as it generates, and
    greedy tokens still equal transformers' generate; every block is free at the end."""
    prompts = [TOKENS[:9], TOKENS[3:20], TOKENS[5:11], TOKENS[:17], TOKENS[2:14], TOKENS[7:23], TOKENS[1:5]]
    assert_greedy_under_preemption(sliding_models[name], prompts, blocks=12, max_model_len=48)


def test_the_window_is_transformers_convention():
    """transformers' sliding-window mask (masking_utils, the installed version) lets the query at q see key k
    exactly where nvllm's does: q - w < k <= q, w keys itself included; the torch backend's mask says the same."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from engine_core.attention.metadata import AttentionMetadata
    from engine_core.attention.torch_plan import TorchPlan

    window, seq_len, q_len = 5, 14, 6
    theirs = sliding_window_causal_mask_function(window)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(q_len, dtype=torch.int64), query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32), block_tables=torch.arange(4, dtype=torch.int32)[None],
        max_query_len=q_len, max_seq_len=seq_len, num_decodes=0, query_start_loc_cpu=[0, q_len],
        seq_lens_cpu=[seq_len])
    keys = TorchPlan.of(meta).windowed_prefill_gather(meta, 0, q_len, 4, torch.float32, window)
    first_key = seq_len - q_len - window + 1  # the gather starts at the first row's window
    for row, q in enumerate(range(seq_len - q_len, seq_len)):
        for k in range(seq_len):
            expected = bool(theirs(torch.tensor(0), torch.tensor(0), torch.tensor(q), torch.tensor(k)))
            assert expected == (q - window < k <= q)
            if k >= first_key:
                assert (keys.mask[row, k - first_key] == 0).item() == expected, (q, k)


QWEN_MOE_WINDOW = dict(use_sliding_window=True, max_window_layers=2)


@pytest.mark.parametrize("arch, overrides, windows", [
    ("mixtral", {}, [WINDOW, WINDOW]), ("gemma3", {}, [WINDOW, None]), ("gemma2", {}, [WINDOW, None]),
    ("qwen2_moe", QWEN_MOE_WINDOW, [WINDOW, None]), ("qwen3_moe", QWEN_MOE_WINDOW, [WINDOW, WINDOW])])
def test_other_families_windows_match_transformers(tmp_path, default_model_dir, arch, overrides, windows):
    """Mixtral slides every layer as Mistral does, Gemma 3 and Gemma 2 (its scores capped at 2.0) their
    sliding_attention layers, Qwen2-MoE every other
    layer below max_window_layers (its config.json read without the layer_types transformers writes, as older
    ones are), Qwen3-MoE every layer (the families' other parts are their own tests'): prefill, a chunk after
    cached blocks and a decode against transformers' logits."""
    path = build_tiny_model(str(tmp_path / arch), arch, default_model_dir, sliding_window=WINDOW, **overrides)
    if arch == "qwen2_moe":
        config_path = os.path.join(path, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        config.pop("layer_types", None)
        with open(config_path, "w") as f:
            json.dump(config, f)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    runner = make_runner(path)
    assert [layer.self_attn.attn.sliding_window for layer in runner.model.layers] == windows
    table = [30, 31, 17, 40, 2, 9]
    (first,) = run_step(runner, [(TOKENS[:13], 0, table)])
    (second,) = run_step(runner, [(TOKENS[:22], 13, table)])
    (decode,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat([first, second, decode]), hf_logits(hf, TOKENS), atol=ATOL, rtol=0)
