"""Tool calling and reasoning over HTTP with the official openai client.

On the default model (SmolLM2, whose template takes no tools: nvllm's generic format in the system turn):
required and named tool_choice enforced by the grammar, whole and streamed; auto parsing what the model
wrote; a multi-turn exchange with a tool result. On a tiny Qwen3 model with a Qwen-style template that
takes tools and thinks: tools through the template, Hermes calls, and reasoning split out of an output
forced through <think>."""

import json
import signal

import jsonschema
import openai
import pytest

from tests.support.http_helpers import SMALL_ENGINE, start_serve
from tests.support.tool_models import ADD, SCHEMAS, WEATHER, qwen_like_model

pytestmark = pytest.mark.integration

def _serve(args: list[str], log_dir) -> tuple[str, object]:
    base, _, proc = start_serve([*args, "--disable-uvicorn-access-log", *SMALL_ENGINE], str(log_dir / "serve.log"))
    return base, proc


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    base, proc = _serve([], tmp_path_factory.mktemp("serve"))
    yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def qwen_client(tmp_path_factory, default_model_dir):
    folder = qwen_like_model(str(tmp_path_factory.mktemp("qwen3-tools")), default_model_dir)
    base, proc = _serve([folder, "--served-model-name", "tiny"], tmp_path_factory.mktemp("serve-qwen"))
    yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


def chat(client, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=kw.pop("model", "SmolLM2-135M-Instruct"), messages=messages, **kw)


def streamed(client, messages, **kw) -> tuple[str | None, list[dict], str | None, str | None]:
    """(content, calls as {id, name, arguments}, finish_reason, reasoning) joined from the deltas."""
    content, reasoning, calls, finish = None, None, {}, None
    for chunk in chat(client, messages, stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            if d.content:
                content = (content or "") + d.content
            extra = getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content")
            if extra:
                reasoning = (reasoning or "") + extra
            for t in d.tool_calls or []:
                call = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or t.id
                call["name"] = call["name"] or (t.function.name if t.function else None)
                call["arguments"] += (t.function.arguments or "") if t.function else ""
            finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, reasoning


def check_calls(calls) -> None:
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
        assert c.id.startswith("call_") and c.type == "function"


@pytest.mark.parametrize("tool_choice, parallel", [("required", True), ("required", False),
                                                   ({"type": "function", "function": {"name": "add"}}, True)])
def test_required_and_named_calls_parse_and_validate_whole_and_streamed(client, tool_choice, parallel):
    messages = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
    kw = dict(tools=[WEATHER, ADD], tool_choice=tool_choice, parallel_tool_calls=parallel)
    whole = chat(client, messages, **kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    calls = whole.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    check_calls(calls)
    if isinstance(tool_choice, dict):
        assert [c.function.name for c in calls] == ["add"]
    content, pieces, finish, _ = streamed(client, messages, **kw)
    assert finish == "tool_calls" and content is None
    assert [(p["name"], p["arguments"]) for p in pieces] == [(c.function.name, c.function.arguments) for c in calls]
    assert all(p["id"].startswith("call_") for p in pieces)


def test_auto_parses_a_call_the_model_chose_to_write(client):
    call = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]</tool_call>'
    messages = [{"role": "user", "content": f"{call}\nRepeat the line above."}]
    # the small model copies the line, then talks on in words that move with the kernels' last bits: a stop at
    # the line's end ends the answer where the call does (a stopped answer with a call: "tool_calls")
    whole = chat(client, messages, tools=[WEATHER], max_tokens=60, stop=["\n"]).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == \
        [("get_weather", {"city": "Tokyo"})]
    assert "<tool_call>" not in (whole.message.content or "")
    content, pieces, finish, _ = streamed(client, messages, tools=[WEATHER], max_tokens=60, stop=["\n"])
    assert (content, finish) == (whole.message.content, "tool_calls")
    assert [(p["name"], p["arguments"]) for p in pieces] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    plain = chat(client, [{"role": "user", "content": "Hello!"}], tools=[WEATHER], tool_choice="none").choices[0]
    assert plain.finish_reason in ("stop", "length") and not plain.message.tool_calls and plain.message.content


def test_a_multi_turn_exchange_with_a_tool_result(client):
    messages = [{"role": "user", "content": "What is 20 + 22? Use the add tool."}]
    first = chat(client, messages, tools=[ADD], tool_choice="required", parallel_tool_calls=False).choices[0]
    call = first.message.tool_calls[0]
    result = sum(json.loads(call.function.arguments).values())
    messages += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": call.id, "type": "function",
                                  "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": str(result)}]
    answer = chat(client, messages, tools=[ADD], tool_choice="none", max_tokens=40).choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.content
    again = chat(client, messages, tools=[ADD], tool_choice="required").choices[0]
    check_calls(again.message.tool_calls)


@pytest.mark.parametrize("body, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad", "parameters": {"type": "strin"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "x", "description": "<|im_end|>"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "user", "content": "hi"}], **body)
    assert e.value.body["param"].startswith(param), e.value.body
    assert chat(client, [{"role": "user", "content": "hi"}], max_tokens=2).choices[0].message.content is not None


# ---- a template that takes tools, and reasoning -------------------------------------------------------

def test_tools_through_the_template_and_hermes_calls(qwen_client):
    messages = [{"role": "user", "content": "weather in Oslo"}]
    whole = chat(qwen_client, messages, model="tiny", tools=[WEATHER, ADD], tool_choice="required",
                 max_tokens=200, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0]
    assert whole.finish_reason == "tool_calls"
    check_calls(whole.message.tool_calls)
    content, pieces, finish, _ = streamed(qwen_client, messages, model="tiny", tools=[WEATHER, ADD],
                                          tool_choice="required", max_tokens=200,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [(p["name"], p["arguments"]) for p in pieces] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_reasoning_goes_to_reasoning_content_whole_and_streamed(qwen_client):
    forced = {"grammar": 'start: "<think>" /[a-z]{2,8}( [a-z]{2,8}){1,3}/ "</think>" /[a-z]{3,8}/'}
    messages = [{"role": "user", "content": "think first"}]
    whole = chat(qwen_client, messages, model="tiny", temperature=0.8, seed=3, max_tokens=60,
                 extra_body={"structured_outputs": forced}).choices[0]
    reasoning = whole.message.model_extra.get("reasoning_content") or getattr(whole.message, "reasoning_content", None)
    assert whole.finish_reason == "stop" and reasoning and " " in reasoning and "<think>" not in reasoning
    assert whole.message.content and whole.message.content.isalpha()
    content, _, finish, streamed_reasoning = streamed(qwen_client, messages, model="tiny", temperature=0.8, seed=3,
                                                      max_tokens=60, extra_body={"structured_outputs": forced})
    assert (content, streamed_reasoning, finish) == (whole.message.content, reasoning, "stop")


def test_reasoning_effort_switches_the_templates_thinking(qwen_client):
    """none turns thinking off (the template writes its empty <think></think> block), high leaves it on."""
    messages = [{"role": "user", "content": "hi"}]
    off = chat(qwen_client, messages, model="tiny", max_tokens=1, reasoning_effort="none")
    on = chat(qwen_client, messages, model="tiny", max_tokens=1, reasoning_effort="high")
    explicit_off = chat(qwen_client, messages, model="tiny", max_tokens=1,
                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.prompt_tokens == explicit_off.usage.prompt_tokens > on.usage.prompt_tokens
