"""Tool-call and reasoning parsing (frontend/output_parsers/tool_calls, frontend/output_parsers/reasoning.py):
one-shot results, the streaming invariant (any split into deltas joins to the one-shot result), template
detection, the generic format's prompt and history, and the llguidance grammars that force calls."""

import json
import os
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from frontend.output_parsers.reasoning import (DeepSeekR1ReasoningParser, Qwen3ReasoningParser, prompt_opens_reasoning,
                                               reasoning_parser, reasoning_parser_for_template)
from frontend.output_parsers.tool_calls import (ContentDelta, GenericToolParser, HermesToolParser, Llama3JsonToolParser,
                                                ToolCallDelta, messages_for_template, render_tools_system_prompt,
                                                template_takes_tools, tool_call_grammar, tool_parser,
                                                tool_parser_for_template, with_tools_in_system_turn)

pytestmark = pytest.mark.unit

PARSERS = [HermesToolParser, Llama3JsonToolParser, GenericToolParser]
HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- helpers --

def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def stream(parser_cls, pieces: list[str]):
    """(content or None, [(name, arguments)], parser) from streaming `pieces`; checks the delta shapes."""
    parser = parser_cls()
    events = [ev for piece in pieces for ev in parser.feed(piece)] + parser.finish()
    content, calls = "", []
    for ev in events:
        if isinstance(ev, ContentDelta):
            content += ev.text
        else:
            assert isinstance(ev, ToolCallDelta)
            if ev.id is not None:  # the first delta of a call
                assert ev.index == len(calls) and ev.name and ev.id.startswith("call_") and len(ev.id) == 29
                assert ev.to_openai()["type"] == "function"
                calls.append([ev.name, ev.arguments])
            else:
                assert ev.index == len(calls) - 1 and "id" not in ev.to_openai()
                calls[-1][1] += ev.arguments
    return content or None, [tuple(c) for c in calls], parser


def one_shot(parser_cls, text: str):
    parsed = parser_cls.parse(text)
    return parsed.content, [(c.name, c.arguments) for c in parsed.calls]


def assert_parses_whole_and_split(parser_cls, text: str, cuts, expected) -> None:
    """`text` parses to `expected` (content, calls) in one piece and streamed split at `cuts`, unbroken."""
    assert one_shot(parser_cls, text) == expected
    streamed_content, streamed_calls, parser = stream(parser_cls, split_at(text, cuts))
    assert (streamed_content, streamed_calls) == expected and not parser.broken


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_.-]{0,12}", fullmatch=True)
json_styles = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"ensure_ascii": False}])
# text with the characters and marker fragments that could confuse a parser
prose = st.lists(st.text(max_size=6) | st.sampled_from(
    ["<", "<tool", "</tool_call>", "{", "}", "[", ";", "\n", " ", '"', "<|python", "<think", "</thi"]),
    max_size=6).map("".join)
cuts = st.lists(st.integers(0, 400), max_size=12)


@st.composite
def calls_st(draw, max_calls=3):
    out = []
    for _ in range(draw(st.integers(1, max_calls))):
        style = draw(json_styles)
        out.append((draw(names), json.dumps(draw(arguments), **style), style))
    return out


def call_json(name: str, args: str, style: dict, key: str = "arguments") -> str:
    """The call object as a model would write it, compact when its arguments are."""
    sep, colon = (",", ":") if "separators" in style else (", ", ": ")
    return "{" + f'"name"{colon}{json.dumps(name)}{sep}"{key}"{colon}{args}' + "}"


# -- hermes --

MALFORMED_HERMES = [
    "<tool_call>\nnot json\n</tool_call>",
    '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
    '<tool_call>\n{name: "f", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
    '<tool_call>\n{"name": "f" "arguments": {}}\n</tool_call>',
]


def tagged_texts(draw, max_pieces: int, kinds: list[str], malformed: list[str], block) -> tuple:
    """(text, expected content, expected calls): prose, malformed blocks (content) and the blocks
    block(draw, kind) writes, returning (text, [(name, arguments)])."""
    text, content, expected, blocks = "", "", [], 0
    for _ in range(draw(st.integers(0, max_pieces))):
        kind = draw(st.sampled_from(["prose", "malformed", *kinds]))
        blocks += kind != "prose"
        if kind in ("prose", "malformed"):
            piece = draw(prose) if kind == "prose" else draw(st.sampled_from(malformed))
            content += piece
        else:
            piece, calls = block(draw, kind)
            expected += calls
        text += piece
    assume(text.count("<tool_call>") == blocks)  # prose did not spell a tag
    return text, content.strip() or None, expected


def _hermes_block(draw, kind):
    name, args, style = draw(calls_st(max_calls=1))[0]
    return "<tool_call>\n" + call_json(name, args, style) + "\n</tool_call>", [(name, args)]


@st.composite
def hermes_texts(draw):
    return tagged_texts(draw, 4, ["call"], MALFORMED_HERMES, _hermes_block)


@HYPOTHESIS
@given(case=hermes_texts(), cuts=cuts)
def test_hermes_one_shot_and_any_split(case, cuts):
    text, content, calls = case
    assert_parses_whole_and_split(HermesToolParser, text, cuts, (content, calls))


def test_hermes_examples():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": "}"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n')
    assert one_shot(HermesToolParser, text) == ("Let me look.", [
        ("get_weather", '{"city": "Paris", "x": "}"}'), ("now", "{}")])
    # only whitespace outside the calls: no content
    assert one_shot(HermesToolParser, '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\n')[0] is None
    # arguments first, or none at all
    assert one_shot(HermesToolParser, '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>')[1] == [
        ("f", '{"a": 1}')]
    assert one_shot(HermesToolParser, '<tool_call>{"name": "f"}</tool_call>')[1] == [("f", "{}")]
    # the closing tag may be missing at the very end (a stop string)
    assert one_shot(HermesToolParser, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')[1] == [("f", '{"a": 1}')]
    assert one_shot(HermesToolParser, "no calls here") == ("no calls here", [])


def test_hermes_streams_arguments_as_they_arrive_and_holds_partial_tags():
    parser = HermesToolParser()
    assert parser.feed("Sure<tool_c") == [ContentDelta("Sure")]  # "<tool_c" held back
    assert parser.feed('all>\n{"name": "f", "argu') == []
    first = parser.feed('ments": {"city": "Pa')
    assert len(first) == 1 and first[0].name == "f" and first[0].arguments == '{"city": "Pa'
    assert [e.arguments for e in parser.feed('ris"}')] == ['ris"}']
    assert parser.feed("}\n</tool_call>") == [] and parser.finish() == []
    # a held partial tag that never completes is content after all
    parser = HermesToolParser()
    assert parser.feed("a <tool_c") == [ContentDelta("a")]
    assert parser.finish() == [ContentDelta(" <tool_c")]


def test_call_broken_after_commit_is_streamed_but_not_parsed():
    """Documented divergence: the call was already sent when the output broke off inside it."""
    text = 'Hi <tool_call>\n{"name": "f", "arguments": {"a": [1, 2'
    content, calls, parser = stream(HermesToolParser, [text])
    assert (content, calls) == ("Hi", [("f", '{"a": [1, 2')]) and parser.broken
    assert one_shot(HermesToolParser, text) == (text, [])
    # not JSON after all: the same
    text = '<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call> after'
    assert stream(HermesToolParser, [text])[:2] == ("after", [("f", '{"a": tru}')])
    assert one_shot(HermesToolParser, text) == (text, [])


# -- llama3_json --

@st.composite
def llama3_texts(draw):
    calls = draw(calls_st())
    key = draw(st.sampled_from(["parameters", "arguments"]))
    seps = [draw(st.sampled_from(["; ", ";", ";\n", " ; ", "\n"])) for _ in calls]
    text = draw(st.sampled_from(["", "<|python_tag|>", " \n<|python_tag|>", "\n"]))
    text += "".join(call_json(n, a, s, key) + (sep if i + 1 < len(calls) else "")
                    for i, ((n, a, s), sep) in enumerate(zip(calls, seps)))
    tail = draw(st.sampled_from(["", ";", "\n", " trailing words", "\nthen {more}"]))
    content = tail.strip() if tail.strip() not in ("", ";") else None
    return text + tail, content, [(n, a) for n, a, _ in calls]


@HYPOTHESIS
@given(case=llama3_texts(), cuts=cuts)
def test_llama3_one_shot_and_any_split(case, cuts):
    text, content, calls = case
    assert_parses_whole_and_split(Llama3JsonToolParser, text, cuts, (content, calls))


@HYPOTHESIS
@given(text=prose, cuts=cuts)
def test_llama3_output_not_starting_with_a_call_is_all_content(text, cuts):
    assume(not text.lstrip().startswith(("{", "<|python_tag|>")))
    assert_parses_whole_and_split(Llama3JsonToolParser, text, cuts, (text.strip() or None, []))


def test_llama3_examples():
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}'
    assert one_shot(Llama3JsonToolParser, text) == (None, [("get_weather", '{"city": "Paris"}'), ("now", "{}")])
    assert one_shot(Llama3JsonToolParser, 'The answer is {"a": 1}') == ('The answer is {"a": 1}', [])
    assert one_shot(Llama3JsonToolParser, '{"city": "Paris"}') == ('{"city": "Paris"}', [])  # no name
    assert one_shot(Llama3JsonToolParser, '{"name": "f", "parameters": {}}; oops') == ("; oops", [("f", "{}")])


# -- generic --

MALFORMED_GENERIC = ["<tool_call>not a list</tool_call>", '<tool_call>[{"arguments": {}}]</tool_call>',
                     '<tool_call>[1, 2]</tool_call>', '<tool_call>["f"]</tool_call>']


def _generic_block(draw, kind):
    if kind == "empty":
        return "<tool_call>[]</tool_call>", []
    calls = draw(calls_st()) if kind == "list" else draw(calls_st(max_calls=1))
    sep = draw(st.sampled_from([", ", ",", ",\n"]))
    body = sep.join(call_json(n, a, s) for n, a, s in calls)
    return "<tool_call>" + (f"[{body}]" if kind == "list" else body) + "</tool_call>", [(n, a) for n, a, _ in calls]


@st.composite
def generic_texts(draw):
    return tagged_texts(draw, 3, ["list", "single", "empty"], MALFORMED_GENERIC, _generic_block)


@HYPOTHESIS
@given(case=generic_texts(), cuts=cuts)
def test_generic_one_shot_and_any_split(case, cuts):
    text, content, calls = case
    assert_parses_whole_and_split(GenericToolParser, text, cuts, (content, calls))


def test_generic_examples():
    text = 'On it. <tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]</tool_call>'
    assert one_shot(GenericToolParser, text) == ("On it.", [("a", '{"x": 1}'), ("b", "{}")])
    assert one_shot(GenericToolParser, '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>') == (
        None, [("a", '{"x": 1}')])
    assert one_shot(GenericToolParser, "<tool_call>[]</tool_call>") == (None, [])


# -- every parser, any text --

FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_c", "{", "}", '"name"', '"arguments"', '"parameters"', ": ", ", ",
             '"f"', "[", "]", ";", "\n", " ", "<|python_tag|>", '"', "\\", "1", "x", "{}"]


@HYPOTHESIS
@given(parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=30), cuts=cuts,
       parser_cls=st.sampled_from(PARSERS))
def test_streaming_does_not_depend_on_the_split(parts, cuts, parser_cls):
    text = "".join(parts)
    whole = stream(parser_cls, [text])
    split = stream(parser_cls, split_at(text, cuts))
    assert split[:2] == whole[:2]
    if not whole[2].broken:
        assert one_shot(parser_cls, text) == whole[:2]


def test_registry():
    assert tool_parser("hermes") is HermesToolParser and tool_parser("generic") is GenericToolParser
    assert tool_parser("llama3_json") is Llama3JsonToolParser
    with pytest.raises(ValueError, match="generic, hermes, llama3_json"):
        tool_parser("mistral")


# -- templates --

# Minimal templates in the style of the real ones (written for these tests, not copied).
QWEN25_TEMPLATE = """{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each function call, return a json object within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

QWEN3_TEMPLATE = QWEN25_TEMPLATE.replace("""{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}""", """{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}
{%- endif %}""").replace("{{ message.content }}{% endif %}", "{{ message.content }}{% endif %}{# <think> kept #}")

THINKING_TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"""

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if tools is not none %}<|start_header_id|>user<|end_header_id|>

Given the following functions, respond with a JSON for a function call with its proper arguments.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{%- for t in tools %}
{{ t | tojson(indent=4) }}
{%- endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}
{%- if message.tool_calls %}
{%- set tool_call = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ tool_call.name }}", "parameters": {{ tool_call.arguments | tojson }}}<|eot_id|>
{%- elif message.role == "tool" %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


@pytest.fixture(scope="module")
def smollm_template(default_model_dir):
    with open(os.path.join(default_model_dir, "chat_template.jinja")) as f:
        return f.read()


@pytest.fixture(scope="module")
def hf_tokenizer(default_model_dir):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


def test_choosing_from_the_template(smollm_template):
    assert tool_parser_for_template(QWEN25_TEMPLATE) == "hermes" and template_takes_tools(QWEN25_TEMPLATE)
    assert tool_parser_for_template(QWEN3_TEMPLATE) == "hermes"
    assert tool_parser_for_template(LLAMA31_TEMPLATE) == "llama3_json" and template_takes_tools(LLAMA31_TEMPLATE)
    assert tool_parser_for_template(LLAMA31_TEMPLATE + "<|python_tag|>") == "llama3_json"
    assert tool_parser_for_template(smollm_template) == "generic" and not template_takes_tools(smollm_template)
    assert tool_parser_for_template(None) == "generic" and not template_takes_tools(None)
    assert not template_takes_tools(THINKING_TEMPLATE)
    # reasoning
    assert reasoning_parser_for_template(smollm_template) is None
    assert reasoning_parser_for_template(QWEN25_TEMPLATE) is None
    assert reasoning_parser_for_template(QWEN3_TEMPLATE) == "qwen3"
    assert reasoning_parser_for_template(THINKING_TEMPLATE) == "deepseek_r1"


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"], "properties": {
            "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["a", "b"], "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999},
            "b": {"type": "integer", "minimum": 0, "maximum": 999}}}}},
    {"type": "function", "function": {"name": "ping", "description": "Checks the service."}},
]

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 degrees."},
    {"role": "user", "content": "And 2+3, and ping?"},
    {"role": "assistant", "content": "Both:", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_3", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "pong"}]},
]


def test_generic_prompt_is_stable_and_lists_the_tools():
    text = render_tools_system_prompt(TOOLS)
    assert text == render_tools_system_prompt(json.loads(json.dumps(TOOLS)))
    listed = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
    assert [f["name"] for f in listed] == ["get_weather", "add", "ping"]
    assert listed[2]["parameters"] == {"type": "object", "properties": {}}
    assert '<tool_call>[{"name": "function name", "arguments": {"argument name": "value"}}]</tool_call>' in text
    # into the first system message, or a new one in front
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    out = with_tools_in_system_turn(msgs, TOOLS)
    assert out[0]["content"] == text + "\n\nBe brief." and msgs[0]["content"] == "Be brief." and out[1] is msgs[1]
    out = with_tools_in_system_turn(msgs[1:], TOOLS)
    assert out[0] == {"role": "system", "content": text} and out[1:] == msgs[1:]


def test_history_for_a_template_without_tools(hf_tokenizer, smollm_template):
    msgs = messages_for_template(HISTORY, takes_tools=False)
    assert msgs[1] == {"role": "assistant",
                       "content": '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'}
    assert msgs[2] == {"role": "user",
                       "content": '<tool_response>{"name": "get_weather", "content": "{\\"temp\\": 21}"}</tool_response>'}
    assert msgs[5]["content"].startswith("Both:\n<tool_call>[")
    assert msgs[6]["content"] == ('<tool_response>{"name": "add", "content": "5"}</tool_response>\n'
                                  '<tool_response>{"name": "ping", "content": "pong"}</tool_response>')
    assert len(msgs) == 7 and all("tool_calls" not in m for m in msgs)
    # the assistant turns read back as the calls they were
    parsed = GenericToolParser.parse(msgs[5]["content"])
    assert parsed.content == "Both:" and [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("add", {"a": 2, "b": 3}), ("ping", {})]
    prompt = hf_tokenizer.apply_chat_template(with_tools_in_system_turn(msgs, TOOLS), tokenize=False,
                                              add_generation_prompt=True, chat_template=smollm_template)
    assert prompt.startswith("<|im_start|>system\n# Tools") and "named SmolLM" not in prompt
    assert "<tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_history_for_templates_that_take_tools(hf_tokenizer):
    msgs = messages_for_template(HISTORY, takes_tools=True)
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # input untouched
    assert msgs[7]["content"] == "pong" and msgs[7]["name"] == "ping"
    prompt = hf_tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True,
                                              chat_template=QWEN25_TEMPLATE)
    # the template writes the calls in the hermes format, which reads back as the same calls
    turn = prompt.split("<|im_start|>assistant")[3].split("<|im_end|>")[0]
    parsed = HermesToolParser.parse(turn)
    assert parsed.content == "Both:" and [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("add", {"a": 2, "b": 3}), ("ping", {})]
    prompt = hf_tokenizer.apply_chat_template(msgs[:3], tools=TOOLS, tokenize=False, chat_template=LLAMA31_TEMPLATE)
    turn = prompt.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    assert one_shot(Llama3JsonToolParser, turn) == (None, [("get_weather", '{"city": "Paris"}')])


# -- grammars --

@pytest.fixture(scope="module")
def ll_tokenizer(default_model_dir):
    llguidance = pytest.importorskip("llguidance")
    with open(os.path.join(default_model_dir, "tokenizer.json")) as f:
        return llguidance.LLTokenizer(f.read(), n_vocab=49152, eos_token=2)


FORMATS = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser, "generic": GenericToolParser}
CHOICES = ["required", {"type": "function", "function": {"name": "add"}}]


def matcher_for(ll_tokenizer, grammar):
    import llguidance
    return llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)


def accepts(ll_tokenizer, grammar, text) -> bool:
    m = matcher_for(ll_tokenizer, grammar)
    return m.consume_tokens(ll_tokenizer.tokenize_str(text)) and m.is_accepting()


def formatted(fmt: str, calls: list[str]) -> str:
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)
    if fmt == "llama3_json":
        return "; ".join(c.replace('"arguments"', '"parameters"') for c in calls)
    return "<tool_call>[" + ", ".join(calls) + "]</tool_call>"


ADD = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
PING = '{"name": "ping", "arguments": {"anything": [1]}}'


@pytest.mark.parametrize("fmt", FORMATS)
def test_grammar_admits_well_formed_calls_only(ll_tokenizer, fmt):
    import llguidance
    for choice in CHOICES:
        for parallel in (False, True):
            assert llguidance.LLMatcher.validate_grammar(tool_call_grammar(TOOLS, choice, parallel, fmt)) == ""
    required = tool_call_grammar(TOOLS, "required", True, fmt)
    for calls in ([ADD], [WEATHER], [PING], [ADD, WEATHER, PING]):
        text = formatted(fmt, calls)
        assert accepts(ll_tokenizer, required, text), text
        assert [c.name for c in FORMATS[fmt].parse(text).calls] == [json.loads(c)["name"] for c in calls]
    for bad in ['{"name": "sub", "arguments": {"a": 2, "b": 3}}',  # unknown function
                '{"name": "add", "arguments": {"a": "2", "b": 3}}',  # wrong type
                '{"name": "add", "arguments": {"a": 2}}',  # missing required argument
                '{"name": "get_weather", "arguments": {"a": 2, "b": 3}}']:  # another function's arguments
        assert not accepts(ll_tokenizer, required, formatted(fmt, [bad])), bad
    assert not accepts(ll_tokenizer, required, "Sure! " + formatted(fmt, [ADD]))
    single = tool_call_grammar(TOOLS, "required", False, fmt)
    assert accepts(ll_tokenizer, single, formatted(fmt, [ADD]))
    assert not accepts(ll_tokenizer, single, formatted(fmt, [ADD, ADD]))
    named = tool_call_grammar(TOOLS, CHOICES[1], True, fmt)
    assert accepts(ll_tokenizer, named, formatted(fmt, [ADD]))
    assert not accepts(ll_tokenizer, named, formatted(fmt, [WEATHER]))


def test_grammar_keeps_a_schemas_defs_at_its_root(ll_tokenizer):
    tools = [{"type": "function", "function": {"name": "move", "parameters": {
        "$defs": {"point": {"type": "object", "required": ["x"], "additionalProperties": False,
                            "properties": {"x": {"type": "integer"}}}},
        "type": "object", "required": ["to"], "properties": {"to": {"$ref": "#/$defs/point"}}}}}]
    grammar = tool_call_grammar(tools, "required", False, "hermes")
    assert accepts(ll_tokenizer, grammar, formatted("hermes", ['{"name": "move", "arguments": {"to": {"x": 1}}}']))
    assert not accepts(ll_tokenizer, grammar, formatted("hermes", ['{"name": "move", "arguments": {"to": {"y": 1}}}']))


def test_grammar_errors():
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "nope"}}, False, "hermes")
    with pytest.raises(ValueError, match="auto"):
        tool_call_grammar(TOOLS, "auto", False, "hermes")
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_grammar([], "required", False, "hermes")
    with pytest.raises(ValueError, match="unknown tool call format"):
        tool_call_grammar(TOOLS, "required", False, "xml")


def random_walk(ll_tokenizer, grammar, seed, eos_after=20, max_tokens=300) -> str | None:
    """Samples uniformly among the tokens the grammar allows; EOS as soon as it is allowed after
    `eos_after` steps. The text, or None if it did not finish."""
    import numpy as np
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
    rng = np.random.default_rng(seed)
    m = matcher_for(ll_tokenizer, grammar)
    mask = allocate_token_bitmask(1, 49152)
    tokens = []
    for step in range(max_tokens):
        fill_next_token_bitmask(m, mask)
        allowed = np.flatnonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little")[:49152])
        if 2 in allowed and (step >= eos_after or len(allowed) == 1):
            assert m.is_accepting()
            return ll_tokenizer.decode_str(tokens)
        token = int(rng.choice(allowed[allowed != 2]))
        assert m.consume_token(token), m.get_error()
        tokens.append(token)
    return None


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", "named"])
def test_grammar_random_walks_parse_into_valid_calls(ll_tokenizer, fmt, choice):
    import jsonschema
    tools = TOOLS[:2]  # ping's free-form arguments make walks too long to finish
    tool_choice = "required" if choice == "required" else CHOICES[1]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    grammar = tool_call_grammar(tools, tool_choice, True, fmt)
    finished = 0
    for seed in range(12):
        text = random_walk(ll_tokenizer, grammar, seed)
        if text is None:
            continue
        finished += 1
        parsed = FORMATS[fmt].parse(text)
        assert parsed.content is None and parsed.calls, text
        for call in parsed.calls:
            assert choice == "required" or call.name == "add"
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert finished >= 8


def test_grammar_compile_time(ll_tokenizer):
    start = time.perf_counter()
    m = matcher_for(ll_tokenizer, tool_call_grammar(TOOLS, "required", True, "hermes"))
    elapsed = time.perf_counter() - start
    assert not m.is_error() and not m.get_grammar_warnings() and elapsed < 2.0, elapsed


# -- reasoning --

no_markers = prose.filter(lambda t: "<think>" not in t and "</think>" not in t)


@HYPOTHESIS
@given(reasoning=no_markers, content=no_markers, lead=st.sampled_from(["", "\n", "  "]), cuts=cuts,
       parser_cls=st.sampled_from([Qwen3ReasoningParser, DeepSeekR1ReasoningParser]))
def test_reasoning_one_shot_and_any_split(reasoning, content, lead, cuts, parser_cls):
    opened = parser_cls is Qwen3ReasoningParser or not reasoning.strip()
    text = lead + ("<think>" if opened else "") + reasoning + "</think>" + content
    expected = (reasoning.strip() or None, content.strip() or None)
    assert parser_cls.split(text) == expected
    assert stream_reasoning(parser_cls(), split_at(text, cuts)) == expected


def stream_reasoning(parser, pieces):
    out = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(r or "" for r, _ in out) or None, "".join(c or "" for _, c in out) or None


@HYPOTHESIS
@given(parts=st.lists(st.sampled_from(["<think>", "</think>", "<th", "</thi", "\n", " ", "x"]) | st.text(max_size=3),
                      max_size=20), cuts=cuts, starts_in_reasoning=st.booleans())
def test_reasoning_streaming_equals_split_for_any_text(parts, cuts, starts_in_reasoning):
    text = "".join(parts)
    expected = Qwen3ReasoningParser.split(text, starts_in_reasoning)
    assert stream_reasoning(Qwen3ReasoningParser(starts_in_reasoning), split_at(text, cuts)) == expected


def test_reasoning_examples():
    assert Qwen3ReasoningParser.split("<think>\nLet me see.\n</think>\n\nIt is 4.") == ("Let me see.", "It is 4.")
    assert Qwen3ReasoningParser.split("<think>\n\n</think>\n\nIt is 4.") == (None, "It is 4.")
    assert Qwen3ReasoningParser.split("It is 4.") == (None, "It is 4.")
    assert Qwen3ReasoningParser.split("<think>cut off") == ("cut off", None)
    assert DeepSeekR1ReasoningParser.split("Let me see.</think>It is 4.") == ("Let me see.", "It is 4.")
    assert DeepSeekR1ReasoningParser.split("<think>Let me see.</think>It is 4.") == ("Let me see.", "It is 4.")
    assert DeepSeekR1ReasoningParser.split("still thinking") == ("still thinking", None)
    parser = Qwen3ReasoningParser()
    assert parser.feed("<th") == (None, None)  # maybe <think>
    assert parser.feed("ink>a</th") == ("a", None)  # "</th" held back
    assert parser.feed("ink>b") == (None, "b")
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n") and not prompt_opens_reasoning("assistant\n")
    assert reasoning_parser("qwen3") is Qwen3ReasoningParser
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        reasoning_parser("granite")
