"""Formats whose calls sit in `<tool_call>...</tool_call>` blocks amid free text (hermes, generic).

A block whose inside fails before any call in it committed is left in the content, from its opening
tag up to the failing character, and reading for blocks goes on from that character. A block that
breaks after a call committed is dropped up to its closing tag when streaming (`parse` leaves it in
the content). A missing closing tag at the very end of the output is forgiven (it may have been a
stop string).
"""

from frontend.output_parsers.text_stream import partial_suffix_len
from frontend.output_parsers.tool_calls.base import ToolParser, skip_whitespace

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


class TaggedToolParser(ToolParser):
    """Subclasses implement `_body(final)`: read the block's inside from `self._pos`, returning "done"
    (positioned after it), "more", or ("failed", at) with the failing character."""

    def __init__(self):
        super().__init__()
        self._state = "text"

    def _begin_body(self) -> None:
        raise NotImplementedError

    def _body(self, final: bool):
        raise NotImplementedError

    def _run(self, final: bool) -> None:
        while True:
            if self._state == "text":
                at = self._content_until(OPEN_TAG, final)
                if at is None:
                    return
                self._open_unit(at)
                self._pos = at + len(OPEN_TAG)
                self._state = "body"
                self._begin_body()
            elif self._state == "body":
                result = self._body(final)
                if result == "more":
                    if not final:
                        return
                    self._fail_block(len(self._buf))  # cut off inside the block
                    continue
                if result == "done":
                    self._state = "close"
                else:
                    self._fail_block(result[1])
            elif self._state == "close":
                if not self._close(final):
                    return
            else:  # "drop": a broken block, up to its closing tag
                at = self._buf.find(CLOSE_TAG, self._pos)
                if at == -1:
                    if final:
                        self._end_unit(len(self._buf), ok=False)
                        self._pos = len(self._buf)
                    else:
                        self._pos = len(self._buf) - partial_suffix_len(self._buf[self._pos:], CLOSE_TAG)
                    return
                self._pos = at + len(CLOSE_TAG)
                self._end_unit(self._pos, ok=False)
                self._state = "text"

    def _close(self, final: bool) -> bool:
        """After the body: whitespace, then the closing tag. False when more text is needed."""
        at = skip_whitespace(self._buf, self._pos)
        seen = self._buf[at:at + len(CLOSE_TAG)]
        if seen == CLOSE_TAG or (final and CLOSE_TAG.startswith(seen)):
            self._pos = at + len(seen)
            self._end_unit(self._pos, ok=True)
            self._state = "text"
            return True
        if CLOSE_TAG.startswith(seen):
            return False
        self._fail_block(at + next(i for i, (a, b) in enumerate(zip(seen, CLOSE_TAG)) if a != b))
        return True

    def _fail_block(self, at: int) -> None:
        if self._unit.calls:
            self._state = "drop"
        else:
            self._abandon_unit(at)
            self._state = "text"
