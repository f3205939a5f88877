"""From the last hidden state's logits to one token per request.

Order: penalties and min_tokens masking on the raw logits, then what the request allows (its grammar's
tokens, allowed_token_ids, logit_bias), then temperature, top-k, top-p and min-p, then a draw. Each
seeded request draws from its own generator, so its tokens do not depend on what else is in the batch. Logprobs are those of the raw model distribution, as vLLM reports.

On a GPU the whole path runs without waiting for the device until the one copy that brings the
sampled ids (and any logprobs) back: per-row parameters and penalty indices go up in pinned,
asynchronous copies, and every branch is decided from the requests on the host.
"""

from collections import Counter

import torch

from common.wire_messages import Logprobs
from engine_core.sample.row_argmax import row_argmax
from engine_core.sched.request import Request
from engine_core.structured_outputs.token_masks import apply_masks, fill_masks


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)  # for unseeded requests
        self.request_generators: dict[str, torch.Generator] = {}
        self.allowed_token_masks: dict[str, torch.Tensor] = {}  # allowed_token_ids as a [vocab] bool mask

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)
        self.allowed_token_masks.pop(request_id, None)

    def _generator_for(self, req: Request) -> torch.Generator:
        g = self.request_generators.get(req.request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(req.sampling_params.seed)
            self.request_generators[req.request_id] = g
        return g

    def _upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A host list as a tensor on the sampler's device, without a host sync on CUDA."""
        t = torch.tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def __call__(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[Logprobs | None]]:
        # a float32 copy that the steps below may change in place
        logits = logits.float() if logits.dtype != torch.float32 else logits.clone()
        raw_logprobs = None
        if any(r.sampling_params.logprobs is not None for r in reqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self.apply_penalties(logits, reqs)
        self.apply_allowed(logits, reqs)
        tokens = self._draw(logits, reqs)
        if raw_logprobs is None:
            return tokens.tolist(), [None] * len(reqs)
        return with_logprobs(tokens, raw_logprobs, reqs)

    def apply_penalties(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        # (row, token) entries of each kind, gathered on the host; each kind is one indexed update
        rep_rows, rep_ids, rep_vals = [], [], []
        pen_rows, pen_ids, counts, freqs, presences = [], [], [], [], []
        ban_rows, ban_ids = [], []
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if sp.repetition_penalty != 1.0:
                seen = sorted(set(r.all_token_ids))
                rep_rows += [i] * len(seen)
                rep_ids += seen
                rep_vals += [sp.repetition_penalty] * len(seen)
            if (sp.presence_penalty or sp.frequency_penalty) and r.output_token_ids:
                counted = sorted(Counter(r.output_token_ids).items())
                pen_rows += [i] * len(counted)
                pen_ids += [t for t, _ in counted]
                counts += [c for _, c in counted]
                freqs += [sp.frequency_penalty] * len(counted)
                presences += [sp.presence_penalty] * len(counted)
            if r.num_output_tokens < sp.min_tokens:
                banned = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(r.eos_token_ids))
                ban_rows += [i] * len(banned)
                ban_ids += banned
        if rep_rows:
            index = self._upload([rep_rows, rep_ids], torch.int64)
            penalty = self._upload(rep_vals, torch.float32)
            row = logits[index[0], index[1]]
            logits[index[0], index[1]] = torch.where(row > 0, row / penalty, row * penalty)
        if pen_rows:
            index = self._upload([pen_rows, pen_ids], torch.int64)
            amounts = self._upload([freqs, counts, presences], torch.float32)
            logits[index[0], index[1]] -= amounts[0] * amounts[1] + amounts[2]
        if ban_rows:
            index = self._upload([ban_rows, ban_ids], torch.int64)
            # a tensor made on the device: a Python scalar assigned through indices may cross to it blocking
            logits.index_put_((index[0], index[1]), torch.full((len(ban_rows),), float("-inf"), device=logits.device))
        return logits

    def apply_allowed(self, logits: torch.Tensor, reqs: list[Request], drafts: list[list[int]] | None = None) -> None:
        """What each request allows, on its rows (in place): its grammar's tokens, allowed_token_ids, logit_bias.
        One row per request, or with proposals to verify, len(drafts[i]) + 1 rows per request in order."""
        grammars, grammar_rows = [], []  # (matcher, first of its rows in grammar_rows, proposals)
        bias_rows, bias_ids, bias_values = [], [], []
        row = 0
        for i, r in enumerate(reqs):
            proposals = drafts[i] if drafts else []
            rows = range(row, row + len(proposals) + 1)
            row = rows.stop
            grammar, params = r.grammar, r.sampling_params
            if grammar is not None and grammar.constrains:
                grammars.append((grammar.matcher, len(grammar_rows), proposals))
                grammar_rows.extend(rows)
            if params.allowed_token_ids:
                logits[rows.start:rows.stop].masked_fill_(~self._allowed_mask(r, logits.shape[-1]), float("-inf"))
            if params.logit_bias:
                for j in rows:
                    bias_rows += [j] * len(params.logit_bias)
                    bias_ids += list(params.logit_bias)
                    bias_values += list(params.logit_bias.values())
        if bias_rows:
            index = self._upload([bias_rows, bias_ids], torch.int64)
            logits[index[0], index[1]] += self._upload(bias_values, torch.float32)
        if grammars:
            apply_masks(logits, grammar_rows, fill_masks(grammars, len(grammar_rows), logits.shape[-1]))

    def _allowed_mask(self, req: Request, vocab: int) -> torch.Tensor:
        mask = self.allowed_token_masks.get(req.request_id)
        if mask is None:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[torch.tensor(req.sampling_params.allowed_token_ids, dtype=torch.int64)] = True
            self.allowed_token_masks[req.request_id] = mask = mask.to(self.device)
        return mask

    def _draw(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        params = [r.sampling_params for r in reqs]
        if all(p.greedy for p in params):
            return row_argmax(logits)
        tokens = row_argmax(logits) if any(p.greedy for p in params) else None
        probs = self.probabilities(logits, params)
        # one uniform per row (unseeded rows from the sampler's generator, in one call)
        uniform = torch.rand(len(reqs), generator=self.generator, device=probs.device)
        for i, r in enumerate(reqs):
            if r.sampling_params.seed is not None and not r.sampling_params.greedy:
                uniform[i] = self.request_uniforms(r, 1)[0]
        sampled = inverse_cdf(probs, uniform)
        if tokens is None:
            return sampled
        greedy = self._upload([p.greedy for p in params], torch.bool)
        return torch.where(greedy, tokens, sampled)

    def request_uniforms(self, req: Request, count: int) -> torch.Tensor:
        """count uniforms from a seeded request's own generator (its draws do not depend on the batch)."""
        return torch.rand(count, generator=self._generator_for(req), device=self.device)

    def probabilities(self, logits: torch.Tensor, params: list) -> torch.Tensor:
        """The distribution each row samples from: temperature, top-k, top-p, then min-p, on penalized
        logits (changed in place). Rows of greedy requests come out at temperature 1, unused."""
        vocab = logits.shape[-1]
        # one upload: temperature, top-k, top-p, min-p per row
        table = self._upload([[1.0 if p.greedy else p.temperature, min(p.top_k, vocab) if p.top_k > 0 else vocab,
                               p.top_p, p.min_p] for p in params], torch.float32)
        logits = logits.div_(table[:, 0:1])
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _top_k_top_p(logits, table[:, 1].to(torch.int64), table[:, 2])
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = table[:, 3]
            cut = probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            # renormalized, as a logit mask: verification accepts a proposal with its probability, which
            # must be the normalized one; rows with nothing cut come out bit-identical (no batch dependence)
            probs = torch.softmax(logits.masked_fill(cut, float("-inf")), dim=-1)
        return probs


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row: the uniform looked up in the row's cumulative distribution (about a fifth of
    the cost of a race over vocab-sized noise on CPU). The rows need not sum to 1; right=True never
    lands on a token whose probability is 0."""
    cdf = probs.cumsum(dim=-1)
    target = uniform[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """top_k [B] int64 (the vocab size: no cut), top_p [B] float32."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    cut = ranks >= top_k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(cut, float("-inf")), dim=-1)
    # drop a token when the tokens ranked above it already reach top_p; the first always stays. A row with
    # top_p 1 keeps its tail (a float32 cumsum can reach 1 before the last token) when another row cuts
    cut |= ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def top_token_ids(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k] ids of each row's k largest values, ties going to the lower id. topk alone picks among
    equal values (common in bf16 logits) by k and by the batch; a request's top logprobs would then
    depend on what another request asked for. Each value's bits (ordered like the floats) and its
    inverted id make one int64 key, unique per row, so topk has nothing to choose."""
    bits = logprobs.float().view(torch.int32).long()
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: larger bits are smaller
    ids = torch.arange(logprobs.shape[-1], device=logprobs.device)
    keys = (ordered << 32) | (0xFFFFFFFF - ids)
    return keys.topk(k, dim=-1).indices


def with_logprobs(tokens: torch.Tensor, raw_logprobs: torch.Tensor,
                  reqs: list[Request]) -> tuple[list[int], list[Logprobs | None]]:
    """Token ids and the logprobs each request asked for (None where it asked none)."""
    return logprobs_of(tokens, raw_logprobs, [r.sampling_params.logprobs for r in reqs])


def logprobs_of(tokens: torch.Tensor, raw_logprobs: torch.Tensor,
                top_counts: list[int | None]) -> tuple[list[int], list[Logprobs | None]]:
    """Per row its token, and the token's logprob and rank with the top_counts[row] most likely ids and theirs
    (None where top_counts[row] is None): computed for all rows on the device and brought back in one copy."""
    top_n = max((n or 0 for n in top_counts), default=0)
    chosen = raw_logprobs.gather(1, tokens[:, None])
    ranks = (raw_logprobs > chosen).sum(dim=-1, keepdim=True) + 1
    columns = [tokens[:, None].double(), chosen.double(), ranks.double()]
    if top_n:
        top_ids = top_token_ids(raw_logprobs, top_n)
        columns += [top_ids.double(), raw_logprobs.gather(1, top_ids).double()]
    table = torch.cat(columns, dim=1).tolist()  # float64 holds the ids, ranks and float32 values exactly
    token_list, logprobs = [int(row[0]) for row in table], []
    for n, row in zip(top_counts, table):
        if n is None:
            logprobs.append(None)
            continue
        out = Logprobs(token_id=int(row[0]), logprob=row[1], rank=int(row[2]))
        if n:
            out.top_token_ids = [int(t) for t in row[3: 3 + n]]
            out.top_logprobs = row[3 + top_n: 3 + top_n + n]
        logprobs.append(out)
    return token_list, logprobs
