"""Verifying proposed tokens: which of them the target model keeps, and the token that follows.

A request with k proposals d_1..d_k has k + 1 rows of target logits: row j predicts the token after
the context plus d_1..d_j. Every row is processed as the plain sampler would process it at that
position (penalties and min_tokens see the proposals before it as generated tokens), giving the
target distribution p_j.

Proposals are deterministic (prompt lookup, or a draft model's argmax), so the proposal distribution
q_j is all on d_j. Speculative sampling with such a q keeps d_j with probability p_j(d_j) and, at the
first rejection, draws from the residual max(p_j - q_j, 0), which is p_j without d_j, renormalized.
Every emitted token is then distributed exactly as p: P(t) = p(d) [t = d] + (1 - p(d)) p(t) / (1 - p(d))
for t != d. When all k are kept, a bonus token is drawn from p_k. Greedy requests keep d_j while it is
the argmax, then take the argmax: the same tokens as decoding one at a time.

Each sampled request uses exactly k + 1 uniforms per step (k acceptance tests, one draw) from its own
generator when seeded, so its tokens are reproducible and do not depend on how many were accepted
elsewhere in the batch.
"""

import torch

from common.wire_messages import Logprobs
from engine_core.sched.request import Request
from engine_core.sample.row_argmax import row_argmax
from engine_core.sample.sampler import Sampler, inverse_cdf, with_logprobs


class DraftPosition:
    """A request as its j-th verification row sees it: the first j proposals taken as generated."""

    __slots__ = ("request", "drafts")

    def __init__(self, request: Request, drafts: list[int]):
        self.request, self.drafts = request, drafts

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def sampling_params(self):
        return self.request.sampling_params

    @property
    def eos_token_ids(self):
        return self.request.eos_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        return self.request.all_token_ids + self.drafts

    @property
    def output_token_ids(self) -> list[int]:
        return self.request.output_token_ids + self.drafts

    @property
    def num_output_tokens(self) -> int:
        return self.request.num_output_tokens + len(self.drafts)


def verify(sampler: Sampler, logits: torch.Tensor, reqs: list[Request],
           drafts: list[list[int]]) -> tuple[list[list[int]], list[list[Logprobs]]]:
    """logits: len(drafts[i]) + 1 rows per request, in request order. Returns per request the kept
    proposals followed by one more token, and (if it asked for them) their logprobs."""
    rows = [DraftPosition(r, d[:j]) for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
    starts = [0]
    for d in drafts:
        starts.append(starts[-1] + len(d) + 1)
    logits = logits.float() if logits.dtype != torch.float32 else logits.clone()
    raw_logprobs = None
    if any(r.sampling_params.logprobs is not None for r in reqs):
        raw_logprobs = torch.log_softmax(logits, dim=-1)
    logits = sampler.apply_penalties(logits, rows)
    sampler.apply_allowed(logits, reqs, drafts)  # a proposal the grammar refuses gets probability 0: rejected
    params = [r.sampling_params for r in reqs]
    argmax = row_argmax(logits).tolist()
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    probs = sampler.probabilities(logits, [row.sampling_params for row in rows]) if sampled else None
    uniforms = _uniforms(sampler, reqs, drafts, sampled)

    # how many proposals each request keeps
    kept = [0] * len(reqs)
    if sampled:
        draft_rows = [starts[i] + j for i in sampled for j in range(len(drafts[i]))]
        draft_ids = [t for i in sampled for t in drafts[i]]
        p_draft = probs[draft_rows, draft_ids].tolist() if draft_rows else []
        at = 0
        for i in sampled:
            k = len(drafts[i])
            accept = [uniforms[i][j] < p_draft[at + j] for j in range(k)]
            kept[i] = accept.index(False) if False in accept else k
            at += k
    for i, p in enumerate(params):
        if p.greedy:
            d = drafts[i]
            kept[i] = next((j for j, t in enumerate(d) if argmax[starts[i] + j] != t), len(d))

    # the token after the kept proposals: argmax, or a draw from the residual (after a rejection) or p
    final = [argmax[starts[i] + kept[i]] for i in range(len(reqs))]
    if sampled:
        last_rows = [starts[i] + kept[i] for i in sampled]
        dist = probs[last_rows].clone()
        rejected = [(n, drafts[i][kept[i]]) for n, i in enumerate(sampled) if kept[i] < len(drafts[i])]
        if rejected:
            where = torch.tensor(rejected, dtype=torch.int64, device=dist.device)
            dist[where[:, 0], where[:, 1]] = 0.0  # max(p - q, 0) with q all on the rejected proposal
        u = torch.tensor([uniforms[i][-1] for i in sampled], dtype=torch.float32, device=dist.device)
        for n, token in zip(sampled, inverse_cdf(dist, u).tolist()):
            final[n] = token

    tokens = [drafts[i][:kept[i]] + [final[i]] for i in range(len(reqs))]
    if raw_logprobs is None:
        return tokens, [[] for _ in reqs]
    out_rows = [starts[i] + j for i in range(len(reqs)) for j in range(kept[i] + 1)]
    flat = torch.tensor([t for ts in tokens for t in ts], dtype=torch.int64, device=raw_logprobs.device)
    _, lps = with_logprobs(flat, raw_logprobs[out_rows], [rows[r] for r in out_rows])
    logprobs, at = [], 0
    for ts in tokens:
        logprobs.append([lp for lp in lps[at: at + len(ts)] if lp is not None])
        at += len(ts)
    return tokens, logprobs


def _uniforms(sampler: Sampler, reqs: list[Request], drafts: list[list[int]], sampled: list[int]) -> dict[int, list[float]]:
    """k + 1 uniforms per sampled request: seeded ones from their own generator, the rest in one call."""
    unseeded = [i for i in sampled if reqs[i].sampling_params.seed is None]
    shared = torch.rand(sum(len(drafts[i]) + 1 for i in unseeded), generator=sampler.generator,
                        device=sampler.device).tolist()
    uniforms, at = {}, 0
    for i in sampled:
        k = len(drafts[i]) + 1
        if reqs[i].sampling_params.seed is None:
            uniforms[i], at = shared[at: at + k], at + k
        else:
            uniforms[i] = sampler.request_uniforms(reqs[i], k).tolist()
    return uniforms
