"""A Responses request translated into the chat request it means, so that /v1/responses runs the chat path
itself (template, tools and their grammar, text.format constraints, reasoning): nothing is done twice.

`instructions` becomes the system turn; input messages become chat messages (developer turns stay developer);
a function_call item joins the assistant turn before it (or opens one) as a tool call, a function_call_output
item becomes a tool message; reasoning items are left out. Errors the chat path raises name chat fields; they
are renamed to the Responses fields the client sent.
"""

import re

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from frontend.endpoints.chat.schemas import ChatCompletionRequest
from frontend.endpoints.responses.schemas import (VLLM_EXTENSIONS, FunctionCallItem, FunctionCallOutputItem,
                                                  MessageItem, ResponsesRequest, TextFormatJsonObject,
                                                  TextFormatJsonSchema)
from frontend.endpoints.serving.errors import APIError, _validation_error

# chat field -> the Responses field it came from (longest first: a prefix is renamed once)
CHAT_TO_RESPONSES = [
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),  # the engine's own checks call it so
    ("messages", "input"),
]


def chat_messages(body: ResponsesRequest) -> list[dict]:
    messages = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for item in items:
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                refusals = [p.refusal for p in item.content if getattr(p, "type", "") == "refusal"] \
                    if isinstance(item.content, list) else []
                text = "\n".join(p.text for p in item.content if getattr(p, "type", "") != "refusal") \
                    if isinstance(item.content, list) else item.content
                message = {"role": "assistant", "content": text or None}
                if refusals:
                    message["refusal"] = "\n".join(refusals)
                messages.append(message)
            else:
                messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        # reasoning items: earlier reasoning is not given to the model again
    return messages


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request, or a 400 naming the Responses field at fault."""
    messages = chat_messages(body)
    if not any(m["role"] != "system" for m in messages):
        raise APIError(400, "input must hold at least one message or item besides instructions", param="input")
    fields = {"model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
              "temperature": body.temperature, "top_p": body.top_p, "stream": body.stream,
              "metadata": body.metadata, "user": body.user}
    if body.tools is not None:
        fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                           for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                        "function": {"name": choice.name}}
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    text_format = body.text.format if body.text is not None else None
    if isinstance(text_format, TextFormatJsonObject):
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(text_format, TextFormatJsonSchema):
        fields["response_format"] = {"type": "json_schema", "json_schema": text_format.model_dump(
            exclude={"type"}, exclude_none=True, by_alias=True)}
    if body.reasoning is not None and body.reasoning.effort is not None:
        fields["reasoning_effort"] = body.reasoning.effort
    for name in VLLM_EXTENSIONS:
        if name in body.model_fields_set:
            fields[name] = getattr(body, name)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:  # the chat path's own checks on what was translated
        raise responses_error(_validation_error(RequestValidationError(e.errors(), body=fields))) from None


def responses_name(name: str | None) -> str | None:
    """A chat field's path as the Responses field it came from (`messages[2].content` -> `input[2].content`;
    the index is the chat message's, counting instructions as the first)."""
    if name is None:
        return None
    for chat, responses in CHAT_TO_RESPONSES:
        if name == chat or name.startswith(chat + ".") or name.startswith(chat + "["):
            return responses + name[len(chat):]
    return name


def responses_error(error: APIError) -> APIError:
    """The chat path's error, its field and message naming the Responses fields."""
    message = error.message
    for chat, responses in CHAT_TO_RESPONSES:
        message = re.sub(rf"\b{re.escape(chat)}\b", responses, message)
    return APIError(error.status, message, param=responses_name(error.param), code=error.code, type=error.type,
                    headers=error.headers)
