"""A folder transformers itself saved (the default model's GGUF loaded with `from_pretrained(..., gguf_file=...)`,
then `save_pretrained`, as users convert GGUF files and fine-tunes) serves: generation, LoRA adapters and pooling.
Its config.json carries fields transformers' Llama never reads (unk_token_id), which nvllm ignores."""

import json
import os

import pytest
import torch
import transformers

from common.sampling_params import SamplingParams
from benchmarks.torch_side.dense_folder import dense_folder
from frontend.offline.llm import LLM
from common.lora import LoRARequest
from tests.support.lora_adapters import make_adapter, peft_greedy

pytestmark = pytest.mark.integration

PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 4237, 2593, 7536, 30]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def saved(default_model_dir):
    """The folder transformers saves for the default model's GGUF file (made once, beside the import)."""
    folder = dense_folder(default_model_dir)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert "unk_token_id" in config and config["transformers_version"] == transformers.__version__
    return folder


def _tokens(llm: LLM, **kwargs) -> list[list[int]]:
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False, **kwargs)]
    finally:
        llm.shutdown()


def test_it_serves_the_dequantized_models_tokens(saved, default_model_dir):
    """Through the engine core in its own process, as `nvllm serve FOLDER` runs it: the same tokens as the
    default model's own import dequantized (the same bf16 weights)."""
    got = _tokens(LLM(saved, kv_cache_memory="64MiB", max_model_len=256))
    assert got == _tokens(LLM(default_model_dir, quantization="none", kv_cache_memory="64MiB", max_model_len=256,
                              multiprocess=False))


def test_it_serves_lora_adapters(saved, tmp_path):
    base = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    adapter = make_adapter(base, str(tmp_path / "adapter"), seed=3)
    llm = LLM(saved, dtype="float32", enable_lora=True, kv_cache_memory="64MiB", max_model_len=256,
              multiprocess=False)
    got = _tokens(llm, lora_request=LoRARequest("adapter", 1, adapter))
    assert got == [peft_greedy(base, adapter, prompt, GREEDY.max_tokens)[0] for prompt in PROMPTS]


def test_it_serves_pooling(saved, default_model_dir):
    vectors = {}
    for name, path, kwargs in (("saved", saved, {}), ("import", default_model_dir, {"quantization": "none"})):
        llm = LLM(path, dtype="float32", runner="pooling", pooler_config={"pooling_type": "LAST"},
                  kv_cache_memory="64MiB", max_model_len=256, multiprocess=False, **kwargs)
        try:
            vectors[name] = torch.tensor([o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)])
        finally:
            llm.shutdown()
    assert vectors["saved"].shape == (2, 576)
    # the saved folder holds the weights in bf16, the import in float32: the same vectors to bf16's precision
    assert torch.nn.functional.cosine_similarity(vectors["saved"], vectors["import"]).min().item() > 0.999
