"""Embeddings (`runner="pooling"`, LLM.embed): each pooling type's vector equals transformers' pooled final hidden
state (float32), normalized or not, alone, batched, chunked by a small token budget and after a prefix-cache hit;
the vector of a request depends on it alone (bit for bit); Matryoshka `dimensions`; the ValueErrors of a pooling LLM
asked to generate and of a generating LLM asked to embed; TP=2 gives TP=1's vectors."""

import json
import os
import shutil

import pytest
import torch
import transformers

from common.pooling_params import PoolingParams
from tests.support.tiny_models import build_tiny_model
from frontend.offline.llm import LLM

pytestmark = pytest.mark.integration

ATOL = 1e-5
PROMPT = [int(t) for t in torch.randint(3, 49152, (45,), generator=torch.Generator().manual_seed(7))]
OTHER = [int(t) for t in torch.randint(3, 49152, (30,), generator=torch.Generator().manual_seed(8))]
POOLING_TYPES = ("LAST", "MEAN", "CLS")


def pooled(hidden: torch.Tensor, pooling_type: str, normalize: bool) -> torch.Tensor:
    vector = {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[pooling_type]
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


def last_hidden_state(model, tokens: list[int]) -> torch.Tensor:
    """transformers' final (normed) hidden states [len(tokens), hidden] from the decoder without its head."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).last_hidden_state[0].float()


def check(got: list[float], expected: torch.Tensor) -> None:
    got = torch.tensor(got)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= ATOL
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0).item() > 0.99999


def make_llm(path: str, pooling_type: str, **kwargs) -> LLM:
    return LLM(path, dtype="float32", runner="pooling", pooler_config={"pooling_type": pooling_type},
               kv_cache_memory="16MiB", max_model_len=256, multiprocess=False, **kwargs)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tiny_models):
    path = tiny_models[request.param]
    hf = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    return path, {"prompt": last_hidden_state(hf, PROMPT), "other": last_hidden_state(hf, OTHER)}


@pytest.mark.parametrize("pooling_type", POOLING_TYPES)
def test_vectors_match_transformers_alone_batched_chunked_and_cached(model, pooling_type):
    path, hidden = model
    raw = PoolingParams(normalize=False)
    vectors = {}
    for budget in (None, 16):  # one step, then 16-token chunks (45 tokens: three steps)
        llm = make_llm(path, pooling_type, max_num_batched_tokens=budget)
        try:
            (alone,) = llm.embed([PROMPT], use_tqdm=False)
            check(alone.outputs.embedding, pooled(hidden["prompt"], pooling_type, True))
            assert alone.prompt_token_ids == PROMPT and alone.finished
            # batched with another prompt, unnormalized: PROMPT's blocks are cached now, OTHER's are not
            other, again = llm.embed([OTHER, PROMPT], raw, use_tqdm=False)
            check(other.outputs.embedding, pooled(hidden["other"], pooling_type, False))
            check(again.outputs.embedding, pooled(hidden["prompt"], pooling_type, False))
            # LAST reuses the cached blocks; MEAN and CLS need every position's hidden state, so never do
            assert (again.num_cached_tokens > 0) == (pooling_type == "LAST")
            assert llm.reset_prefix_cache()
            (cold,) = llm.embed([PROMPT], raw, use_tqdm=False)
            assert cold.num_cached_tokens == 0
            vectors[budget] = (alone.outputs.data, again.outputs.data, cold.outputs.data)
        finally:
            llm.shutdown()
    # the same request gives the same bits whatever ran beside it, however it was chunked, cache hit or not
    assert vectors[None][1] == vectors[None][2] == vectors[16][1] == vectors[16][2]
    assert vectors[None][0] == vectors[16][0]


def test_matryoshka_dimensions_truncate_then_renormalise(tiny_models, tmp_path):
    path = str(tmp_path / "matryoshka")
    shutil.copytree(tiny_models["qwen3"], path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config | {"matryoshka_dimensions": [16, 32, 64]}, f)
    hf = transformers.AutoModel.from_pretrained(tiny_models["qwen3"], dtype=torch.float32).eval()
    full = pooled(last_hidden_state(hf, PROMPT), "LAST", False)
    llm = make_llm(path, "LAST")
    try:
        (short,) = llm.embed([PROMPT], PoolingParams(dimensions=16), use_tqdm=False)
        check(short.outputs.embedding, torch.nn.functional.normalize(full[:16], dim=0))
        with pytest.raises(ValueError, match=r"dimensions must be one of the model's matryoshka_dimensions"):
            llm.embed([PROMPT], PoolingParams(dimensions=20), use_tqdm=False)
    finally:
        llm.shutdown()


def test_refusals(tiny_models):
    llm = make_llm(tiny_models["llama"], "LAST")
    try:
        with pytest.raises(ValueError, match=r"served for embeddings \(--runner pooling\)"):
            llm.generate(["Hello"], use_tqdm=False)
        with pytest.raises(ValueError, match="dimensions the model does not support Matryoshka"):
            llm.embed(["Hello"], PoolingParams(dimensions=8), use_tqdm=False)
        with pytest.raises(ValueError, match="prompt has 257 tokens, more than max_model_len 256"):
            llm.embed([[5] * 257], use_tqdm=False)
        (full,) = llm.embed([[5] * 256], use_tqdm=False)  # a prompt may fill max_model_len: nothing follows it
        assert full.outputs.hidden_size == 64
        assert llm.get_stats().gauges.num_running == 0
    finally:
        llm.shutdown()
    generating = LLM(tiny_models["llama"], dtype="float32", kv_cache_memory="16MiB", max_model_len=256,
                     multiprocess=False)
    try:
        with pytest.raises(ValueError, match="not served for embeddings"):
            generating.embed(["Hello"], use_tqdm=False)
    finally:
        generating.shutdown()
    with pytest.raises(ValueError, match="pooler_config is for runner pooling"):
        LLM(tiny_models["llama"], pooler_config={"pooling_type": "MEAN"}, multiprocess=False)
    with pytest.raises(ValueError, match="pooling_type must be one of LAST, MEAN, CLS"):
        LLM(tiny_models["llama"], runner="pooling", pooler_config={"pooling_type": "MAX"}, multiprocess=False)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_default_model_matches_transformers(default_model_dir, smollm2_transformers, pooling_type):
    """SmolLM2 (dequantized, as transformers holds it), each pooling type, two prompts batched in 16-token
    steps (the longer one chunked)."""
    prompts = [PROMPT[:40], PROMPT[5:17]]
    llm = LLM(None, dtype="float32", quantization="none", runner="pooling",
              pooler_config={"pooling_type": pooling_type}, max_model_len=256, kv_cache_memory="64MiB",
              max_num_batched_tokens=16, multiprocess=False)
    try:
        outs = llm.embed(prompts, use_tqdm=False)
        for tokens, out in zip(prompts, outs):
            check(out.outputs.embedding, pooled(last_hidden_state(smollm2_transformers.model, tokens), pooling_type,
                                                True))
    finally:
        llm.shutdown()


def test_tp2_gives_tp1_vectors(tiny_models):
    path = tiny_models["qwen3"]
    vectors = {}
    for tp in (1, 2):
        llm = make_llm(path, "MEAN", tensor_parallel_size=tp)
        try:
            vectors[tp] = [o.outputs.embedding for o in llm.embed([PROMPT, OTHER], use_tqdm=False)]
        finally:
            llm.shutdown()
    for one, two in zip(vectors[1], vectors[2]):
        check(two, torch.tensor(one))


def test_a_folder_saved_without_its_lm_head(tiny_models, tmp_path):
    """Qwen3-Embedding's shape: the decoder alone (transformers' AutoModel, architecture Qwen3Model, tensor names
    without `model.`), no LM head, untied embeddings."""
    hf = transformers.AutoModel.from_pretrained(tiny_models["qwen3"], dtype=torch.float32).eval()
    path = str(tmp_path / "qwen3-embedding")
    hf.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(tiny_models["qwen3"], name), path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen3Model"]
    llm = make_llm(path, "LAST")
    try:
        (out,) = llm.embed([PROMPT], use_tqdm=False)
        check(out.outputs.embedding, pooled(last_hidden_state(hf, PROMPT), "LAST", True))
    finally:
        llm.shutdown()


# mistral: every layer slides (window 8), so MEAN in 16-token chunks pools rows whose early blocks are given back
@pytest.mark.parametrize("arch, pooling_type, budget", [("gemma3", "LAST", None), ("qwen3_moe", "LAST", None),
                                                        ("mistral", "MEAN", 16)])
def test_other_families(arch, pooling_type, budget, tmp_path, default_model_dir):
    path = build_tiny_model(str(tmp_path / arch), arch, default_model_dir)
    hf = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    llm = make_llm(path, pooling_type, max_num_batched_tokens=budget)
    try:
        (out,) = llm.embed([PROMPT], use_tqdm=False)
        check(out.outputs.embedding, pooled(last_hidden_state(hf, PROMPT), pooling_type, True))
    finally:
        llm.shutdown()
