"""Greedy tokens through the whole engine under preemption: a KV pool too small for the requests at once, so
some are preempted and recomputed, must still give transformers' `generate` tokens and end with every block free."""

import torch
import transformers

from tests.support.tiny_models import kv_block_bytes
from engine_core.families.catalog import read_spec
from engine_core.weights.model_folder import read_hf_config

BLOCK_SIZE = 4


def assert_greedy_under_preemption(path: str, prompts: list[list[int]], blocks: int, max_tokens: int = 24,
                                   max_model_len: int = 96, **engine) -> None:
    """`blocks` blocks of BLOCK_SIZE tokens in the pool; `engine`: more LLM arguments."""
    from frontend import LLM, SamplingParams

    spec = read_spec(read_hf_config(path))
    block = kv_block_bytes(spec.num_layers, spec.num_kv_heads, spec.head_dim, "float32", block_size=BLOCK_SIZE)
    # in-process unless told otherwise: every request is queued before the first step, so the pool runs short
    # whatever the machine's load (over a socket, requests that arrive a step apart may never meet)
    engine.setdefault("multiprocess", False)
    with LLM(path, dtype="float32", block_size=BLOCK_SIZE, kv_cache_memory=blocks * block,
             max_model_len=max_model_len, max_num_batched_tokens=16, **engine) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                            use_tqdm=False)
        stats = llm.get_stats()
    assert stats.totals.num_preemptions > 0
    assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                              min_new_tokens=max_tokens)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist(), prompt
