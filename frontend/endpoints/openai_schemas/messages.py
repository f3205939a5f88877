"""Chat messages as OpenAI's API shapes them, one model per role, so that a history kept as the openai
client's own objects (`resp.choices[0].message.model_dump()`) is accepted as it comes back.

Beyond what a template reads, an assistant turn may carry `refusal` (given to the model as the turn's text
when it has no content), `annotations` (citations OpenAI attaches; nothing to render), `audio: null`, and
the deprecated `function_call`; the deprecated `function` role is a tool result. Refused with a 400 naming
the part: images, audio and files in a user turn (nvllm serves text-only models) and an assistant turn's
`audio` reference (no audio answer was ever given here to refer to).
"""

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most, null_only
from frontend.endpoints.openai_schemas.tool_schemas import MAX_TOOLS, FunctionCall, ToolCall

MAX_CONTENT_PARTS = 256  # parts of one message's content

# the content parts OpenAI defines that a text-only model cannot take, and why
UNSUPPORTED_PARTS = {
    "image_url": "image input is not supported: nvllm serves text-only models",
    "input_audio": "audio input is not supported: nvllm serves text-only models",
    "file": "file input is not supported: send the file's text as a text part",
}


def part_refuser(unsupported: dict[str, str]):
    """A before-validator that refuses a content part whose type is in `unsupported`, saying why (a 400 naming
    the part), before pydantic tries the union of parts this API does take."""
    def refuse(value):
        kind = value.get("type") if isinstance(value, dict) else None
        if kind in unsupported:
            raise PydanticCustomError("unsupported", unsupported[kind])
        return value
    return refuse


class TextContentPart(StrictModel):
    type: Literal["text"]
    text: Text


class RefusalContentPart(StrictModel):
    type: Literal["refusal"]
    refusal: Text


UserPart = Annotated[TextContentPart, BeforeValidator(part_refuser(UNSUPPORTED_PARTS))]
AssistantPart = Annotated[TextContentPart | RefusalContentPart, Field(discriminator="type")]


def _parts(part_type):
    return Annotated[list[part_type], at_most(MAX_CONTENT_PARTS, "content")]


def _joined(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.text if isinstance(p, TextContentPart) else p.refusal for p in content)
    return content or ""


class _Message(StrictModel):
    def text(self) -> str:
        return _joined(getattr(self, "content", None))

    def for_template(self) -> dict:
        """The message as helpers and templates take it: OpenAI's shape with text content."""
        out = {"role": self.role, "content": self.text()}
        name = getattr(self, "name", None)
        if name is not None:
            out["name"] = name
        return out


class SystemMessage(_Message):
    role: Literal["system"]
    content: Text | _parts(TextContentPart)
    name: Text | None = None


class DeveloperMessage(SystemMessage):
    """OpenAI's newer name for the system turn; templates see it as system."""
    role: Literal["developer"]

    def for_template(self) -> dict:
        return dict(super().for_template(), role="system")


class UserMessage(_Message):
    role: Literal["user"]
    content: Text | _parts(UserPart)
    name: Text | None = None


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Text | _parts(AssistantPart) | None = None
    refusal: Text | None = Field(None, description="a refusal the model gave; its text when there is no content")
    name: Text | None = None
    tool_calls: Annotated[list[ToolCall] | None, at_most(MAX_TOOLS, "tool_calls")] = Field(
        None, description="the calls this turn made")
    function_call: FunctionCall | None = Field(None, description="deprecated by OpenAI for tool_calls; one call")
    audio: Annotated[dict[str, Any] | None, null_only(
        "an earlier audio answer cannot be referred to: nvllm gives text answers only (send audio: null or leave "
        "it out)")] = Field(
        None, description="OpenAI's reference to an audio answer; null only")
    annotations: list[dict[str, Any]] | None = Field(None, description="citations OpenAI attaches; ignored")
    reasoning_content: Text | None = Field(None, description="this turn's reasoning (not sent to the model)")

    def text(self) -> str:
        return _joined(self.content) or self.refusal or ""

    def for_template(self) -> dict:
        out = super().for_template()
        calls = [c.model_dump() for c in self.tool_calls or []]
        if self.function_call is not None:
            calls.append({"id": f"call_{len(calls)}", "type": "function", "function": self.function_call.model_dump()})
        if calls:
            out["tool_calls"] = calls
        return out


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Text | _parts(TextContentPart)
    tool_call_id: Text = Field(description="the call this result answers")
    name: Text | None = Field(None, description="the function's name (some clients send it; templates may read it)")

    def for_template(self) -> dict:
        return dict(super().for_template(), tool_call_id=self.tool_call_id)


class FunctionMessage(_Message):
    """Deprecated by OpenAI for tool messages: a function's result, named by the function."""
    role: Literal["function"]
    content: Text | None
    name: Text

    def for_template(self) -> dict:
        return dict(super().for_template(), role="tool")


ChatMessage = Annotated[SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage
                        | FunctionMessage, Field(discriminator="role")]
