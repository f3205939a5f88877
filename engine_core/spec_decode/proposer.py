"""What the scheduler asks for proposed tokens: how many at most, and which (common/speculative.py)."""

from common.speculative import SpeculativeConfig
from engine_core.request import Request
from engine_core.spec_decode.ngram import NgramProposer


class NgramSpeculator:
    """Proposals by prompt lookup, made by the scheduler from the request's tokens (host only)."""

    def __init__(self, config: SpeculativeConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.ngram = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, request: Request, limit: int) -> list[int]:
        return self.ngram.propose(request.all_token_ids, limit)


def speculator_for(config: SpeculativeConfig | None):
    if config is None:
        return None
    if config.method == "ngram":
        return NgramSpeculator(config)
    raise ValueError(f"speculative_config.method {config.method!r} is not available yet")
