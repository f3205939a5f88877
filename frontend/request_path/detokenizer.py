"""Incremental detokenization and stop strings for one generated sequence.

tokenizers' DecodeStream yields text only once a UTF-8 character is complete, so the streamed
pieces always join to the full decode. Text that might be the start of a stop string is held back
until it is known not to be one. Stop strings wait for min_tokens: one matches only where it ends in the
text of the min_tokens-th token or later (as EOS and stop token ids, which cannot be sampled before).
"""

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str], include_stop_str: bool,
                 skip_special_tokens: bool = True, min_tokens: int = 0):
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(ids=prompt_ids[-8:], skip_special_tokens=skip_special_tokens)
        self.stop = stop
        self.include_stop_str = include_stop_str
        self._longest_stop = max(map(len, stop), default=0)
        self.hold_back = 0 if include_stop_str or not stop else self._longest_stop - 1
        self.text = ""
        self._sent = 0  # characters of self.text already handed out
        self.min_tokens = min_tokens
        self._num_tokens = 0
        self._stops_end_after = 0  # a stop string counts only if it ends past this many characters

    def update(self, new_token_ids: list[int]) -> str | None:
        """Adds tokens; returns the stop string that matched, if one did (text is cut there)."""
        start = len(self.text)
        for tid in new_token_ids:
            self._num_tokens += 1
            if self._num_tokens == self.min_tokens:
                self._stops_end_after = len(self.text)  # the text before the min_tokens-th token
            piece = self._stream.step(self._backend, tid)
            if piece:
                self.text += piece
        if not self.stop or self._num_tokens < self.min_tokens:
            return None
        # only the new text is searched, plus the tail a stop string may straddle from the old end
        search_from = max(0, start - self._longest_stop + 1)
        best = None
        for s in self.stop:
            at = self.text.find(s, max(search_from, self._stops_end_after - len(s) + 1))
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        at, s = best
        self.text = self.text[: at + len(s)] if self.include_stop_str else self.text[:at]
        return s

    def new_text(self, finished: bool) -> str:
        """Text not yet handed out, less what must wait in case it begins a stop string."""
        end = len(self.text) if finished else max(self._sent, len(self.text) - self.hold_back)
        piece = self.text[self._sent:end]
        self._sent = end
        return piece
