"""What the offline and async APIs return, shaped like vLLM's RequestOutput (and EmbeddingRequestOutput)."""

import struct
from dataclasses import dataclass, field


@dataclass
class Logprob:
    """A token's log probability, its rank among the vocabulary, and its text."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request (there are `n`): its text and tokens, why it finished, and logprobs when asked.
    """
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token: sampled + top N
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (the error's text)
    error_param: str | None = None  # with finish_reason "error": the request field it is about, if it is one
    score: float | None = None  # beam search: cumulative_logprob / len(token_ids) ** length_penalty

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What `LLM.generate` and `LLM.chat` return per prompt, shaped like vLLM's: the prompt, its token ids and its
    completions (`outputs`); `num_cached_tokens` is how many prompt tokens came from the prefix cache."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)  # arrival, first_token, last_token times (s)
    # with SamplingParams.prompt_logprobs: per prompt token, its logprob given the tokens before it (None for the
    # first token), with the top ids, as vLLM gives them
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class BeamSearchSequence:
    """One finished beam, shaped like vLLM's: `tokens` and `text` include the prompt, as vLLM's do."""
    tokens: list[int]
    text: str
    cum_logprob: float
    score: float
    finish_reason: str  # "stop" (it ended on EOS) or "length"
    output_token_ids: list[int]
    output_text: str


@dataclass
class BeamSearchOutput:
    """A beam search's beams for one prompt, best score first."""
    sequences: list[BeamSearchSequence]


@dataclass
class EmbeddingOutput:
    """One prompt's vector, as vLLM's EmbeddingOutput: `.embedding` (floats) and `.hidden_size`. `data` holds it
    as the core sent it, float32 little-endian (what /v1/embeddings base64-encodes as it is)."""
    data: bytes

    @property
    def embedding(self) -> list[float]:
        return list(struct.unpack(f"<{len(self.data) // 4}f", self.data))

    @property
    def hidden_size(self) -> int:
        return len(self.data) // 4


@dataclass
class EmbeddingRequestOutput:
    """What LLM.embed returns per prompt, shaped like vLLM's: `.outputs.embedding`, `.prompt_token_ids`."""
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    error: str | None = None  # the engine failed the request (outputs.embedding is then empty)
