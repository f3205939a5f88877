"""/v1/responses with the official openai client, on one tiny Qwen3 server whose template takes tools and thinks
(test_tool_calling's): plain text, instructions, tools required and named, text.format json_schema, reasoning
items, input items of an earlier turn; each whole and streamed (`responses.stream` or raw events), the two equal,
and equal to what /v1/chat/completions gives for the same request; bad bodies are 400s naming the field."""

import json

import httpx
import jsonschema
import openai
import pytest

from tests.support.http_helpers import openai_client, serving
from tests.support.tool_models import ADD, SCHEMAS, WEATHER, qwen_like_model

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, ADD)]  # Responses' flat function tools
NO_THINKING = {"effort": "none"}  # the template's empty <think></think>: a constraint applies from the start
FORCED_REASONING = {"grammar": 'start: "<think>" /[a-z]{2,8}( [a-z]{2,8}){1,3}/ "</think>" /[a-z]{3,8}/'}


@pytest.fixture(scope="module")
def server(tmp_path_factory, default_model_dir):
    folder = qwen_like_model(str(tmp_path_factory.mktemp("qwen3-responses")), default_model_dir)
    with serving([folder, "--served-model-name", "tiny"], tmp_path_factory.mktemp("serve")) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def create(client, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 40)
    return client.responses.create(model="tiny", **kw)


def shape(response) -> dict:
    """What a response says, without its ids (which differ per response)."""
    items = []
    for item in response.output:
        if item.type == "message":
            items.append(("message", item.status, [c.text for c in item.content]))
        elif item.type == "reasoning":
            items.append(("reasoning", item.status, [c.text for c in item.content]))
        else:
            items.append(("function_call", item.status, item.name, item.arguments, item.call_id.startswith("call_")))
    u = response.usage
    return {"status": response.status, "incomplete": response.incomplete_details, "items": items,
            "usage": (u.input_tokens, u.output_tokens, u.total_tokens, u.output_tokens_details.reasoning_tokens)}


def check_sequence(events) -> None:
    """Numbered from 0 in order; created, in_progress first; every item added is done; one final event last."""
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert types.count("response.output_item.added") == types.count("response.output_item.done")


def stream_helper(client, **kw):
    """(events, final response) through the SDK's responses.stream (a response that completes)."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 40)
    with client.responses.stream(model="tiny", **kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_sequence(events)
    return events, final


def raw_stream(client, **kw):
    """(events, final response) from the raw event stream (responses.stream insists on response.completed)."""
    events = list(create(client, stream=True, **kw))
    check_sequence(events)
    return events, events[-1].response


def test_plain_text_whole_and_streamed(client):
    whole = create(client, input="Hello there", max_output_tokens=12)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.model == "tiny"
    assert whole.output[0].type == "message" and whole.output_text
    cut = whole.usage.output_tokens == 12
    assert (whole.status, bool(whole.incomplete_details)) == (("incomplete", True) if cut else ("completed", False))
    if cut:
        assert whole.incomplete_details.reason == "max_output_tokens" and whole.output[-1].status == "incomplete"
    events, final = raw_stream(client, input="Hello there", max_output_tokens=12)
    assert shape(final) == shape(whole)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text and len(deltas) > 1
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == whole.output_text


def test_instructions_are_the_system_turn_of_the_chat_path(client):
    whole = create(client, instructions="Answer briefly.", input="Name a colour.", max_output_tokens=10,
                   reasoning=NO_THINKING)
    chat = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=10, reasoning_effort="none",
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}])
    assert whole.output_text == chat.choices[0].message.content
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                      chat.usage.completion_tokens)
    bare = create(client, input="Name a colour.", max_output_tokens=1, reasoning=NO_THINKING)
    assert bare.usage.input_tokens < whole.usage.input_tokens


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "add"}])
def test_required_and_named_tools_whole_and_streamed(client, tool_choice):
    kw = dict(input="What is 2 + 3, and the weather in Oslo?", tools=TOOLS, tool_choice=tool_choice,
              reasoning=NO_THINKING, max_output_tokens=200)
    whole = create(client, **kw)
    assert whole.status == "completed" and whole.output and all(o.type == "function_call" for o in whole.output)
    for call in whole.output:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    if isinstance(tool_choice, dict):
        assert {o.name for o in whole.output} == {"add"}
    assert whole.tool_choice == tool_choice if isinstance(tool_choice, str) else whole.tool_choice.name == "add"
    events, final = stream_helper(client, **kw)
    assert shape(final) == shape(whole)
    by_item = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            by_item[e.item_id] = by_item.get(e.item_id, "") + e.delta
    assert list(by_item.values()) == [o.arguments for o in whole.output]
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == \
        [o.arguments for o in whole.output]


def test_json_schema_text_format_whole_and_streamed(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["colour", "count"], "additionalProperties": False,
              "x-guidance": {"whitespace_flexible": False}}  # llguidance: a random model would add spaces forever
    kw = dict(input="A colour and a count, as JSON.", reasoning=NO_THINKING, max_output_tokens=120,
              text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
    whole = create(client, **kw)
    assert whole.status == "completed"
    jsonschema.validate(json.loads(whole.output_text), schema)
    assert whole.text.format.type == "json_schema"
    _, final = stream_helper(client, **kw)
    assert shape(final) == shape(whole)


def test_reasoning_items_whole_streamed_and_as_chat_splits_them(client):
    kw = dict(input="think first", temperature=0.8, max_output_tokens=60,
              extra_body={"seed": 3, "structured_outputs": FORCED_REASONING})
    whole = create(client, **kw)
    assert [o.type for o in whole.output] == ["reasoning", "message"]
    reasoning = whole.output[0].content[0].text
    assert " " in reasoning and "<think>" not in reasoning and whole.output_text.isalpha()
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "think first"}],
                                          temperature=0.8, max_tokens=60,
                                          extra_body={"seed": 3, "structured_outputs": FORCED_REASONING})
    message = chat.choices[0].message
    assert (reasoning, whole.output_text) == (message.model_extra["reasoning_content"], message.content)
    events, final = stream_helper(client, **kw)
    assert shape(final) == shape(whole)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    types = [e.type for e in events]
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")


def test_input_items_of_an_earlier_turn_are_the_chat_messages(client):
    """A call and its result given back as items make the same prompt as the chat API's tool_calls and tool
    message (same token count, same greedy answer); earlier reasoning items are left out."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is 20 + 22?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "add"}]},
             {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 20, "b": 22}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "42"}]
    whole = create(client, input=items, tools=TOOLS, tool_choice="none", max_output_tokens=8, reasoning=NO_THINKING)
    chat = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=8, reasoning_effort="none", tools=[WEATHER, ADD], tool_choice="none",
        messages=[{"role": "user", "content": "What is 20 + 22?"},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                      "name": "add", "arguments": '{"a": 20, "b": 22}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "42"}])
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.output_text == chat.choices[0].message.content


@pytest.mark.parametrize("body, param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_abc"}, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}}, "text.format.schema"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice"),
    ({"truncation": "auto"}, "truncation"),
    ({"n": 2}, "n"),
])
def test_bad_bodies_are_400s_naming_the_field(server, body, param):
    r = httpx.post(f"{server}/v1/responses", json={"model": "tiny", "input": "hi", **body}, timeout=300)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param) and error["type"] == "invalid_request_error", error
    assert param.split(".")[0].split("[")[0] in error["message"], error


def test_nothing_is_stored(server, client):
    r = httpx.get(f"{server}/v1/responses/resp_123", timeout=60)
    assert r.status_code == 404 and "stateless" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_123")
    assert create(client, input="hi", max_output_tokens=2, store=False).store is False
