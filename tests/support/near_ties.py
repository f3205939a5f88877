"""Two runs' greedy answers compared where a kept-quantized and a plain model may part: at a near-tie only."""


def identical_but_for_near_ties(kept, plain, near_tie: float) -> int:
    """How many answers two runs give token for token; where one pair parts, each run ranks the other's token
    among its top logprobs, at most `near_tie` below its best (asserted)."""
    identical = 0
    for a, b in zip(kept, plain):
        first = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if first is None:
            identical += 1
            continue
        for out, other in ((a, b), (b, a)):
            top = out.logprobs[first]
            best = max(lp.logprob for lp in top.values())
            chosen = other.token_ids[first]
            assert chosen in top and best - top[chosen].logprob <= near_tie, (first, sorted(top.items()))
    return identical
