"""What the tool-call parsers return: parsed calls, and the deltas a streaming parser emits.

`ToolCall.arguments` is a string, the JSON text of the arguments object exactly as the model wrote it
(OpenAI's `function.arguments` is a string too), so the pieces a streaming parser sends join to it.
"""

import secrets
from dataclasses import dataclass, field


def new_call_id() -> str:
    """`call_` and 24 random hex digits, the shape OpenAI's ids have."""
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedToolCalls:
    content: str | None  # text outside the calls, stripped; None when there is none
    calls: list[ToolCall]


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallDelta:
    """A piece of call `index`: the first piece of a call has `id` and `name` set (its arguments may be
    empty); the later ones carry only argument text."""
    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


ToolParserEvent = ContentDelta | ToolCallDelta
