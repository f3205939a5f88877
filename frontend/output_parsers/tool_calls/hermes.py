"""The `hermes` format (Hermes, Qwen2.5, Qwen3 chat templates): each call is its own block,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and text outside the blocks is content.
"""

from frontend.output_parsers.tool_calls.tagged import TaggedToolParser


class HermesToolParser(TaggedToolParser):
    name = "hermes"

    def _begin_body(self) -> None:
        self._open_object()

    def _body(self, final: bool):
        result = self._step_object()
        return ("failed", self._obj.failed_at) if result == "failed" else result
