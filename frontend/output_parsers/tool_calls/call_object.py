"""Reads one tool-call JSON object, `{"name": "f", "arguments": {...}}`, as its text arrives.

Every decision is taken at a definite character, from the text up to it, so reading the object in
any pieces gives the same outputs. Outputs, in `out` for the caller to drain:
  ("head", name)  the call is committed: from here on it is a call, whatever follows;
  ("args", text)  a piece of the arguments' JSON text, exactly as written.
A call commits when its arguments object opens with its name already read (the arguments are then
streamed as they arrive), or, when the arguments came first or are absent, as soon as both are known
(absent arguments are "{}"). Before the commit the object may still fail (`failed_at` is the
character where it stopped being a call) and the caller can treat its text as content; a failure
after the commit (arguments that turn out not to be JSON, junk before the closing brace) can only be
recorded: the head and the pieces are already out.
"""

import json
import re

ARGUMENT_KEYS = ("arguments", "parameters")  # "parameters" is what Llama 3 templates ask for
WHITESPACE = " \t\n\r"

_IN_STRING_STOP = re.compile(r'["\\]')
_STRUCTURE = re.compile(r'["{}\[\]]')
_NOT_SCALAR = re.compile(r"[^-+.0-9a-zA-Z]")


class CallObject:
    def __init__(self):
        self.state = "open"
        self.name: str | None = None
        self.arguments: str | None = None  # the complete arguments text, once read
        self.committed = False
        self.done = False  # the closing brace was read and the call is whole
        self.failed_at: int | None = None
        self.out: list[tuple[str, str]] = []
        self._key: str | None = None
        self._start = 0  # where the key or value being read began
        self._streaming = False  # reading a committed call's arguments
        self._depth, self._in_string, self._escape, self._scalar = 0, False, False, False

    @property
    def failed(self) -> bool:
        return self.failed_at is not None

    def step(self, buf: str, pos: int) -> int:
        """Reads buf from pos until the object is done, has failed, or buf ends; returns where it stopped."""
        n = len(buf)
        while pos < n and not self.done and self.failed_at is None:
            if self.state in ("key", "value"):
                pos = self._read_token(buf, pos)
                continue
            c = buf[pos]
            if c in WHITESPACE:
                pos += 1
                continue
            pos = self._structural(buf, pos, c)
        return pos

    def _structural(self, buf: str, pos: int, c: str) -> int:
        state = self.state
        if state == "open":
            return self._expect(c == "{", "key_or_end", pos)
        if state in ("key_or_end", "key_start"):
            if c == "}" and state == "key_or_end":
                return self._close(pos)
            if c != '"':
                return self._fail(pos)
            self._begin(buf, pos, "key")
            return pos + 1
        if state == "colon":
            return self._expect(c == ":", "value_start", pos)
        if state == "value_start":
            return self._begin_value(buf, pos, c)
        if state == "after_value":
            if c == ",":
                self.state = "key_start"
                return pos + 1
            return self._close(pos) if c == "}" else self._fail(pos)
        raise AssertionError(state)

    def _expect(self, ok: bool, next_state: str, pos: int) -> int:
        if not ok:
            return self._fail(pos)
        self.state = next_state
        return pos + 1

    def _fail(self, pos: int) -> int:
        self.failed_at = pos
        return pos

    def _begin(self, buf: str, pos: int, state: str) -> None:
        c = buf[pos]
        self.state, self._start = state, pos
        self._depth = 1 if c in "{[" else 0
        self._in_string, self._escape, self._scalar = c == '"', False, c not in '{["'

    def _begin_value(self, buf: str, pos: int, c: str) -> int:
        if self._key in ARGUMENT_KEYS:
            if c != "{" or self.arguments is not None or self._streaming:
                return self._fail(pos)
            if self.name is not None:  # the name came first: commit now and stream the arguments
                self._commit()
                self._streaming = True
        elif c not in '{["-0123456789tfn':
            return self._fail(pos)
        self._begin(buf, pos, "value")
        end = pos + 1
        if self._streaming:
            self.out.append(("args", c))
        return end

    def _read_token(self, buf: str, pos: int) -> int:
        """Advances through the key or value being read; completes it at its last character."""
        end, complete = self._scan(buf, pos)
        if self._streaming and end > pos:
            self.out.append(("args", buf[pos:end]))
        if complete:
            self._complete(buf[self._start:end], end)
        return end

    def _scan(self, buf: str, pos: int) -> tuple[int, bool]:
        n = len(buf)
        while pos < n:
            if self._scalar:
                m = _NOT_SCALAR.search(buf, pos)
                return (n, False) if m is None else (m.start(), True)
            if self._in_string:
                if self._escape:
                    self._escape, pos = False, pos + 1
                    continue
                m = _IN_STRING_STOP.search(buf, pos)
                if m is None:
                    return n, False
                pos = m.end()
                if m.group() == "\\":
                    self._escape = True
                    continue
                self._in_string = False
                if self._depth == 0:
                    return pos, True
                continue
            m = _STRUCTURE.search(buf, pos)
            if m is None:
                return n, False
            pos, c = m.end(), m.group()
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return pos, True
        return n, False

    def _complete(self, text: str, end: int) -> None:
        last = end - 1
        try:
            value = json.loads(text)
        except ValueError:
            self._fail(last)
            return
        if self.state == "key":
            self._key, self.state = value, "colon"
            return
        self.state = "after_value"
        if self._key == "name":
            if self.name is not None or not isinstance(value, str) or not value:
                self._fail(last)
                return
            self.name = value
            if self.arguments is not None:
                self._commit()
        elif self._key in ARGUMENT_KEYS:
            self.arguments = text
            self._streaming = False

    def _commit(self) -> None:
        self.committed = True
        self.out.append(("head", self.name))
        if self.arguments is not None:
            self.out.append(("args", self.arguments))

    def _close(self, pos: int) -> int:
        if self.name is None:
            return self._fail(pos)
        if not self.committed:  # a call without arguments
            self.arguments = "{}"
            self._commit()
        self.done = True
        return pos + 1
