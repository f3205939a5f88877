"""What a request samples from, written from the published formulas in float64 numpy: the independent
reference the sampler's tests compare with (never the sampler's own code)."""

import numpy as np

from common.sampling_params import SamplingParams


def penalized_logits(logits: np.ndarray, params: SamplingParams, prompt: list[int], output: list[int]) -> np.ndarray:
    """vLLM's and OpenAI's penalties from their definitions. repetition_penalty (vLLM, after CTRL): a token
    seen in the prompt or the output has a positive logit divided by it, a negative one multiplied.
    frequency / presence (OpenAI): logit - frequency x c - presence x (c > 0), c the token's count in the
    output only. vLLM applies repetition first."""
    x = np.array(logits, dtype=np.float64)
    for t in set(prompt) | set(output):
        x[t] = x[t] / params.repetition_penalty if x[t] > 0 else x[t] * params.repetition_penalty
    counts = np.bincount(np.array(output, dtype=np.int64), minlength=len(x))
    return x - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


def target_distribution(logits: np.ndarray, params: SamplingParams, prompt: list[int], output: list[int]) -> np.ndarray:
    """The penalties, then in the order sampler.py documents: temperature, top-k, top-p (the smallest
    most-probable set whose mass reaches p), min-p (drop p < min_p x max p)."""
    x = penalized_logits(logits, params, prompt, output) / params.temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")  # most probable first
    if params.top_k > 0:
        p[order[params.top_k:]] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        above = np.cumsum(p[order]) - p[order]  # the mass ranked above each token
        p[order[above >= params.top_p]] = 0.0  # already reached without it: cut (the first always stays)
        p /= p.sum()
    if params.min_p > 0:
        p[p < params.min_p * p.max()] = 0.0
    return p / p.sum()
