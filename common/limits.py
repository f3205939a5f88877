"""What one request may ask of the engine core.

The core's flags set these; the core sends them to every frontend in READY, so the frontend's 400s
and the core's own check of each ADD apply the same numbers (common/validation.py).
"""

import msgspec


class RequestLimits(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True, frozen=True):
    vocab_size: int = 0  # token ids must be in [0, vocab_size); 0: not known yet (no id check)
    max_model_len: int = 0  # prompt + output tokens; 0: not known yet
    max_n: int = 128  # sequences per prompt
    max_logprobs: int = 20  # top-N logprobs per token (vLLM's --max-logprobs)
    max_stop_strings: int = 64
    max_stop_string_chars: int = 1024  # characters of one stop string
    max_stop_token_ids: int = 1024
    max_request_tokens: int = 4 * 1024 * 1024  # n x max_tokens x (1 + logprobs) of one prompt
    max_request_id_chars: int = 512
    max_cache_salt_chars: int = 1024
    max_constraint_chars: int = 256 * 1024  # a JSON schema's, regex's, grammar's or choice list's text
    max_logit_bias: int = 1024  # entries of logit_bias
    # beams of one beam search: max_n, and no more than one engine step runs (the core sets it; 0: max_n)
    max_beam_width: int = 0
    # embeddings: "pooling" when the core runs --runner pooling (requests must be embedding requests, and only
    # those); the size of its vectors; Matryoshka models may truncate them (`dimensions`): to any size from 1 when
    # matryoshka_dimensions is empty, else to those sizes
    runner: str = "generate"
    embedding_size: int = 0
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()


# the limits an engine flag sets (EngineArgs has a field of the same name for each)
FLAG_LIMITS = ("max_n", "max_logprobs", "max_stop_strings", "max_stop_string_chars", "max_stop_token_ids",
               "max_request_tokens", "max_constraint_chars")
