"""Phi-3 / Phi-4-mini (fused q/k/v and gate/up, partial rotary, LongRoPE) and the YaRN / linear rope scalings:
float32 logits equal transformers' through the paged KV cache's paths, and greedy tokens through the engine.

LongRoPE's rule (layers/rotary.py): the long factors for every position where the engine's max_model_len passes
the original context, else the short ones. Short: equal to transformers; long: equal to transformers for a
prompt longer than the original context, and to transformers made to use its long factors for a shorter one.
"""

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from common.config import EngineArgs
from conftest import build_tiny_model
from cpu_tier_helpers import forced_tier, tier_params
from engine_core.engine_config import resolve_engine_config
from engine_core.families.catalog import read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.layers import cpu_ops
from engine_core.layers.rotary import RotaryEmbedding
from engine_core.weights.model_folder import read_hf_config
from engine_core.worker.model_runner import ModelRunner
from test_model_vs_transformers import ATOL, BLOCK, TOKENS, hf_logits, run_step

pytestmark = pytest.mark.integration

ORIGINAL = 32  # LongRoPE's original context: TOKENS (23) fit in it
SHORT = [1.0 + 0.15 * i for i in range(6)]  # 12 rotated dims: 6 pairs
LONG = [1.5 + 2.0 * i for i in range(6)]

MODELS = {
    "phi3": dict(arch="phi3"),
    "phi3-longrope": dict(arch="phi3", partial_rotary_factor=0.75, tie_word_embeddings=True,
                          original_max_position_embeddings=ORIGINAL,
                          rope_scaling={"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
    "llama-yarn": dict(arch="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 16}),
    "qwen3-yarn": dict(arch="qwen3", rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16,
                                                   "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5,
                                                   "truncate": False, "original_max_position_embeddings": 64}),
    "llama-linear": dict(arch="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("phi3_rope")
    return {name: build_tiny_model(str(root / name), fields["arch"], default_model_dir,
                                   **{k: v for k, v in fields.items() if k != "arch"})
            for name, fields in MODELS.items()}


def make_runner(path: str, max_model_len: int | None = None) -> ModelRunner:
    args = EngineArgs(model=path, dtype="float32", device="cpu", block_size=BLOCK, kv_cache_memory="16MiB",
                      max_model_len=max_model_len)
    runner = ModelRunner(resolve_engine_config(args))
    runner.allocate_kv_cache(64)
    return runner


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, folders):
    path = folders[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    # LongRoPE within its original context: the short factors, as transformers' for these lengths
    return make_runner(path, ORIGINAL if request.param == "phi3-longrope" else None), hf


def test_prefill(pair):
    runner, hf = pair
    (ours,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=ATOL, rtol=0)


def test_decode_after_prefill(pair):
    runner, hf = pair
    table = [11, 4, 20, 8, 13, 6]
    run_step(runner, [(TOKENS[:22], 0, table)])
    (ours,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(ours[0], hf_logits(hf, TOKENS)[22], atol=ATOL, rtol=0)


def test_chunked_prefill(pair):
    runner, hf = pair
    table = [30, 31, 17, 40, 2, 9]
    got = [run_step(runner, [(TOKENS[:end], start, table)])[0] for start, end in ((0, 7), (7, 16), (16, 23))]
    torch.testing.assert_close(torch.cat(got), hf_logits(hf, TOKENS), atol=ATOL, rtol=0)


def test_prefix_hit_and_mixed_batch(pair):
    runner, hf = pair
    shared = TOKENS[:12]
    a, b = shared + [7, 8, 9], shared + [100, 200, 300, 400, 500]
    run_step(runner, [(a[:-1], 0, [1, 2, 3, 4])])
    rows_a, rows_b = run_step(runner, [(a, len(a) - 1, [1, 2, 3, 4]), (b, 12, [1, 2, 3, 50, 51])])
    torch.testing.assert_close(rows_a[0], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows_b, hf_logits(hf, b)[12:], atol=ATOL, rtol=0)


# ---- LongRoPE past the original context ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_pair(folders):
    path = folders["phi3-longrope"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return make_runner(path, max_model_len=128), hf


def test_longrope_past_the_original_context_takes_the_long_factors_for_a_long_prompt(long_pair):
    runner, hf = long_pair
    prompt = (TOKENS * 2)[:40]  # longer than the original 32: transformers takes the long factors too
    table = list(range(10))
    (ours,) = run_step(runner, [(prompt, 0, table)])
    torch.testing.assert_close(ours, hf_logits(hf, prompt), atol=ATOL, rtol=0)
    # chunked across the original length: every chunk rotates with the long factors, as one prefill does
    chunks = [run_step(runner, [(prompt[:end], start, table)])[0] for start, end in ((0, 20), (20, 40))]
    torch.testing.assert_close(torch.cat(chunks), hf_logits(hf, prompt), atol=ATOL, rtol=0)


def test_longrope_past_the_original_context_takes_the_long_factors_for_a_short_prompt_too(long_pair):
    """A token's rotation depends on the engine's max_model_len, not on its sequence's length so far."""
    runner, hf = long_pair
    rotary = hf.model.rotary_emb
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](hf.config, None, seq_len=ORIGINAL + 1)
    short_inv_freq = rotary.original_inv_freq.clone()
    (ours,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    assert not torch.allclose(ours, hf_logits(hf, TOKENS), atol=1e-3)  # transformers: the short factors
    try:
        rotary.original_inv_freq.copy_(long_inv_freq)
        torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=ATOL, rtol=0)
    finally:
        rotary.original_inv_freq.copy_(short_inv_freq)


# ---- the one-call C decoder loop on each tier, with partial rotary -------------------------------------------

@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_partial_rotary_through_the_c_loop_on_each_tier(folders, cpu_tier):
    path = folders["phi3-longrope"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with forced_tier(cpu_tier):
        runner = make_runner(path, ORIGINAL)
        assert runner.model.cpu_decoder is not None  # the C loop runs it, not the modules
        table = [3, 1, 4, 0, 5, 2]
        (ours,) = run_step(runner, [(TOKENS[:22], 0, table)])
        (last,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat([ours, last]), hf_logits(hf, TOKENS), atol=ATOL, rtol=0)


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_bf16_rotary_kernel_rotates_only_the_leading_dims(cpu_tier):
    """cpu_ops' fused kernel (bf16, in place) equals the module's torch path with 12 of 16 dims rotated."""
    rotary = RotaryEmbedding(16, 64, 10000.0, rotary_dim=12)
    heads = torch.randn(5, 3, 16).to(torch.bfloat16)
    positions = torch.tensor([0, 7, 31, 2, 63])
    tables = rotary._tables_for(positions, torch.bfloat16)
    lead = heads[..., :12]
    rotated = lead * tables.cos + torch.cat([-lead[..., 6:], lead[..., :6]], -1) * tables.sin
    expected = torch.cat([rotated, heads[..., 12:]], -1)
    with forced_tier(cpu_tier):
        got = heads.clone()
        if not cpu_ops.rotary(positions, got, rotary.cos, rotary.sin):
            pytest.skip("no fused rotary kernel on this tier")
    assert torch.equal(got, expected)


# ---- through the whole engine ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["phi3-longrope", "llama-yarn"])
def test_greedy_generate_matches(folders, name):
    from frontend import LLM, SamplingParams

    path = folders[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    prompts = [TOKENS[:9], TOKENS[3:15]]
    llm = LLM(path, dtype="float32", block_size=4, max_model_len=ORIGINAL, max_num_batched_tokens=8)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()


# ---- reading the config ----------------------------------------------------------------------------------------

def test_phi3_config_reads(folders):
    spec = read_spec(read_hf_config(folders["phi3-longrope"]))
    assert (spec.family, spec.head_dim, spec.rope.rotary_dim, spec.tie_word_embeddings) == ("phi3", 16, 12, True)
    assert spec.rope.scaling["rope_type"] == "longrope"
    assert spec.rope.scaling["original_max_position_embeddings"] == ORIGINAL


def _config(folder: str, **changes) -> dict:
    config = read_hf_config(folder)
    return {k: v for k, v in (config | changes).items() if v is not ...}


@pytest.mark.parametrize("changes, field", [
    ({"sliding_window": 256}, "sliding_window"),  # binds within max_position_embeddings 512: not yet
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "short_mscale": 1.1}},
     "rope_scaling.short_mscale"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": SHORT[:4], "long_factor": LONG}},
     "rope_scaling.short_factor"),
])
def test_phi3_refuses_by_name(folders, changes, field):
    with pytest.raises(UnsupportedConfig) as refused:
        read_spec(_config(folders["phi3"], **changes))
    assert refused.value.field == field


def test_a_window_that_never_binds_and_older_rope_names_are_read(folders):
    spec = read_spec(_config(folders["phi3"], sliding_window=512,
                             rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}))
    assert spec.sliding_window is None and spec.rope.scaling["rope_type"] == "longrope"


def test_partial_rotary_is_refused_where_the_family_rotates_whole_heads(folders):
    with pytest.raises(UnsupportedConfig, match="partial_rotary_factor"):
        read_spec(_config(folders["llama-yarn"], rope_scaling={"rope_type": "linear", "factor": 2.0,
                                                               "partial_rotary_factor": 0.5}))
