"""What a chat request becomes before rendering (frontend/endpoints/chat/plan.py) and how its output is read
(frontend/endpoints/chat/output.py), on the default model's tokenizer and template."""

import pytest

from common.errors import InvalidParameter
from common.structured_outputs import StructuredOutputsParams
from frontend.endpoints.serving.chat_options import ChatOptions
from frontend.endpoints.chat.output import ChatOutputReader, finish_reason, read_whole
from frontend.endpoints.chat.constraint import with_constraint_after_reasoning
from frontend.endpoints.chat.plan import plan_chat
from frontend.endpoints.chat.schemas import ChatCompletionRequest

pytestmark = pytest.mark.unit

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast.from_pretrained(default_model_dir)


def body(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=kw.pop("messages", [{"role": "user", "content": "hi"}]), **kw)


def test_tools_go_into_the_system_turn_of_a_template_without_tools(tokenizer):
    plan = plan_chat(body(tools=[WEATHER]), tokenizer, ChatOptions())
    assert plan.tool_parser == "generic" and plan.tool_constraint is None and "tools" not in plan.template_kwargs
    assert plan.conversation[0]["role"] == "system" and "get_weather" in plan.conversation[0]["content"]
    none = plan_chat(body(tools=[WEATHER], tool_choice="none"), tokenizer, ChatOptions())
    assert none.tool_parser is None and none.conversation == [{"role": "user", "content": "hi"}]


def test_required_and_named_choices_get_a_grammar_and_a_bad_name_is_refused(tokenizer):
    plan = plan_chat(body(tools=[WEATHER], tool_choice="required"), tokenizer, ChatOptions(tool_call_parser="hermes"))
    assert plan.tool_parser == "hermes" and "<tool_call>" in plan.tool_constraint.grammar
    with pytest.raises(InvalidParameter) as e:
        plan_chat(body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), tokenizer,
                  ChatOptions())
    assert e.value.param == "tool_choice" and "nope" in str(e.value)
    with pytest.raises(InvalidParameter):
        plan_chat(body(tool_choice="required"), tokenizer, ChatOptions())


def test_a_constraint_starts_after_the_reasoning_unless_the_prompt_closed_it(tokenizer):
    plan = plan_chat(body(), tokenizer, ChatOptions(reasoning_parser="qwen3"))
    schema = StructuredOutputsParams(json={"type": "object"})
    after = with_constraint_after_reasoning(schema, plan, "<|im_start|>assistant\n", tokenizer)
    assert after.json == schema.json and tokenizer.decode(after.starts_after_token_ids) == "</think>"
    closed = with_constraint_after_reasoning(schema, plan, "assistant\n<think>\n\n</think>\n\n", tokenizer)
    assert closed.starts_after_token_ids == []
    spelled = StructuredOutputsParams(grammar='start: "<think>" /[a-z]+/ "</think>" /[a-z]+/')
    assert with_constraint_after_reasoning(spelled, plan, "x", tokenizer).starts_after_token_ids == []
    off = plan_chat(body(), tokenizer, ChatOptions(reasoning_parser="none"))
    assert with_constraint_after_reasoning(schema, off, "x", tokenizer) is schema


def test_reading_whole_and_streamed_agree():
    text = '<think>plan it</think>Sure.<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>'
    whole = read_whole(text, "generic", "qwen3", False)
    assert (whole.reasoning, whole.content) == ("plan it", "Sure.")
    assert [(c.function.name, c.function.arguments) for c in whole.tool_calls] == [("get_weather", '{"city": "Oslo"}')]
    reader = ChatOutputReader("generic", "qwen3", False)
    cuts = list(range(0, len(text), 3))
    pieces = [reader.read(text[i:i + 3], last=i == cuts[-1]) for i in cuts]
    assert "".join(p.reasoning or "" for p in pieces) == "plan it"
    assert "".join(p.content or "" for p in pieces) == "Sure."
    calls = [d for p in pieces for d in p.tool_calls]
    assert calls[0].function.name == "get_weather" and "".join(d.function.arguments for d in calls) == '{"city": "Oslo"}'
    assert finish_reason("stop", reader.called) == "tool_calls" and finish_reason("length", True) == "length"
    plain = ChatOutputReader(None, None, False)
    assert plain.plain and plain.read(" raw ").content == " raw "


def test_reasoning_effort_is_the_thinking_switch_of_a_reasoning_template(tokenizer):
    thinks = ChatOptions(reasoning_parser="qwen3")
    assert plan_chat(body(reasoning_effort="none"), tokenizer, thinks).template_kwargs == \
        {"reasoning_effort": "none", "enable_thinking": False}
    assert plan_chat(body(reasoning_effort="minimal"), tokenizer, thinks).template_kwargs["enable_thinking"] is False
    assert plan_chat(body(reasoning_effort="high"), tokenizer, thinks).template_kwargs["enable_thinking"] is True
    explicit = body(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert plan_chat(explicit, tokenizer, thinks).template_kwargs["enable_thinking"] is True  # the explicit form wins
    # a model that does not reason: only the template variable, which such a template does not read
    assert plan_chat(body(reasoning_effort="high"), tokenizer, ChatOptions(reasoning_parser="none")).template_kwargs == \
        {"reasoning_effort": "high"}
    assert plan_chat(body(), tokenizer, thinks).template_kwargs == {}


def test_deprecated_functions_become_tools_and_errors_name_the_fields_sent(tokenizer):
    legacy = body(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    plan = plan_chat(legacy, tokenizer, ChatOptions())
    assert plan.tool_constraint is not None and "get_weather" in plan.conversation[0]["content"]
    with pytest.raises(InvalidParameter) as e:
        plan_chat(body(function_call={"name": "get_weather"}), tokenizer, ChatOptions())
    assert e.value.param == "function_call"
    with pytest.raises(InvalidParameter) as e:
        plan_chat(body(functions=[WEATHER["function"]], tools=[WEATHER]), tokenizer, ChatOptions())
    assert e.value.param == "functions"
