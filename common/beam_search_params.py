"""Beam search parameters (vLLM's BeamSearchParams), shared by the offline API, the HTTP server and the wire.

A beam-search request keeps the `beam_width` best sequences by cumulative logprob at every step and returns
`beam_width` finished ones ranked by score = cumulative logprob / (generated tokens ** length_penalty), as
transformers' beam search with early_stopping=False does (engine_core/sched/beam_search.py)."""

import math

import msgspec

from common.errors import invalid

_INT32_MAX = 2**31 - 1


class BeamSearchParams(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False

    def validate(self, max_beam_width: int | None = None) -> None:
        """Raise InvalidParameter naming the first bad field and its limit (max_beam_width: the engine's)."""
        limit = max_beam_width if max_beam_width is not None else _INT32_MAX
        checks = [
            (1 <= self.beam_width <= limit, "beam_width",
             f"must be in [1, {limit}]" + (" (--max-n)" if max_beam_width is not None else "") +
             f", got {self.beam_width}"),
            (1 <= self.max_tokens <= _INT32_MAX, "max_tokens", f"must be in [1, 2**31), got {self.max_tokens}"),
            (math.isfinite(self.length_penalty) and abs(self.length_penalty) <= 1e6, "length_penalty",
             f"must be a finite number in [-1e6, 1e6], got {self.length_penalty}"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise invalid(name, why)
