"""The body of a Responses API answer (`POST /v1/responses`), whole or as the `response` of a stream's
lifecycle events: output items (reasoning, message, function_call), `status` completed or incomplete, the
request's settings echoed, and usage in input/output tokens."""

import time
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from frontend.endpoints.responses.schemas import FunctionTool, NamedFunctionChoice, ReasoningConfig, TextConfig

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []
    logprobs: list = []


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart]


class ReasoningTextPart(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list = []
    content: list[ReasoningTextPart]
    status: ItemStatus


class FunctionCallOutput(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = Annotated[ReasoningItem | OutputMessage | FunctionCallOutput, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV came from the prefix cache")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="output tokens up to the end of the reasoning")


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: ReasoningConfig | None = None
    store: bool = False
    temperature: float | None = None
    text: TextConfig
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice = "auto"
    tools: list[FunctionTool] = []
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None
    service_tier: str = "default"
