"""The text side of tool calling: parsing calls out of model output (one-shot and streaming), choosing
the format from the chat template, the generic format's prompt and history, and the grammar that
enforces calls. Pure text, no torch."""

from frontend.output_parsers.tool_calls.base import ToolParser
from frontend.output_parsers.tool_calls.generic import GenericToolParser
from frontend.output_parsers.tool_calls.grammar import tool_call_grammar
from frontend.output_parsers.tool_calls.hermes import HermesToolParser
from frontend.output_parsers.tool_calls.llama3_json import Llama3JsonToolParser
from frontend.output_parsers.tool_calls.prompt import (messages_for_template, render_tools_system_prompt,
                                                       with_tools_in_system_turn)
from frontend.output_parsers.tool_calls.registry import (TOOL_PARSERS, template_takes_tools, tool_parser,
                                                         tool_parser_for_template)
from frontend.output_parsers.tool_calls.types import (ContentDelta, ParsedToolCalls, ToolCall, ToolCallDelta,
                                                      ToolParserEvent)

__all__ = [
    "ContentDelta", "GenericToolParser", "HermesToolParser", "Llama3JsonToolParser", "ParsedToolCalls",
    "TOOL_PARSERS", "ToolCall", "ToolCallDelta", "ToolParser", "ToolParserEvent", "messages_for_template",
    "render_tools_system_prompt", "template_takes_tools", "tool_call_grammar", "tool_parser",
    "tool_parser_for_template", "with_tools_in_system_turn",
]
