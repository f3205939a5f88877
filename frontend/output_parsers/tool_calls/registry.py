"""Tool parsers by name, and which one (and whether tools at all) a chat template implies."""

import re

import jinja2
import jinja2.meta
import jinja2.sandbox

from frontend.output_parsers.tool_calls.base import ToolParser
from frontend.output_parsers.tool_calls.generic import GenericToolParser
from frontend.output_parsers.tool_calls.hermes import HermesToolParser
from frontend.output_parsers.tool_calls.llama3_json import PYTHON_TAG, Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, GenericToolParser)}


def tool_parser(name: str) -> type[ToolParser]:
    """The parser class called `name`; ValueError naming the known ones otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}") from None


# Llama 3 templates tell the model to answer {"name": ..., "parameters": ...}
_LLAMA3_PARAMETERS = re.compile(r"""\\?["']parameters\\?["']""")


def tool_parser_for_template(chat_template: str | None) -> str:
    """hermes if the template writes `<tool_call>`; llama3_json if it writes `<|python_tag|>` or asks for
    "parameters" JSON; otherwise generic (nvllm's own format, which needs no template support)."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return "hermes"
    if PYTHON_TAG in template or (template_takes_tools(template) and _LLAMA3_PARAMETERS.search(template)):
        return "llama3_json"
    return "generic"


def template_takes_tools(chat_template: str | None) -> bool:
    """Whether the template's Jinja source reads a `tools` variable (so tools can be passed to it)."""
    if not chat_template:
        return False
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(env.parse(chat_template))
    except jinja2.TemplateSyntaxError:  # an extension tag we lack: fall back to the text
        return re.search(r"\btools\b", chat_template) is not None
