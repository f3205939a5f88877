"""The streaming frame every tool-call format shares.

A parser is fed the model's output in deltas (`feed`, then `finish`) and returns events: content
deltas and OpenAI-style tool-call deltas. `parse(text)` is the same machine fed the whole text at once.

Guarantees:
- Splitting: the events' joined content and, per call, joined arguments do not depend on how the
  text was split into deltas; text that may be the start of a marker is held back, never leaked.
- Content is the text outside calls with leading and trailing whitespace removed (None if empty).
- One-shot vs streaming: equal, except for a call that breaks after it committed (see call_object:
  arguments that are not JSON, a missing closing tag, output cut off inside the call). Streaming has
  already sent such a call; `parse` leaves its text in the content instead and drops the call, so a
  non-streaming response never carries arguments that are not JSON.
"""

from dataclasses import dataclass, field

from frontend.output_parsers.text_stream import TrimmedText, partial_suffix_len
from frontend.output_parsers.tool_calls.call_object import WHITESPACE, CallObject
from frontend.output_parsers.tool_calls.types import (ContentDelta, ParsedToolCalls, ToolCall, ToolCallDelta,
                                                      ToolParserEvent)


@dataclass
class _Unit:
    """One stretch of output holding calls (a tagged block, or one JSON call)."""
    start: int
    end: int | None = None
    ok: bool = True  # False: broke after a call in it committed
    calls: list[ToolCall] = field(default_factory=list)


def skip_whitespace(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in WHITESPACE:
        pos += 1
    return pos


class ToolParser:
    """Subclasses implement `_run(final)`, which advances `self._pos` through `self._buf` as far as the
    text allows, using the helpers below."""

    name = ""

    def __init__(self):
        self._buf = ""
        self._pos = 0
        self._events: list[ToolParserEvent] = []
        self._content = TrimmedText()
        self._pieces: list[str | _Unit] = []  # content and units in output order, for parse()
        self._calls: list[ToolCall] = []  # every committed call; a call's index is its place here
        self._unit: _Unit | None = None
        self._obj: CallObject | None = None

    def feed(self, delta: str) -> list[ToolParserEvent]:
        # the output is kept whole (unit offsets point into it); with the attribute's reference dropped,
        # CPython grows the string in place instead of copying it on every delta
        buf, self._buf = self._buf, ""
        buf += delta
        self._buf = buf
        self._run(final=False)
        return self._drain()

    def finish(self) -> list[ToolParserEvent]:
        self._run(final=True)
        return self._drain()

    @classmethod
    def parse(cls, text: str) -> ParsedToolCalls:
        parser = cls()
        parser.feed(text)
        parser.finish()
        return parser._result()

    @property
    def broken(self) -> bool:
        """Whether a call broke after it was committed (streamed, but not in `parse`'s calls)."""
        return any(isinstance(p, _Unit) and not p.ok for p in self._pieces)

    def _run(self, final: bool) -> None:
        raise NotImplementedError

    # -- content --

    def _emit_content(self, text: str) -> None:
        if text:
            self._pieces.append(text)
            out = self._content.push(text)
            if out:
                self._events.append(ContentDelta(out))

    def _content_until(self, marker: str, final: bool) -> int | None:
        """Sends content up to the next `marker` and returns where it starts; without one, sends all but
        a possible start of it (all at the end of output) and returns None."""
        at = self._buf.find(marker, self._pos)
        if at == -1:
            end = len(self._buf) - (0 if final else partial_suffix_len(self._buf[self._pos:], marker))
            self._emit_content(self._buf[self._pos:end])
            self._pos = end
            return None
        self._emit_content(self._buf[self._pos:at])
        self._pos = at
        return at

    # -- units and call objects --

    def _open_unit(self, start: int) -> None:
        self._unit = _Unit(start)
        self._pieces.append(self._unit)

    def _open_object(self) -> None:
        self._obj = CallObject()

    def _step_object(self) -> str:
        """Reads the open call object on: "done", "failed" or "more"."""
        obj = self._obj
        self._pos = obj.step(self._buf, self._pos)
        for kind, text in obj.out:
            if kind == "head":
                call = ToolCall(name=text, arguments="")
                self._calls.append(call)
                self._unit.calls.append(call)
                self._events.append(ToolCallDelta(len(self._calls) - 1, "", call.id, call.name))
            else:
                self._calls[-1].arguments += text
                self._events.append(ToolCallDelta(len(self._calls) - 1, text))
        obj.out.clear()
        return "done" if obj.done else "failed" if obj.failed else "more"

    def _abandon_unit(self, upto: int, content_from: int | None = None) -> None:
        """The unit turned out not to hold a call (none committed): its text up to `upto` is content,
        and reading goes on from there."""
        unit = self._pieces.pop()
        assert unit is self._unit and not unit.calls
        self._unit = None
        self._emit_content(self._buf[unit.start if content_from is None else content_from:upto])
        self._pos = upto

    def _end_unit(self, end: int, ok: bool) -> None:
        self._unit.end, self._unit.ok = end, ok
        self._unit = None

    # -- output --

    def _drain(self) -> list[ToolParserEvent]:
        """The events since the last call, adjacent pieces of the same kind merged."""
        merged: list[ToolParserEvent] = []
        for ev in self._events:
            last = merged[-1] if merged else None
            if isinstance(ev, ContentDelta) and isinstance(last, ContentDelta):
                last.text += ev.text
            elif (isinstance(ev, ToolCallDelta) and isinstance(last, ToolCallDelta)
                  and ev.index == last.index and ev.id is None):
                last.arguments += ev.arguments
            else:
                merged.append(ev)
        self._events = []
        return merged

    def _result(self) -> ParsedToolCalls:
        content = "".join(p if isinstance(p, str) else "" if p.ok else self._buf[p.start:p.end]
                          for p in self._pieces)
        calls = [c for p in self._pieces if isinstance(p, _Unit) and p.ok for c in p.calls]
        return ParsedToolCalls(content.strip() or None, calls)
