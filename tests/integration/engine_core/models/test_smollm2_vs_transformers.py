"""The embedded SmolLM2 through nvllm gives transformers' greedy tokens (float32), with
transformers reading the GGUF itself, so this also checks our GGUF import."""

import os

import pytest
import torch

pytestmark = pytest.mark.integration

NEW_TOKENS = 32
TIE = 1e-4

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The chemical formula of water is",
    "Translate to French: I like apples.",
    "Les fraises sont",
    "import numpy as np\nx = np.",
    "Q: What is the largest planet in the solar system?\nA:",
    "日本の首都は",
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a color."}],
]


@pytest.fixture(scope="module")
def hf_model(smollm2_transformers):
    return smollm2_transformers


@pytest.fixture(scope="module")
def llm(default_model_dir):
    from frontend.offline.llm import LLM
    # the dequantized weights, as transformers holds them (quantization auto keeps the GGUF blocks and gives the
    # same bits in float32: tests/integration/engine_core/weights/test_quantized_weights.py)
    engine = LLM(None, dtype="float32", quantization="none", max_model_len=1024, kv_cache_memory="256MiB")
    yield engine
    engine.shutdown()


def test_greedy_tokens_match_transformers(llm, hf_model):
    from common.sampling_params import SamplingParams

    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    prompts += [tok.encode(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False) for c in CHATS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    checked = 0
    for ids, out in zip(prompts, outs):
        ours = out.outputs[0].token_ids
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2)
        theirs = ref[0, len(ids):].tolist()[: len(ours)]
        for pos, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                # a divergence is allowed only where transformers itself sees a tie
                with torch.no_grad():
                    logits = hf_model(torch.tensor([ids + theirs[:pos]])).logits[0, -1]
                top2 = logits.topk(2).values
                assert float(top2[0] - top2[1]) < TIE, (
                    f"prompt {PROMPTS[len(ids) % len(PROMPTS)]!r}: token {pos} is {a}, transformers says {b} "
                    f"with a top-2 gap of {float(top2[0] - top2[1]):.2e}")
                break
            checked += 1
        if out.outputs[0].finish_reason == "stop":
            assert ours[-1] == 2
        else:
            assert len(ours) == NEW_TOKENS
    assert checked >= 10 * 16  # most of the comparison really happened


def test_text_and_chat_api(llm):
    from common.sampling_params import SamplingParams

    out = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0, max_tokens=16),
                   use_tqdm=False)[0]
    assert out.prompt.startswith("<|im_start|>")
    assert out.outputs[0].text.strip()
    assert out.outputs[0].text == llm.get_tokenizer().decode(out.outputs[0].token_ids, skip_special_tokens=True)
