"""The `generic` format: nvllm's own, for chat templates without tool support (SmolLM2 was trained on it).
A block holds a JSON list of calls, or a single call:

    <tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]</tool_call>

Text outside the blocks is content. An empty list is a block without calls (it is not content).
"""

from frontend.output_parsers.tool_calls.base import skip_whitespace
from frontend.output_parsers.tool_calls.tagged import TaggedToolParser


class GenericToolParser(TaggedToolParser):
    name = "generic"

    def _begin_body(self) -> None:
        self._list_state = "open"  # open, first, object, next, item
        self._single = False

    def _body(self, final: bool):
        while True:
            if self._list_state == "object":
                result = self._step_object()
                if result != "done":
                    return ("failed", self._obj.failed_at) if result == "failed" else result
                if self._single:
                    return "done"
                self._list_state = "next"
                continue
            at = skip_whitespace(self._buf, self._pos)
            if at == len(self._buf):
                self._pos = at
                return "more"
            c, state = self._buf[at], self._list_state
            if c == "{" and state in ("open", "first", "item"):
                self._single = state == "open"
                self._pos, self._list_state = at, "object"
                self._open_object()
            elif c == "[" and state == "open":
                self._pos, self._list_state = at + 1, "first"
            elif c == "]" and state in ("first", "next"):
                self._pos = at + 1
                return "done"
            elif c == "," and state == "next":
                self._pos, self._list_state = at + 1, "item"
            else:
                return "failed", at
