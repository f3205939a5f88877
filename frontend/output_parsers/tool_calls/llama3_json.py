"""The `llama3_json` format (Llama 3.1+ chat templates): the whole output is the calls,

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

with `<|python_tag|>` optional, `"arguments"` accepted for `"parameters"`, and `;` (or whitespace)
between calls. An output that does not start with `{` (after whitespace and the tag) is all content,
and so is one whose first object is not a call. After the calls, text that does not start another
call is content from the end of the last call on; a trailing `;` is dropped. A call that breaks after
it committed ends the calls: streaming drops the rest of the output, `parse` makes it content.
"""

from frontend.output_parsers.tool_calls.base import ToolParser, skip_whitespace
from frontend.output_parsers.tool_calls.call_object import WHITESPACE

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self):
        super().__init__()
        self._state = "start"  # start, object, between, content, drop
        self._tag_seen = False
        self._mark = 0  # where content would begin if the next object is not a call

    def _run(self, final: bool) -> None:
        buf = self._buf
        while True:
            if self._state == "start":
                at = skip_whitespace(buf, self._pos)
                rest = buf[at:]
                if not self._tag_seen and rest.startswith(PYTHON_TAG):
                    self._tag_seen, self._pos = True, at + len(PYTHON_TAG)
                    continue
                if not final and (not rest or (not self._tag_seen and PYTHON_TAG.startswith(rest))):
                    self._pos = at
                    return
                if rest.startswith("{"):
                    self._start_object(at)
                else:
                    self._to_content()
            elif self._state == "object":
                result = self._step_object()
                if result == "done":
                    self._mark = self._pos
                    self._end_unit(self._pos, ok=True)
                    self._state = "between"
                elif result == "failed" or final:
                    if self._unit.calls:
                        self._state = "drop"
                    else:
                        self._abandon_unit(len(buf), content_from=self._mark)
                        self._state = "content"
                else:
                    return
            elif self._state == "between":
                at = self._pos
                while at < len(buf) and (buf[at] in WHITESPACE or buf[at] == ";"):
                    at += 1
                if at == len(buf):
                    self._pos = at
                    return
                if buf[at] == "{":
                    self._start_object(at)
                else:
                    self._to_content()
            elif self._state == "content":
                self._emit_content(buf[self._pos:])
                self._pos = len(buf)
                return
            else:  # drop
                self._pos = len(buf)
                if final:
                    self._end_unit(len(buf), ok=False)
                return

    def _start_object(self, at: int) -> None:
        self._open_unit(at)
        self._open_object()
        self._pos, self._state = at, "object"

    def _to_content(self) -> None:
        self._pos, self._state = self._mark, "content"
