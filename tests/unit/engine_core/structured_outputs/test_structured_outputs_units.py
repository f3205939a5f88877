"""Constrained decoding's parts, with llguidance and the default model's real vocabulary: the checks a
frontend makes, the compile cache, a request's matcher, the masks the sampler applies, and a constraint
that fails to compile failing only its request."""

import json
import time

import numpy as np
import pytest
import torch

from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from common.structured_outputs import StructuredOutputsParams, check_structured_outputs
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request
from engine_core.sample.sampler import Sampler
from engine_core.sched.scheduler import Scheduler, SchedulerConfig
from engine_core.structured_outputs.grammar_compiler import GrammarCompiler
from engine_core.structured_outputs.request_grammar import RequestGrammar
from engine_core.structured_outputs.token_masks import apply_masks, fill_masks
from common.wire_messages import FinishReason

pytestmark = pytest.mark.unit

VOCAB = 49152
EOS = 2
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler(default_model_dir):
    with open(f"{default_model_dir}/tokenizer.json") as f:
        c = GrammarCompiler(f.read(), VOCAB, [EOS])
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast.from_pretrained(default_model_dir)


def grammar_for(compiler, params: StructuredOutputsParams) -> RequestGrammar:
    g = RequestGrammar(compiler.compile(params), params.starts_after_token_ids, f"structured_outputs.{params.kinds()[0]}")
    g.compiled.result(timeout=30)
    assert g.start() is None
    return g


# ---- the frontend's check --------------------------------------------------------------------------

@pytest.mark.parametrize("params, field, reason", [
    (StructuredOutputsParams(regex="(ab"), "structured_outputs.regex", "unclosed group"),
    (StructuredOutputsParams(json={"type": "strin"}), "structured_outputs.json", "strin"),
    (StructuredOutputsParams(grammar="start: missing_rule"), "structured_outputs.grammar", "missing_rule"),
    (StructuredOutputsParams(json="{not json"), "structured_outputs.json", "cannot be compiled"),
    (StructuredOutputsParams(choice=[]), "structured_outputs.choice", "non-empty"),
    (StructuredOutputsParams(regex="a", choice=["b"]), "structured_outputs", "exactly one"),
    (StructuredOutputsParams(), "structured_outputs", "exactly one"),
    (StructuredOutputsParams(regex="a" * 300), "structured_outputs.regex", "--max-constraint-chars"),
])
def test_a_bad_constraint_is_refused_naming_the_field_and_the_librarys_reason(params, field, reason):
    with pytest.raises(InvalidParameter) as e:
        check_structured_outputs(params, max_chars=200, compile=True)
    assert e.value.param == field and reason in str(e.value) and str(e.value).startswith(field)


def test_good_constraints_pass_and_the_api_name_is_used():
    for params in (StructuredOutputsParams(json=PERSON), StructuredOutputsParams(json_object=True),
                   StructuredOutputsParams(regex=r"\d{3}"), StructuredOutputsParams(choice=["yes", "no"]),
                   StructuredOutputsParams(grammar='start: "a" b\nb: "b"+'),
                   StructuredOutputsParams(grammar='root ::= "x" [0-9]+')):  # GBNF
        check_structured_outputs(params, max_chars=10_000, compile=True)
    with pytest.raises(InvalidParameter) as e:
        check_structured_outputs(StructuredOutputsParams(json={"type": "strin"}), 10_000, True,
                                 field="response_format.json_schema.schema")
    assert e.value.param == "response_format.json_schema.schema"


# ---- compile cache, matcher -------------------------------------------------------------------------

def test_compiles_once_per_constraint_in_the_background(compiler):
    schema = dict(PERSON, title=f"cache-{time.time()}")  # a constraint no earlier test compiled
    before = compiler.compiles
    first = compiler.compile(StructuredOutputsParams(json=schema))
    again = compiler.compile(StructuredOutputsParams(json=json.dumps(schema)))  # the same schema as text
    assert again is first and compiler.compiles == before + 1
    assert first.result(timeout=30).start is not None


def test_a_matcher_follows_the_grammar_and_ends_it(compiler, tokenizer):
    g = grammar_for(compiler, StructuredOutputsParams(json=PERSON))
    ids = tokenizer.encode('{"name": "Ada", "age": 36}', add_special_tokens=False)
    for t in ids[:-1]:
        assert g.accept(t) is None and not g.terminated
    assert g.accept(ids[-1]) is None and g.terminated
    bad = grammar_for(compiler, StructuredOutputsParams(json=PERSON))
    error = bad.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert error.startswith("structured_outputs.json: token") and "does not fit the grammar" in error


def test_a_constraint_after_a_reasoning_section_starts_after_its_end_tokens(compiler, tokenizer):
    end = tokenizer.encode("</answer>", add_special_tokens=False)
    g = grammar_for(compiler, StructuredOutputsParams(choice=["yes", "no"], starts_after_token_ids=end))
    for t in tokenizer.encode("I think </answ", add_special_tokens=False):
        assert not g.constrains and g.accept(t) is None  # anything goes before the end
    for t in end:
        g.accept(t)
    assert g.constrains
    for t in tokenizer.encode("no", add_special_tokens=False):
        assert g.accept(t) is None
    assert g.terminated


# ---- masks ------------------------------------------------------------------------------------------

def test_masks_allow_exactly_the_grammars_tokens_and_eos_only_at_the_end(compiler, tokenizer):
    g = grammar_for(compiler, StructuredOutputsParams(choice=["yes", "no"]))
    masks = fill_masks([(g.matcher, 0, [])], 1, VOCAB)
    allowed = np.flatnonzero(np.unpackbits(masks.view(np.uint8), bitorder="little")[:VOCAB])
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts) and EOS not in allowed
    logits = torch.randn(3, VOCAB)
    expected = logits.clone()
    apply_masks(logits, [1], masks)
    assert torch.equal(logits[0], expected[0]) and torch.equal(logits[2], expected[2])  # other rows untouched
    kept = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert kept == allowed.tolist() and torch.equal(logits[1][kept], expected[1][kept])


def test_proposed_tokens_get_the_mask_of_their_position(compiler, tokenizer):
    g = grammar_for(compiler, StructuredOutputsParams(json=PERSON))
    text = tokenizer.encode('{"name": "A', add_special_tokens=False)
    masks = fill_masks([(g.matcher, 0, text)], len(text) + 1, VOCAB)
    for j, t in enumerate(text):  # each proposal is allowed by the mask before it
        assert (masks[j, t // 32] >> (t % 32)) & 1
    assert g.matcher.is_accepting() is False and g.accept(text[0]) is None  # the matcher itself did not move


def test_the_sampler_obeys_masks_allowed_ids_and_bias_and_leaves_other_rows_alone(compiler, tokenizer):
    sampler = Sampler(torch.device("cpu"), seed=0)
    constrained = Request("c", [1, 2, 3], SamplingParams(temperature=0.9, seed=5))
    constrained.grammar = grammar_for(compiler, StructuredOutputsParams(regex="[0-9]+"))
    allowed = Request("a", [1], SamplingParams(temperature=1.0, seed=6, allowed_token_ids=[100, 200, 300]))
    biased = Request("b", [1], SamplingParams(temperature=0, logit_bias={4242: 100.0}))
    plain = Request("p", [1], SamplingParams(temperature=0.7, seed=7))
    logits = torch.randn(4, VOCAB)
    alone = Sampler(torch.device("cpu"), seed=0)(logits[3:4].clone(), [Request("p", [1], SamplingParams(temperature=0.7,
                                                                                                     seed=7))])[0]
    for _ in range(5):
        tokens, _ = sampler(logits.clone(), [constrained, allowed, biased, plain])
        assert tokenizer.decode([tokens[0]]).isdigit()
        assert tokens[1] in (100, 200, 300) and tokens[2] == 4242
    beside = Sampler(torch.device("cpu"), seed=0)(logits.clone(), [constrained, allowed, biased, Request(
        "p", [1], SamplingParams(temperature=0.7, seed=7))])[0]
    assert beside[3] == alone[0]  # the unconstrained row draws what it draws alone


# ---- a constraint that does not compile -------------------------------------------------------------

def test_a_constraint_that_fails_to_compile_fails_its_request_only(compiler):
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=128),
                          KVCacheManager(16, 16, True))
    bad = StructuredOutputsParams(regex="(unclosed")  # the frontend would refuse it; another caller might not
    broken = Request("broken", [5, 6, 7], SamplingParams(max_tokens=4, structured_outputs=bad))
    broken.grammar = RequestGrammar(compiler.compile(bad), [], "structured_outputs.regex")
    fine = Request("fine", [5, 6, 8], SamplingParams(max_tokens=4))
    scheduler.add_request(broken)
    scheduler.add_request(fine)
    broken.grammar.compiled.result(timeout=30)
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["fine"]
    outputs = scheduler.update_from_output(out, {"fine": [9]})
    error = next(o for o in outputs if o.request_id == "broken")
    assert error.finish_reason == FinishReason.ERROR
    assert error.error.startswith("structured_outputs.regex cannot be compiled") and "unclosed" in error.error
    assert scheduler.kv.num_free_blocks == 16 - 1  # only `fine` holds a block


def test_a_request_waits_for_its_grammar_without_holding_up_the_queue(compiler):
    from concurrent.futures import Future
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=128),
                          KVCacheManager(16, 16, True))
    pending: Future = Future()  # a compile that has not finished
    slow = Request("slow", [5, 6, 7], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        regex="a")))
    slow.grammar = RequestGrammar(pending, [], "structured_outputs.regex")
    scheduler.add_request(slow)
    scheduler.add_request(Request("next", [5, 6, 8], SamplingParams(max_tokens=4)))
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["next"]
    assert list(scheduler.waiting) == [slow]  # kept its place
    scheduler.update_from_output(out, {"next": [9]})
    pending.set_result(compiler.compile(StructuredOutputsParams(regex="a")).result(timeout=30))
    assert [s.request.request_id for s in scheduler.schedule().scheduled] == ["next", "slow"]
