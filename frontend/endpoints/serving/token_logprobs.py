"""One generated position's logprobs as answers show them: its tokens decoded, its top entries ranked."""

from frontend.async_engine.async_llm import AsyncLLM
from frontend.request_path.outputs import Logprob


def decoded(engine: AsyncLLM, token_id: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return engine.tokenizer.decode([token_id])


def top_entries(entry: dict[int, Logprob], sampled: int, num_top: int) -> list[tuple[int, Logprob]]:
    """The top `num_top` of one position's logprobs, most likely first."""
    ranked = [(tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= num_top]
    ranked.sort(key=lambda item: item[1].rank)
    return ranked
