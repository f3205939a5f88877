"""What the chat path read out of an answer (frontend/endpoints/chat/output.py: reasoning, content, tool calls),
written as Responses output items: a reasoning item (reasoning_text content), a message (one output_text part),
function_call items; whole, or as the event sequence a stream sends.

A stream: response.created, response.in_progress; per item output_item.added, content_part.added (message and
reasoning), its deltas (output_text / reasoning_text / function_call_arguments), their .done, content_part.done,
output_item.done; then response.completed (response.incomplete when the length limit cut it). Each event has a
sequence_number. Items open one after another in the order the text gives them; the last item of a response
cut by its length is `incomplete`, every other item `completed`.
"""

import json
import uuid

from frontend.endpoints.chat.output import ChatText
from frontend.endpoints.responses.objects import (FunctionCallOutput, IncompleteDetails, InputTokensDetails,
                                                  OutputMessage, OutputTextPart, OutputTokensDetails, ReasoningItem,
                                                  ReasoningTextPart, ResponseObject, ResponseUsage)
from frontend.output_parsers.reasoning import THINK_CLOSE


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int) -> ResponseUsage:
    return ResponseUsage(input_tokens=input_tokens, input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
                         output_tokens=output_tokens,
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                         total_tokens=input_tokens + output_tokens)


def reasoning_token_count(tokenizer, token_ids: list[int], has_reasoning: bool) -> int:
    """The output tokens up to and with the one that closes the reasoning (all of them when it never closes):
    the shortest prefix whose text holds `</think>`, found by bisection (a longer prefix holds it too)."""
    if not has_reasoning:
        return 0
    if THINK_CLOSE not in tokenizer.decode(token_ids, skip_special_tokens=False):
        return len(token_ids)
    low, high = 1, len(token_ids)
    while low < high:
        mid = (low + high) // 2
        if THINK_CLOSE in tokenizer.decode(token_ids[:mid], skip_special_tokens=False):
            high = mid
        else:
            low = mid + 1
    return low


def finish_status(finish_reason: str | None) -> tuple[str, IncompleteDetails | None]:
    if finish_reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    return "completed", None


def whole_output(read: ChatText, incomplete: bool) -> list:
    """The output items of a whole answer: reasoning, then the message, then the calls."""
    items = []
    if read.reasoning:
        items.append(ReasoningItem(id=item_id("rs"), content=[ReasoningTextPart(text=read.reasoning)],
                                   status="completed"))
    if read.content:
        items.append(OutputMessage(id=item_id("msg"), content=[OutputTextPart(text=read.content)], status="completed"))
    for call in read.tool_calls:
        items.append(FunctionCallOutput(id=item_id("fc"), call_id=call.id, name=call.function.name,
                                        arguments=call.function.arguments, status="completed"))
    if incomplete and items:
        items[-1].status = "incomplete"
    return items


class ResponseEvents:
    """The events of one streamed response. `start()` first, `add(read)` for each ChatText delta the chat
    path reads, `finish(...)` last; each returns the events to send, as (type, data) pairs."""

    def __init__(self, template: ResponseObject):
        self.response = template  # status in_progress, no output yet
        self.sequence = 0
        self.output: list = []  # the finished items
        self.open = None  # the item being written: [kind, item, its text so far]
        self.call_index = None  # the tool call index the open function_call item is

    def _event(self, kind: str, **data) -> tuple[str, dict]:
        event = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return kind, event

    def _snapshot(self) -> dict:
        return json.loads(self.response.model_dump_json())

    def start(self) -> list[tuple[str, dict]]:
        return [self._event("response.created", response=self._snapshot()),
                self._event("response.in_progress", response=self._snapshot())]

    def add(self, read: ChatText) -> list[tuple[str, dict]]:
        events = []
        if read.reasoning:
            events += self._text("reasoning", read.reasoning)
        if read.content:
            events += self._text("message", read.content)
        for call in read.tool_calls:
            events += self._call(call)
        return events

    def _index(self) -> int:
        return len(self.output)

    def _text(self, kind: str, delta: str) -> list[tuple[str, dict]]:
        events = []
        if self.open is None or self.open[0] != kind:
            events += self._close("completed")
            if kind == "reasoning":
                item = ReasoningItem(id=item_id("rs"), content=[], status="in_progress")
                part = ReasoningTextPart(text="")
            else:
                item = OutputMessage(id=item_id("msg"), content=[], status="in_progress")
                part = OutputTextPart(text="")
            self.open = [kind, item, ""]
            events.append(self._event("response.output_item.added", output_index=self._index(),
                                      item=item.model_dump()))
            events.append(self._event("response.content_part.added", item_id=item.id, output_index=self._index(),
                                      content_index=0, part=part.model_dump()))
        item = self.open[1]
        self.open[2] += delta
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", item_id=item.id, output_index=self._index(),
                                      content_index=0, delta=delta))
        else:
            events.append(self._event("response.output_text.delta", item_id=item.id, output_index=self._index(),
                                      content_index=0, delta=delta, logprobs=[]))
        return events

    def _call(self, call) -> list[tuple[str, dict]]:
        events = []
        if self.open is None or self.open[0] != "call" or call.index != self.call_index:
            events += self._close("completed")
            item = FunctionCallOutput(id=item_id("fc"), call_id=call.id, name=call.function.name or "",
                                      arguments="", status="in_progress")
            self.open, self.call_index = ["call", item, ""], call.index
            events.append(self._event("response.output_item.added", output_index=self._index(),
                                      item=item.model_dump()))
        item = self.open[1]
        if call.function.arguments:
            self.open[2] += call.function.arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                      output_index=self._index(), delta=call.function.arguments))
        return events

    def _close(self, status: str) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        kind, item, text = self.open
        self.open, index, events = None, self._index(), []
        if kind == "call":
            item.arguments = text
            events.append(self._event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                                      name=item.name, arguments=text))
        elif kind == "reasoning":
            part = ReasoningTextPart(text=text)
            item.content = [part]
            events.append(self._event("response.reasoning_text.done", item_id=item.id, output_index=index,
                                      content_index=0, text=text))
            events.append(self._event("response.content_part.done", item_id=item.id, output_index=index,
                                      content_index=0, part=part.model_dump()))
        else:
            part = OutputTextPart(text=text)
            item.content = [part]
            events.append(self._event("response.output_text.done", item_id=item.id, output_index=index,
                                      content_index=0, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item.id, output_index=index,
                                      content_index=0, part=part.model_dump()))
        item.status = status
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=item.model_dump()))
        return events

    def finish(self, finish_reason: str | None, response_usage: ResponseUsage, completed_at: int) \
            -> list[tuple[str, dict]]:
        status, details = finish_status(finish_reason)
        events = self._close(status)
        self.response.status, self.response.incomplete_details = status, details
        self.response.output, self.response.usage = self.output, response_usage
        self.response.completed_at = completed_at
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return events + [self._event(kind, response=self._snapshot())]

    def error(self, code: str | None, message: str, param: str | None) -> list[tuple[str, dict]]:
        return [self._event("error", code=code, message=message, param=param)]
