"""Prompt-lookup proposals: what followed the latest earlier occurrence of the sequence's last n tokens.

Answers that copy from their context (code edits, quoting, summaries, retrieval) repeat long runs of
it; once the last few tokens match an earlier spot, the tokens after that spot are good guesses.
The search runs in C (bytes.rfind over the ids as 4-byte words), so a 4k-token sequence costs
microseconds per step, not a Python loop.
"""

from array import array


class NgramProposer:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens ids that followed an earlier match of the longest suffix from max_n down to
        min_n tokens: the latest match with max_tokens ids after it, else the latest one (inside a
        repeating run the latest match is right before the end, with a single id after it); [] when no
        suffix recurs."""
        num = len(token_ids)
        if max_tokens <= 0 or num < self.min_n + 1:
            return []
        words = array("i", token_ids).tobytes()
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            start = _latest_match(words, num, n, num - max_tokens)
            if start is None:
                start = _latest_match(words, num, n, num - 1)
            if start is not None:
                follow = start + n
                return token_ids[follow: follow + max_tokens]
        return []


def _latest_match(words: bytes, num: int, n: int, end_id: int) -> int | None:
    """Index of the latest occurrence of the last n ids that ends by id end_id (exclusive)."""
    suffix = words[4 * (num - n):]
    end = 4 * end_id
    while end >= 4 * n:
        at = words.rfind(suffix, 0, end)
        if at < 0:
            return None
        if at % 4 == 0:  # a byte match that is not aligned to whole ids is not a match
            return at // 4
        end = at + 4 * n - 1  # look again left of this misaligned hit
    return None
