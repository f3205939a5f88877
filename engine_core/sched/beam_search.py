"""The arithmetic of one beam search, as transformers 5.24's `_beam_search` does it with early_stopping=False.

No blocks, no model: the scheduler (beam_group.py) hands each step's top logprobs of every live beam to
`BeamSearch.step` and gets back which (parent, token) pairs live on. Per step, with g tokens generated so far:

- candidates: every live beam's top K tokens (K = max(2, 1 + number of EOS ids) * beam_width), scored by
  cum_logprob + logprob in float32; the K best over all beams, best first;
- a candidate "hits a stop" when it is an EOS id (unless ignore_eos) or when it is token max_tokens;
- the beam_width best candidates that do not hit a stop live on (none at max_tokens);
- each of the beam_width best candidates that hits a stop is a finished hypothesis scored
  cum_logprob / (g + 1) ** length_penalty (EOS counts in the length); the beam_width best hypotheses are kept;
- then it stops once beam_width hypotheses are kept and the best live beam's cum_logprob / g' ** length_penalty
  (g' = g + 1, its own length, not the longest it could reach) is no better than the worst kept score, or when
  no beam lives on. Ties keep the lower (beam, token) index, as stable sorts do.
"""

import struct
from dataclasses import dataclass

from common.wire_messages import FinishReason

_F32 = struct.Struct("f")


def f32(x: float) -> float:
    """x rounded to float32, as transformers' float32 tensors hold every score."""
    return _F32.unpack(_F32.pack(x))[0]


@dataclass
class Hypothesis:
    token_ids: list[int]  # generated tokens, the stopping one included
    cum_logprob: float
    score: float
    finish_reason: FinishReason


@dataclass
class Candidate:
    parent: int  # index of the live beam it extends
    token_id: int
    cum_logprob: float


class BeamSearch:
    def __init__(self, beam_width: int, max_tokens: int, length_penalty: float, eos_token_ids,
                 ignore_eos: bool = False, vocab_size: int | None = None):
        self.beam_width = beam_width
        self.max_tokens = max_tokens
        self.length_penalty = length_penalty
        self.eos_token_ids = frozenset(() if ignore_eos else eos_token_ids)
        self.num_candidates = max(2, 1 + len(self.eos_token_ids)) * beam_width
        if vocab_size is not None:
            self.num_candidates = min(self.num_candidates, vocab_size)
        self.finished: list[Hypothesis] = []  # best score first, at most beam_width
        self.num_generated = 0  # tokens every live beam has generated
        self.done = False

    def step(self, beams: list[tuple[list[int], float]],
             top: list[tuple[list[int], list[float]]]) -> list[Candidate]:
        """beams: each live beam's (generated tokens, cum_logprob); top: its top token ids and logprobs (at least
        num_candidates of each, best first). Returns the beams that live on, best first ([] once done)."""
        scored = []
        for parent, ((_, cum), (ids, logprobs)) in enumerate(zip(beams, top)):
            for token_id, logprob in zip(ids[:self.num_candidates], logprobs[:self.num_candidates]):
                scored.append(Candidate(parent, token_id, f32(cum + f32(logprob))))
        scored.sort(key=lambda c: -c.cum_logprob)  # stable: ties keep (parent, rank) order
        scored = scored[:self.num_candidates]
        length = self.num_generated + 1
        at_limit = length >= self.max_tokens
        live, new_hypotheses = [], []
        for rank, c in enumerate(scored):
            stops = at_limit or c.token_id in self.eos_token_ids
            if not stops:
                if len(live) < self.beam_width:
                    live.append(c)
            elif rank < self.beam_width:  # only the beam_width best candidates may finish
                reason = FinishReason.LENGTH if c.token_id not in self.eos_token_ids else FinishReason.STOP
                new_hypotheses.append(Hypothesis(beams[c.parent][0] + [c.token_id], c.cum_logprob,
                                                 f32(c.cum_logprob / f32(length ** self.length_penalty)), reason))
        self.finished = sorted(self.finished + new_hypotheses, key=lambda h: -h.score)[:self.beam_width]
        self.num_generated = length
        if not live or self._cannot_improve(live[0].cum_logprob):
            self.done = True
            return []
        return live

    def _cannot_improve(self, best_live_cum_logprob: float) -> bool:
        if len(self.finished) < self.beam_width:
            return False
        best_possible = f32(best_live_cum_logprob / f32(self.num_generated ** self.length_penalty))
        return best_possible <= self.finished[-1].score
