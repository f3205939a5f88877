"""What the scheduler asks for proposed tokens: how many at most, and which (common/speculative.py)."""

from common.speculative import SpeculativeConfig
from engine_core.sched.request import Request
from engine_core.sched.speculator import Speculator
from engine_core.spec_decode.ngram import NgramProposer


class NgramSpeculator:
    """Proposals by prompt lookup, made by the scheduler from the request's tokens (host only)."""

    def __init__(self, config: SpeculativeConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.ngram = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, request: Request, limit: int) -> list[int]:
        return self.ngram.propose(request.all_token_ids, limit)


class DraftModelSpeculator:
    """Proposals from a draft model: the scheduler reserves their slots (placeholders), and the executor's
    DraftModel (draft_model.py) fills them in before the target runs."""

    PLACEHOLDER = -1

    def __init__(self, config: SpeculativeConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size

    def propose(self, request: Request, limit: int) -> list[int]:
        return [self.PLACEHOLDER] * limit


def speculator_for(config: SpeculativeConfig | None) -> Speculator | None:
    if config is None:
        return None
    return NgramSpeculator(config) if config.method == "ngram" else DraftModelSpeculator(config)
