"""Beam search (LLM.beam_search): the same sequences and scores as transformers' generate(num_beams=W,
early_stopping=False, num_return_sequences=W) in float32, on tiny random models (with and without an EOS the
beams reach) and on the embedded SmolLM2; and the same beams batched with plain requests, under a small budget
and under preemption as alone."""

import json
import os
import shutil

import pytest
import torch
import transformers

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter
from common.wire_messages import FinishReason
from common.sampling_params import SamplingParams
from frontend.offline.llm import LLM
from tests.support.beams import assert_same_beams, transformers_beams

pytestmark = pytest.mark.integration

PROMPT = [int(t) for t in torch.randint(3, 49152, (21,), generator=torch.Generator().manual_seed(7))]
OTHER = [int(t) for t in torch.randint(3, 49152, (9,), generator=torch.Generator().manual_seed(8))]
MAX_TOKENS = 12


def eos_folder(path: str, hf, tmp_path) -> tuple[str, int]:
    """A copy of the model whose EOS is the 2nd token of the best 4-beam continuation of PROMPT: beams reach it."""
    eos = transformers_beams(hf, PROMPT, 4, 1.0, 4, eos=2)[0][0][1]
    folder = str(tmp_path / "eos")
    shutil.copytree(path, folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "bos_token_id": 1}, f)
    return folder, eos


def make_llm(path: str, **kwargs) -> LLM:
    return LLM(path, dtype="float32", multiprocess=False, **({"kv_cache_memory": "16MiB", "max_model_len": 128} | kwargs))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tiny_models, tmp_path_factory):
    path = tiny_models[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, hf, tmp_path_factory.mktemp(request.param)


def test_beams_match_transformers_without_eos_in_reach(tiny):
    path, hf, _ = tiny
    with make_llm(path) as llm:
        for width, penalty in ((1, 1.0), (2, 0.5), (4, 2.0)):
            (ours,) = llm.beam_search([PROMPT], BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS,
                                                                 length_penalty=penalty))
            assert len(ours.sequences) == width
            assert all(s.finish_reason == "length" for s in ours.sequences)
            assert all(s.tokens == PROMPT + s.output_token_ids for s in ours.sequences)
            assert_same_beams(ours, transformers_beams(hf, PROMPT, width, penalty, MAX_TOKENS, eos=2))
        for bad, field in ((dict(beam_width=0), "beam_width"), (dict(beam_width=129), "beam_width"),
                           (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=200), "max_tokens"),
                           (dict(length_penalty=float("inf")), "length_penalty")):
            with pytest.raises(InvalidParameter) as e:
                llm.beam_search([PROMPT], BeamSearchParams(**({"beam_width": 2, "max_tokens": 4} | bad)))
            assert e.value.param == field and str(e.value).startswith(field)
        stats = llm.get_stats()
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
        assert stats.totals.prefix_cache_hits >= 2 * 16  # the later searches took the prompt's full block from the cache


def test_beams_match_transformers_with_eos_in_reach(tiny):
    path, hf, tmp = tiny
    folder, eos = eos_folder(path, hf, tmp)
    with make_llm(folder) as llm:
        finished_early = 0
        for width, penalty in ((2, 0.5), (2, 2.0), (4, 0.5), (4, 1.0)):
            (ours,) = llm.beam_search([PROMPT], BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS,
                                                                 length_penalty=penalty))
            assert_same_beams(ours, transformers_beams(hf, PROMPT, width, penalty, MAX_TOKENS, eos))
            finished_early += sum(s.finish_reason == "stop" and s.output_token_ids[-1] == eos for s in ours.sequences)
            # ignore_eos: EOS is a token like any other, every beam runs to max_tokens
            (ignoring,) = llm.beam_search([PROMPT], BeamSearchParams(beam_width=width, max_tokens=6, ignore_eos=True,
                                                                     length_penalty=penalty))
            assert all(len(s.output_token_ids) == 6 and s.finish_reason == "length" for s in ignoring.sequences)
        assert finished_early > 0  # the EOS was in reach: some beams ended on it
        stats = llm.get_stats()
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks


def test_beams_batched_with_plain_requests_small_budget_and_preemption(tiny):
    """Two beam searches and two plain requests in one engine: under a 5-token budget (chunked prompts, a group
    waiting for room) and with a KV pool small enough to preempt, each result is the one it has alone."""
    path, _, _ = tiny
    params = BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, length_penalty=1.0)
    with make_llm(path) as llm:
        alone = [llm.beam_search([p], params)[0] for p in (PROMPT, OTHER)]
        plain_alone = llm.generate([OTHER, PROMPT], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                                   use_tqdm=False)
    from tests.support.tiny_models import kv_block_bytes
    from engine_core.families.catalog import read_spec
    from engine_core.weights.model_folder import read_hf_config
    spec = read_spec(read_hf_config(path))
    block = kv_block_bytes(spec.num_layers, spec.num_kv_heads, spec.head_dim, "float32", block_size=4)
    for engine in ({"max_num_batched_tokens": 5}, {"block_size": 4, "kv_cache_memory": 24 * block, "max_model_len": 64}):
        with make_llm(path, **engine) as llm:
            beams, plain = run_together(llm, [PROMPT, OTHER], params, [OTHER, PROMPT])
            stats = llm.get_stats()
        for ours, reference in zip(beams, alone):
            assert [(b.token_ids, b.cum_logprob, b.score) for b in ours] == [
                (s.output_token_ids, s.cum_logprob, s.score) for s in reference.sequences]
        assert plain == [o.outputs[0].token_ids for o in plain_alone]
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
        if "block_size" in engine:
            assert stats.totals.num_preemptions > 0


def run_together(llm: LLM, beam_prompts, params: BeamSearchParams, plain_prompts):
    """Every request into the core at once; (each beam search's BeamHypothesis list, each plain request's tokens)."""
    beam_requests = [llm.processor.process(f"beam-{i}", p, SamplingParams(), beam_search=params).core_requests[0]
                     for i, p in enumerate(beam_prompts)]
    plain_requests = [llm.processor.process(f"plain-{i}", p, SamplingParams(temperature=0, max_tokens=10,
                                                                            ignore_eos=True)).core_requests[0]
                      for i, p in enumerate(plain_prompts)]
    for r in beam_requests + plain_requests:
        llm.client.add_request(r)
    tokens = {r.request_id: [] for r in plain_requests}
    beams, done = {}, set()
    while len(done) < len(beam_requests) + len(plain_requests):
        for out in llm.client.get_output().outputs:
            assert out.finish_reason not in (FinishReason.ERROR, FinishReason.ABORT), out
            if out.request_id in tokens:
                tokens[out.request_id] += out.new_token_ids
            if out.beams:
                beams[out.request_id] = out.beams
            if out.finish_reason is not None:
                done.add(out.request_id)
    return [beams[r.request_id] for r in beam_requests], [tokens[r.request_id] for r in plain_requests]


def test_default_model_beams_match_transformers(default_model_dir, smollm2_transformers):
    hf = smollm2_transformers
    with LLM(None, dtype="float32", quantization="none", max_model_len=256, kv_cache_memory="64MiB",
             multiprocess=False) as llm:
        tok = llm.get_tokenizer()
        prompt = tok.encode("The capital of France is")
        for width, penalty in ((2, 1.0), (4, 0.5)):
            (ours,) = llm.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=16,
                                                                 length_penalty=penalty))
            assert_same_beams(ours, transformers_beams(hf, prompt, width, penalty, 16, eos=2))
            assert ours.sequences[0].text.startswith(tok.decode(prompt, skip_special_tokens=True))
