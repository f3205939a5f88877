"""The Responses API's translation without a server: input items into chat messages, chat errors renamed to
Responses fields, and the stream's events joining to the whole answer's items."""

import pytest

from frontend.endpoints.chat.output import ChatText
from frontend.endpoints.serving.errors import APIError
from frontend.endpoints.responses.output import ResponseEvents, reasoning_token_count, usage, whole_output
from frontend.endpoints.responses.objects import ResponseObject
from frontend.endpoints.responses.schemas import ResponsesRequest, TextConfig
from frontend.endpoints.responses.request import chat_messages, chat_request, responses_error
from frontend.endpoints.openai_schemas.tool_schemas import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall

pytestmark = pytest.mark.unit


def test_items_become_the_chat_messages_they_mean():
    body = ResponsesRequest.model_validate({"instructions": "be brief", "input": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "let me call", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"}]})
    calls = lambda *ids: [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in ids]
    assert chat_messages(body) == [
        {"role": "system", "content": "be brief"}, {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "let me call", "tool_calls": calls(("c1", "f", "{}"), ("c2", "g", '{"x": 1}'))},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "assistant", "content": None, "tool_calls": calls(("c3", "f", "{}"))}]


def test_the_chat_request_carries_tools_formats_and_limits():
    chat = chat_request(ResponsesRequest.model_validate({
        "input": "hi", "max_output_tokens": 7, "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False, "top_k": 5,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        "reasoning": {"effort": "none"}}))
    assert chat.max_completion_tokens == 7 and chat.top_k == 5 and chat.reasoning_effort == "none"
    assert chat.tools[0].function.name == "f" and chat.tool_choice.function.name == "f"
    assert chat.parallel_tool_calls is False
    assert chat.response_format.json_schema.schema_ == {"type": "object"}


def test_chat_errors_name_the_responses_fields():
    error = responses_error(APIError(400, "max_tokens 9 is too many; see max_completion_tokens",
                                     param="max_completion_tokens"))
    assert (error.param, error.message) == ("max_output_tokens",
                                            "max_output_tokens 9 is too many; see max_output_tokens")
    assert responses_error(APIError(400, "x", param="response_format.json_schema.schema")).param == \
        "text.format.schema"
    assert responses_error(APIError(400, "x", param="messages[1].content")).param == "input[1].content"
    assert responses_error(APIError(400, "x", param="tool_choice")).param == "tool_choice"


PIECES = [ChatText(reasoning="think"), ChatText(reasoning=" more"), ChatText(content="Hel"),
          ChatText(content="lo", tool_calls=[DeltaToolCall(index=0, id="call_1", type="function",
                                                           function=DeltaFunctionCall(name="f", arguments='{"a'))]),
          ChatText(tool_calls=[DeltaToolCall(index=0, function=DeltaFunctionCall(arguments='": 1}'))]),
          ChatText(tool_calls=[DeltaToolCall(index=1, id="call_2", type="function",
                                             function=DeltaFunctionCall(name="g", arguments="{}"))])]
WHOLE = ChatText(reasoning="think more", content="Hello", tool_calls=[
    ToolCall(id="call_1", function=FunctionCall(name="f", arguments='{"a": 1}')),
    ToolCall(id="call_2", function=FunctionCall(name="g", arguments="{}"))])


def _without_ids(items):
    return [{k: v for k, v in (i if isinstance(i, dict) else i.model_dump()).items() if k != "id"} for i in items]


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_streamed_events_join_to_the_whole_answers_items(finish):
    events = ResponseEvents(ResponseObject(id="resp_1", status="in_progress", model="m", text=TextConfig()))
    sent = events.start()
    for piece in PIECES:
        sent += events.add(piece)
    sent += events.finish(finish, usage(5, 0, 9, 2), 0)
    assert [data["sequence_number"] for _, data in sent] == list(range(len(sent)))
    kinds = [kind for kind, _ in sent]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if finish == "stop" else "response.incomplete")
    added = [data["output_index"] for kind, data in sent if kind == "response.output_item.added"]
    done = [data["output_index"] for kind, data in sent if kind == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    final = sent[-1][1]["response"]
    assert _without_ids(final["output"]) == _without_ids(whole_output(WHOLE, finish == "length"))
    assert [o["status"] for o in final["output"]][-1] == ("completed" if finish == "stop" else "incomplete")
    assert "".join(d["delta"] for k, d in sent if k == "response.function_call_arguments.delta") == '{"a": 1}{}'


class _Chars:
    """A tokenizer whose token i is the i-th character of a text."""
    def __init__(self, text):
        self.text = text

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.text[i] for i in ids)


def test_reasoning_tokens_run_to_the_end_of_the_reasoning():
    text = "ab</think>cd"
    ids = list(range(len(text)))
    assert reasoning_token_count(_Chars(text), ids, True) == text.index("</think>") + len("</think>")
    assert reasoning_token_count(_Chars("abc"), [0, 1, 2], True) == 3
    assert reasoning_token_count(_Chars(text), ids, False) == 0


def test_an_error_after_the_stream_began_is_an_error_event_naming_the_responses_field():
    import asyncio
    import json

    from frontend.endpoints.chat.start import ChatRun
    from frontend.endpoints.responses.handler import _events
    from frontend.request_path.outputs import CompletionOutput, RequestOutput

    async def outputs():
        yield 0, RequestOutput("resp-1", None, [1, 2], [CompletionOutput(0, "Hi", [5])], False)
        failed = CompletionOutput(0, "", [], finish_reason="error", error_param="response_format.json_schema.schema",
                                  stop_reason="response_format.json_schema.schema: no token can follow")
        yield 0, RequestOutput("resp-1", None, [1, 2], [failed], True)

    class Prompt:
        prompt_token_ids = [1, 2]

    run = ChatRun(engine=None, request_id="resp-1", params=None, prompts=[Prompt()], stream=outputs(),
                  formats=(None, None, False), lora=None, constraint_field="response_format.json_schema.schema")
    template = ResponseObject(id="resp_1", status="in_progress", model="m", text=TextConfig())

    async def collect():
        return [chunk async for chunk in _events(None, run, template)]

    chunks = asyncio.run(collect())
    kinds = [c.split("\n", 1)[0].removeprefix("event: ") for c in chunks]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "error"]
    error = json.loads(chunks[-1].split("data: ", 1)[1])
    assert error["param"] == "text.format.schema" and error["message"].startswith("text.format.schema: no token")
    assert error["sequence_number"] == len(chunks) - 1
