"""A chat choice's text read into what OpenAI's chat API returns: reasoning_content, content and
tool_calls, whole or as deltas.

The reasoning parser runs first (a `<think>` section), then the tool-call parser reads the content that
is left. Streamed pieces join to what the whole text gives (the parsers guarantee it for any split),
except a call that turns out broken after its first pieces went out: the stream has sent it, the whole
response leaves its text in the content instead.
"""

from dataclasses import dataclass, field

from frontend.endpoints.openai_schemas.tool_schemas import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from frontend.output_parsers.reasoning import reasoning_parser
from frontend.output_parsers.tool_calls import ContentDelta, tool_parser


@dataclass
class ChatText:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list = field(default_factory=list)  # ToolCall (whole) or DeltaToolCall (a delta)


class ChatOutputReader:
    """One choice's reader; `read` each text delta, the last one with last=True."""

    def __init__(self, tool_format: str | None, reasoning_format: str | None, starts_in_reasoning: bool):
        self.tools = tool_parser(tool_format)() if tool_format else None
        self.reasoning = reasoning_parser(reasoning_format)(starts_in_reasoning) if reasoning_format else None
        self.called = False  # a call went out: the choice finishes with "tool_calls"

    @property
    def plain(self) -> bool:
        return self.tools is None and self.reasoning is None

    def read(self, text: str, last: bool = False) -> ChatText:
        if self.plain:
            return ChatText(content=text)
        if self.reasoning is None:
            return self._content(None, text, last)
        reasoning, content = self.reasoning.feed(text)
        if last:  # what the reasoning parser held back (a marker that may have been starting)
            more_reasoning, more_content = self.reasoning.finish()
            reasoning, content = _join(reasoning, more_reasoning), _join(content, more_content)
        return self._content(reasoning, content, last)

    def _content(self, reasoning: str | None, content: str | None, final: bool) -> ChatText:
        if self.tools is None:
            return ChatText(reasoning, content)
        events = self.tools.feed(content) if content else []
        if final:
            events += self.tools.finish()
        out = ChatText(reasoning)
        for e in events:
            if isinstance(e, ContentDelta):
                out.content = (out.content or "") + e.text
            else:
                self.called = True
                out.tool_calls.append(DeltaToolCall(index=e.index, id=e.id, type="function" if e.id else None,
                                                    function=DeltaFunctionCall(name=e.name, arguments=e.arguments)))
        return out


def _join(a: str | None, b: str | None) -> str | None:
    return None if a is None and b is None else (a or "") + (b or "")


def read_whole(text: str, tool_format: str | None, reasoning_format: str | None,
               starts_in_reasoning: bool) -> ChatText:
    """The whole text at once: reasoning, content and the calls that parsed."""
    reasoning, content = (reasoning_parser(reasoning_format).split(text, starts_in_reasoning)
                          if reasoning_format else (None, text))
    if not tool_format:
        return ChatText(reasoning, content)
    parsed = tool_parser(tool_format).parse(content or "")
    calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in parsed.calls]
    return ChatText(reasoning, parsed.content, calls)


def finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI says "tool_calls" when a choice ended (not cut by length) with calls."""
    return "tool_calls" if called and reason == "stop" else reason


def legacy_finish_reason(reason: str | None) -> str | None:
    """What OpenAI says for a call made through the deprecated `functions`."""
    return "function_call" if reason == "tool_calls" else reason
