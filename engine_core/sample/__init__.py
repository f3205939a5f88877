"""From the last hidden states' logits to tokens.

- sampler.py: temperature, top-k/top-p/min-p, penalties, seeds, logprobs, constrained masks.
- rejection.py: speculative decoding's verification of proposed tokens.
"""
