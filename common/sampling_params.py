"""Per-request sampling parameters, shared by the offline API, the HTTP server and the wire."""

import math
from enum import IntEnum

import msgspec

from common.errors import invalid
from common.structured_outputs import StructuredOutputsParams

_INT32_MAX = 2**31 - 1
# the largest temperature or repetition penalty (and 1/ it the smallest penalty): logits are float32, and a
# divisor or factor past this turns them into inf and NaN, which no grammar mask can then hold
MAX_SCALE = 1e30
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


class RequestOutputKind(IntEnum):
    CUMULATIVE = 0  # every RequestOutput carries the whole text so far
    DELTA = 1  # every RequestOutput carries only what is new
    FINAL_ONLY = 2  # one RequestOutput when the request finishes


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """How one request samples and when it stops: vLLM's `SamplingParams`, field for field where they exist.

    Attributes:
        n: completions to generate for the prompt.
        temperature: 0 is greedy (the same tokens as transformers' greedy search in float32).
        top_p: nucleus sampling: keep the smallest set of tokens whose probabilities add up to top_p.
        top_k: keep the k most probable tokens (0 or -1: no cut).
        min_p: drop tokens less probable than min_p times the most probable one.
        seed: a request with a seed samples the same tokens every time, whatever else runs beside it.
        max_tokens: most tokens to generate (None: up to the model's context length).
        min_tokens: tokens to generate before EOS or a stop token may end it.
        stop: strings that end the output (not included unless include_stop_str_in_output).
        stop_token_ids: token ids that end the output.
        ignore_eos: keep generating past the end-of-sequence token.
        include_stop_str_in_output: keep the stop string that ended the output.
        repetition_penalty: above 1 discourages tokens already in the prompt or output.
        presence_penalty: subtracted from the logit of every token already generated.
        frequency_penalty: subtracted per occurrence of a token already generated.
        logprobs: top-N logprobs per generated token (0: the sampled token's only).
        prompt_logprobs: top-N logprobs per prompt token.
        skip_special_tokens: leave special tokens out of the text.
        output_kind: cumulative outputs, only what is new (streaming), or one final output.
        structured_outputs: a JSON schema, regex, grammar or choice the output must follow.
        allowed_token_ids: the only tokens the sampler may pick.
        logit_bias: added to the logits of these token ids.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k cut
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # top-N logprobs per generated token (0: the sampled one only)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # what the sampler may pick: a grammar's tokens, a fixed set, or a bias added to the logits
    structured_outputs: StructuredOutputsParams | None = None
    allowed_token_ids: list[int] | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    def validate(self) -> None:
        """Raise InvalidParameter (a ValueError) naming the first bad field and its limit. These are the
        limits every model shares; common/validation.py adds the ones the engine core sets (vocabulary, counts, budget)."""
        for name in _FLOAT_FIELDS:
            if not math.isfinite(getattr(self, name)):
                raise invalid(name, f"must be a finite number, got {getattr(self, name)}")
        checks = [
            (self.n >= 1, "n", f"must be at least 1, got {self.n}"),
            (0 <= self.temperature <= MAX_SCALE, "temperature", f"must be in [0, {MAX_SCALE:g}], got {self.temperature}"),
            (0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (0 <= self.top_k <= _INT32_MAX, "top_k", f"must be -1 (off) or in [1, 2**31), got {self.top_k}"),
            (0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}"),
            (self.max_tokens is None or 1 <= self.max_tokens <= _INT32_MAX, "max_tokens",
             f"must be in [1, 2**31), got {self.max_tokens}"),
            (0 <= self.min_tokens <= _INT32_MAX, "min_tokens", f"must be in [0, 2**31), got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
             f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"),
            (1 / MAX_SCALE <= self.repetition_penalty <= MAX_SCALE, "repetition_penalty",
             f"must be in [{1 / MAX_SCALE:g}, {MAX_SCALE:g}], got {self.repetition_penalty}"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty",
             f"must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty",
             f"must be in [-2, 2], got {self.frequency_penalty}"),
            (self.logprobs is None or self.logprobs >= 0, "logprobs", f"must be >= 0, got {self.logprobs}"),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0, "prompt_logprobs",
             f"must be >= 0, got {self.prompt_logprobs}"),
            (all(s for s in self.stop), "stop", "must not contain empty strings"),
            (all(0 <= t <= _INT32_MAX for t in self.stop_token_ids), "stop_token_ids",
             "must be token ids in [0, 2**31)"),
            (self.seed is None or 0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0, "allowed_token_ids",
             "must hold at least one token id"),
            (all(math.isfinite(b) and -100 <= b <= 100 for b in (self.logit_bias or {}).values()), "logit_bias",
             "values must be numbers in [-100, 100]"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise invalid(name, why)
