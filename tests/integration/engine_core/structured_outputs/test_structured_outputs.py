"""Structured outputs end to end on the default model: offline through SamplingParams, and over HTTP with
the official openai client (response_format with a pydantic model, json_schema, vLLM's fields).

Constrained and unconstrained requests share batches with preemption and prefix-cache hits: constrained
rows obey their grammars, unconstrained rows give exactly the tokens they give alone."""

import json
import re
from typing import Literal

import httpx
import jsonschema
import pydantic
import pytest

from common.sampling_params import SamplingParams
from common.structured_outputs import StructuredOutputsParams
from tests.support.tiny_models import DEFAULT_MODEL_KV, kv_block_bytes
from tests.support.http_helpers import openai_client, serving

pytestmark = pytest.mark.integration

ORDER = {"type": "object", "properties": {
    "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                  "vip": {"type": "boolean"}},
                 "required": ["name", "vip"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "enum": ["apple", "pear", "fig"]},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "qty"], "additionalProperties": False}},
    "total": {"type": "number", "minimum": 0, "maximum": 1000}},
    "required": ["customer", "items", "total"], "additionalProperties": False}
PROMPTS = ["Write an order for two apples as JSON.", "A fig order for Bo, a VIP:", "Order JSON:",
           "The customer wants pears."]
BLOCK_BYTES = kv_block_bytes(*DEFAULT_MODEL_KV)  # the default model's, in the dtype auto picks on this CPU


@pytest.fixture(scope="module")
def llm():
    from frontend.offline.llm import LLM
    # a small KV cache and token budget: requests are preempted and prefilled in chunks
    engine = LLM(multiprocess=False, max_model_len=192, max_num_seqs=8, max_num_batched_tokens=32,
                 kv_cache_memory=14 * BLOCK_BYTES)
    yield engine
    engine.shutdown()


def constrained(kind: str, value, **sampling) -> SamplingParams:
    sampling.setdefault("max_tokens", 120)
    return SamplingParams(structured_outputs=StructuredOutputsParams(**{kind: value}), **sampling)


def test_json_schema_outputs_validate_whenever_they_stop(llm):
    params = [constrained("json", ORDER, temperature=0.9, seed=s) for s in range(6)]
    outputs = llm.generate(PROMPTS[:3] * 2, params, use_tqdm=False)
    stopped = [o.outputs[0] for o in outputs if o.outputs[0].finish_reason == "stop"]
    assert len(stopped) >= 4, [o.outputs[0].text for o in outputs]
    for out in stopped:
        jsonschema.validate(json.loads(out.text), ORDER)
    assert {o.outputs[0].token_ids[-1] for o in outputs} - {2}  # it ends where the grammar does, no EOS needed


def test_regex_choice_grammar_and_any_json_object(llm):
    cases = [("regex", r"[A-Z][a-z]{2,8} [0-9]{1,3}", lambda t: re.fullmatch(r"[A-Z][a-z]{2,8} [0-9]{1,3}", t)),
             ("choice", ["red", "green", "blue"], lambda t: t in ("red", "green", "blue")),
             ("grammar", 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/', lambda t: re.fullmatch(r"\(\d+(,\d+)*\)", t)),
             ("grammar", 'root ::= "ok-" [a-c]+', lambda t: re.fullmatch("ok-[a-c]+", t)),  # GBNF
             ("json_object", True, lambda t: isinstance(json.loads(t), dict))]
    params = [constrained(kind, value, temperature=0.8, seed=3, max_tokens=40) for kind, value, _ in cases]
    outputs = llm.generate(["Say something."] * len(cases), params, use_tqdm=False)
    for (kind, _, matches), out in zip(cases, outputs):
        text = out.outputs[0].text
        if out.outputs[0].finish_reason == "stop":
            assert matches(text), (kind, text)
        else:  # cut by max_tokens: still a prefix the grammar allows
            assert kind in ("grammar", "json_object") and out.outputs[0].finish_reason == "length"


def test_unconstrained_requests_give_what_they_give_alone_beside_constrained_ones(llm):
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    seeded = SamplingParams(temperature=0.8, seed=11, max_tokens=24, ignore_eos=True)
    shared = "You are a helpful assistant. Answer briefly and precisely. "  # prefix-cache hits across requests
    alone = [llm.generate([shared + p], [sp], use_tqdm=False)[0].outputs[0]
             for p, sp in ((PROMPTS[0], plain), (PROMPTS[3], seeded))]
    stats = llm.get_stats()
    prompts = [shared + PROMPTS[0], shared + PROMPTS[1], shared + PROMPTS[3], shared + PROMPTS[2], shared + "Color?"]
    params = [plain, constrained("json", ORDER, temperature=0), seeded, constrained("json", ORDER, temperature=0.7, seed=2),
              constrained("choice", ["red", "green"], temperature=0)]
    together = llm.generate(prompts * 2, params * 2, use_tqdm=False)
    after = llm.get_stats()
    assert after.totals.num_preemptions > stats.totals.num_preemptions  # the small cache preempted some
    assert after.totals.prefix_cache_hits > stats.totals.prefix_cache_hits
    for i in (0, 5):
        assert together[i].outputs[0].token_ids == alone[0].token_ids
        assert [lp[t].logprob for lp, t in zip(together[i].outputs[0].logprobs, together[i].outputs[0].token_ids)] == \
            [lp[t].logprob for lp, t in zip(alone[0].logprobs, alone[0].token_ids)]
        assert together[i + 2].outputs[0].token_ids == alone[1].token_ids
    for i in (1, 3, 6, 8):
        out = together[i].outputs[0]
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), ORDER)
    assert together[4].outputs[0].text in ("red", "green") and together[9].outputs[0].text in ("red", "green")
    # the constrained greedy request is the same alone as in the batch, too
    assert llm.generate([prompts[1]], [params[1]], use_tqdm=False)[0].outputs[0].token_ids == together[1].outputs[0].token_ids


def test_n_samples_stop_strings_and_allowed_ids_and_bias(llm):
    outs = llm.generate(["Pick one."], [constrained("choice", ["alpha", "beta", "gamma"], n=3, temperature=1.0,
                                                    seed=4)], use_tqdm=False)[0].outputs
    assert len(outs) == 3 and all(o.text in ("alpha", "beta", "gamma") for o in outs)
    stopped = llm.generate(["Count:"], [constrained("regex", "[0-9]{2}(,[0-9]{2}){5}", temperature=0, stop=[","])],
                           use_tqdm=False)[0].outputs[0]
    assert re.fullmatch("[0-9]{2}", stopped.text)  # the stop string ends it, as in any request
    allowed = llm.generate(["Hi"], [SamplingParams(temperature=1.0, seed=1, max_tokens=8, ignore_eos=True,
                                                   allowed_token_ids=[28, 29, 30])], use_tqdm=False)[0].outputs[0]
    assert set(allowed.token_ids) <= {28, 29, 30}
    biased = llm.generate(["Hi"], [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                  logit_bias={4242: 100})], use_tqdm=False)[0].outputs[0]
    assert biased.token_ids == [4242] * 4


def test_a_bad_constraint_is_a_value_error_naming_the_field(llm):
    with pytest.raises(ValueError, match=r"(?s)structured_outputs\.regex cannot be compiled.*unclosed"):
        llm.generate(["x"], [constrained("regex", "(ab")], use_tqdm=False)
    with pytest.raises(ValueError, match=r"logit_bias"):
        llm.generate(["x"], [SamplingParams(logit_bias={1: 500})], use_tqdm=False)
    assert llm.generate(["x"], [constrained("choice", ["ok"])], use_tqdm=False)[0].outputs[0].text == "ok"


def test_speculative_decoding_keeps_the_grammar_and_the_greedy_tokens(llm):
    from frontend.offline.llm import LLM
    params = [constrained("json", ORDER, temperature=0), constrained("json", ORDER, temperature=0.8, seed=9),
              SamplingParams(temperature=0, max_tokens=30)]
    prompts = ["Repeat: {\"customer\": {\"name\": \"Al\", \"vip\": true}", PROMPTS[1], PROMPTS[2]]
    plain = llm.generate(prompts, params, use_tqdm=False)
    spec = LLM(multiprocess=False, max_model_len=256, max_num_batched_tokens=64,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    try:
        out = spec.generate(prompts, params, use_tqdm=False)
        assert spec.get_stats().totals.spec_num_drafts > 0
    finally:
        spec.shutdown()
    assert out[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert out[2].outputs[0].token_ids == plain[2].outputs[0].token_ids
    for o in out[:2]:
        if o.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(o.outputs[0].text), ORDER)


# ---- over HTTP, with the openai client -----------------------------------------------------------------

class Item(pydantic.BaseModel):
    sku: Literal["apple", "pear", "fig"]
    qty: int = pydantic.Field(ge=1, le=9)


class Order(pydantic.BaseModel):
    customer: str = pydantic.Field(max_length=20)
    items: list[Item] = pydantic.Field(min_length=1, max_length=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving([], tmp_path_factory.mktemp("serve")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server[0])


def test_parse_with_a_pydantic_model_returns_the_parsed_object(client):
    done = client.chat.completions.parse(model="SmolLM2-135M-Instruct", response_format=Order, temperature=0,
                                         max_tokens=150, messages=[{"role": "user", "content": "Order two figs."}])
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Order)


def test_json_schema_streamed_and_whole_agree_and_validate(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
    messages = [{"role": "user", "content": "An order for Bo."}]
    whole = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, response_format=fmt,
                                           temperature=0, max_tokens=150)
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), ORDER)
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, response_format=fmt,
                                            temperature=0, max_tokens=150, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole.choices[0].message.content
    obj = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=60,
                                         response_format={"type": "json_object"}, temperature=0)
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_vllm_fields_on_completions_and_chat(client):
    regex = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Code:", max_tokens=20, temperature=0.7,
                                      seed=1, extra_body={"structured_outputs": {"regex": "[A-F]{3}-[0-9]{2}"}})
    assert re.fullmatch("[A-F]{3}-[0-9]{2}", regex.choices[0].text)
    choice = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=5,
                                            messages=[{"role": "user", "content": "Is water wet?"}],
                                            extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].message.content in ("yes", "no")
    old = client.completions.create(model="SmolLM2-135M-Instruct", prompt="JSON:", max_tokens=60, temperature=0,
                                    extra_body={"guided_json": {"type": "object", "properties": {
                                        "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}})
    assert json.loads(old.choices[0].text) in ({"ok": True}, {"ok": False})
    biased = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=3, temperature=0,
                                       logit_bias={"4242": 100}, extra_body={"ignore_eos": True})
    assert biased.choices[0].text == client.completions.create(
        model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True, "allowed_token_ids": [4242]}).choices[0].text


@pytest.mark.parametrize("body, param, reason", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema", "strin"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "needs json_schema.schema"),
    ({"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs.grammar", "nowhere"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "one output constraint"),
    ({"logit_bias": {"4242": 101}}, "logit_bias", "100"),
    ({"allowed_token_ids": [10**9]}, "allowed_token_ids", "outside the vocabulary"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(server, body, param, reason):
    r = httpx.post(server[0] + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param) and reason in error["message"], error
    ok = httpx.post(server[0] + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200  # the server goes on
