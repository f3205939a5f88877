"""What a chat request becomes before its prompt is rendered: the conversation the template sees, the
template's extra variables, the tool-call and reasoning formats its output is read with, and the grammar
that enforces tool calls.

Tools reach the model through the chat template when the template takes them (Qwen2/Qwen3, Llama 3),
else in the system turn in nvllm's generic format (frontend/output_parsers/tool_calls/prompt.py). tool_choice "none"
sends no tools; "auto" lets the model choose and parses what it wrote; "required" and a named function
add a grammar (frontend/output_parsers/tool_calls/grammar.py) so the output is calls the parser reads and whose
arguments match the functions' schemas. A reasoning model's constraint starts after its reasoning.
"""

import json
from dataclasses import dataclass, field

from common.errors import InvalidParameter
from common.structured_outputs import StructuredOutputsParams
from frontend.endpoints.openai_schemas.openai_fields import NO_THINKING_EFFORTS
from frontend.endpoints.serving.chat_options import ChatOptions
from frontend.output_parsers.reasoning import reasoning_parser_for_template
from frontend.output_parsers.tool_calls import (messages_for_template, template_takes_tools, tool_call_grammar,
                                                tool_parser_for_template, with_tools_in_system_turn)
from frontend.request_path import chat_template


@dataclass
class ChatPlan:
    conversation: list[dict]
    template_kwargs: dict = field(default_factory=dict)
    tool_parser: str | None = None  # read tool calls out of the output with this format
    reasoning_parser: str | None = None
    tool_constraint: StructuredOutputsParams | None = None  # required / named tool_choice


def template_text(tokenizer) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) else None


def plan_chat(body, tokenizer, options: ChatOptions) -> ChatPlan:
    """Raises InvalidParameter naming the field (a tool_choice naming no tool, special tokens in tools)."""
    template = template_text(tokenizer)
    messages = [m.for_template() for m in body.messages]
    reasoning = options.reasoning_parser or reasoning_parser_for_template(template)
    # /tokenize's chat bodies have messages only
    plan = ChatPlan(messages, dict(getattr(body, "chat_template_kwargs", None) or {}),
                    reasoning_parser=None if reasoning == "none" else reasoning)
    _apply_reasoning_effort(plan, getattr(body, "reasoning_effort", None))
    chat_request = hasattr(body, "tool_definitions")  # /tokenize's chat bodies have no tools
    tools = [t.model_dump(exclude_none=True) for t in body.tool_definitions()] if chat_request else []
    choice = body.tool_choice_option() if chat_request else None
    choice = choice.model_dump() if hasattr(choice, "model_dump") else choice
    # errors name the fields the client sent: OpenAI's deprecated names where it used them
    tools_field = "functions" if chat_request and body.functions is not None else "tools"
    choice_field = "function_call" if chat_request and body.function_call is not None else "tool_choice"
    if choice is not None and choice != "none" and not tools:
        raise InvalidParameter(choice_field, f"{choice_field} needs {tools_field}")
    takes_tools = template_takes_tools(template)
    if takes_tools:  # the template writes earlier calls as they are, outside any content
        _check_no_special_tokens(tokenizer, [m["tool_calls"] for m in messages if "tool_calls" in m], "messages")
    plan.conversation = messages_for_template(messages, takes_tools)
    if not tools or choice == "none":
        return plan
    _check_no_special_tokens(tokenizer, tools, tools_field)
    plan.tool_parser = options.tool_call_parser or tool_parser_for_template(template)
    if takes_tools:
        plan.template_kwargs["tools"] = tools
    else:
        plan.conversation = with_tools_in_system_turn(plan.conversation, tools)
    if choice not in (None, "auto"):
        try:
            parallel = body.parallel_tool_calls and not body.legacy_functions  # a function_call is one call
            grammar = tool_call_grammar(tools, choice, parallel, plan.tool_parser)
        except ValueError as e:
            raise InvalidParameter(choice_field, f"{choice_field}: {e}") from None
        plan.tool_constraint = StructuredOutputsParams(grammar=grammar)
    return plan


def _apply_reasoning_effort(plan: ChatPlan, effort: str | None) -> None:
    """OpenAI's reasoning_effort onto the template: its own variable of that name (templates such as gpt-oss
    read it) and, on a reasoning model, the thinking switch (Qwen3's enable_thinking). chat_template_kwargs,
    the explicit form, wins where both set a variable."""
    if effort is None:
        return
    plan.template_kwargs.setdefault("reasoning_effort", effort)
    if plan.reasoning_parser is not None:
        plan.template_kwargs.setdefault("enable_thinking", effort not in NO_THINKING_EFFORTS)


def _check_no_special_tokens(tokenizer, value, field_name: str) -> None:
    """Tool definitions go into the prompt through the template as they are: special-token text in them
    would open turns of its own."""
    text = json.dumps(value, ensure_ascii=False)
    for special in chat_template.special_token_texts(tokenizer):
        if special in text:
            raise InvalidParameter(field_name, f"{field_name} holds the special token text {special!r}")
