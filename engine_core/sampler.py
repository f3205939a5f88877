"""From the last hidden state's logits to one token per request.

Order: penalties and min_tokens masking on the raw logits, then temperature, top-k, top-p and
min-p, then a draw. Each seeded request draws from its own generator, so its tokens do not depend
on what else is in the batch. Logprobs are those of the raw model distribution, as vLLM reports.
"""

import torch

from common.protocol import Logprobs
from engine_core.request import Request


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)  # for unseeded requests
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def _generator_for(self, req: Request) -> torch.Generator:
        g = self.request_generators.get(req.request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(req.sampling_params.seed)
            self.request_generators[req.request_id] = g
        return g

    def __call__(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[Logprobs | None]]:
        logits = logits.float()
        raw_logprobs = None
        if any(r.sampling_params.logprobs is not None for r in reqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._apply_penalties(logits.clone(), reqs)
        tokens = self._draw(logits, reqs)
        token_list = tokens.tolist()
        logprobs = [None] * len(reqs)
        if raw_logprobs is not None:
            for i, r in enumerate(reqs):
                if r.sampling_params.logprobs is not None:
                    logprobs[i] = _logprobs_of(raw_logprobs[i], token_list[i], r.sampling_params.logprobs)
        return token_list, logprobs

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if sp.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(r.all_token_ids)), device=logits.device)
                row = logits[i, seen]
                logits[i, seen] = torch.where(row > 0, row / sp.repetition_penalty, row * sp.repetition_penalty)
            if (sp.presence_penalty or sp.frequency_penalty) and r.output_token_ids:
                ids, counts = torch.tensor(r.output_token_ids, device=logits.device).unique(return_counts=True)
                logits[i, ids] -= sp.frequency_penalty * counts.float() + sp.presence_penalty
            if r.num_output_tokens < sp.min_tokens:
                banned = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(r.eos_token_ids))
                if banned:
                    logits[i, banned] = float("-inf")
        return logits

    def _draw(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        greedy = torch.tensor([r.sampling_params.greedy for r in reqs], device=logits.device)
        tokens = logits.argmax(dim=-1)
        if bool(greedy.all()):
            return tokens
        params = [r.sampling_params for r in reqs]
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
        logits = logits / temps[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _top_k_top_p(logits, params)
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=logits.device)
            probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
        # exponential race: argmax(p / E) with E ~ Exp(1) draws from p; E = -log(U) is drawn
        # through rand(), several times faster on CPU than exponential_()
        uniform = torch.rand(probs.shape, generator=self.generator, device=probs.device)
        for i, r in enumerate(reqs):
            if r.sampling_params.seed is not None and not r.sampling_params.greedy:
                uniform[i] = torch.rand(probs.shape[-1], generator=self._generator_for(r), device=probs.device)
        noise = -torch.log(uniform.clamp_(min=1e-20))
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, tokens, sampled)


def _top_k_top_p(logits: torch.Tensor, params) -> torch.Tensor:
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    cut = ranks >= top_k[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    probs = torch.softmax(sorted_logits.masked_fill(cut, float("-inf")), dim=-1)
    # drop a token when the tokens ranked above it already reach top_p; the first always stays
    cut |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _logprobs_of(row: torch.Tensor, token: int, top_n: int) -> Logprobs:
    value = row[token]
    rank = int((row > value).sum()) + 1
    out = Logprobs(token_id=token, logprob=float(value), rank=rank)
    if top_n:
        top = row.topk(top_n)
        out.top_token_ids = top.indices.tolist()
        out.top_logprobs = top.values.tolist()
    return out
