"""Small helpers for parsers that read a model's output as it streams in.

Both guarantee that what is streamed joins to what a one-shot pass over the whole text gives,
however the text was split into deltas.
"""


def partial_suffix_len(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker` (0 if none): the part
    that must be held back because the next delta may complete the marker."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class TrimmedText:
    """Streams text with its leading and trailing whitespace removed.

    push() returns what can be sent now: leading whitespace is dropped, and a run of whitespace is
    held until some non-whitespace follows it (it may be the trailing whitespace). What push()
    returned, joined, always equals the joined input `.strip()`; the held tail is simply never sent.
    """

    def __init__(self):
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        out = self._held + body
        self._held = text[len(body):]
        return out
