"""One check of every EngineCoreRequest field, used twice: by the frontend's Processor (a bad field
is a 400 naming it) and by the engine core on every ADD it decodes (an ERROR output naming it), so
the busy loop never sees a request it could fail on.

Every error is an InvalidParameter (common/errors.py): its `param` is the field, which the HTTP layer
reports as `error.param`, and its message starts with it.
"""

import math

from common.errors import InvalidParameter, invalid
from common.limits import RequestLimits
from common.lora import MAX_LORA_NAME_CHARS, MAX_LORA_PATH_CHARS, LoRARequest
from common.wire_messages import EngineCoreRequest
from common.sampling_params import SamplingParams
from common.structured_outputs import check_structured_outputs
from common.tracing import TRACE_HEADERS


def request_token_cost(params: SamplingParams, max_tokens: int) -> int:
    """What one prompt may make the engine produce: tokens, each with its logprob entries."""
    return params.n * max_tokens * (1 + (params.logprobs or 0))


def check_token_ids(field: str, ids, limits: RequestLimits) -> None:
    if not ids:
        return
    low, high = min(ids), max(ids)
    top = limits.vocab_size if limits.vocab_size > 0 else 2**31
    if low < 0 or high >= top:
        bad = low if low < 0 else high
        raise invalid(field, f"holds token id {bad}, outside the vocabulary [0, {top})")


def check_sampling_params(params: SamplingParams, limits: RequestLimits, num_prompt_tokens: int,
                          compile_constraint: bool = False, constraint_field: str | None = None) -> None:
    """compile_constraint: also have llguidance compile the output constraint (the frontend's check; the
    engine core compiles it off its busy loop and fails the request there instead). constraint_field: what
    the caller's API calls the constraint, for its errors (structured_outputs.<kind> when None)."""
    params.validate()
    room = limits.max_model_len - num_prompt_tokens if limits.max_model_len > 0 else None
    checks = [
        (params.n <= limits.max_n, "n", f"must be at most {limits.max_n} (--max-n), got {params.n}"),
        (params.logprobs is None or params.logprobs <= limits.max_logprobs, "logprobs",
         f"must be at most {limits.max_logprobs} (--max-logprobs), got {params.logprobs}"),
        (params.prompt_logprobs is None or params.prompt_logprobs <= limits.max_logprobs, "prompt_logprobs",
         f"must be at most {limits.max_logprobs} (--max-logprobs), got {params.prompt_logprobs}"),
        (len(params.stop) <= limits.max_stop_strings, "stop",
         f"holds {len(params.stop)} strings; at most {limits.max_stop_strings} are allowed (--max-stop-strings)"),
        (all(len(s) <= limits.max_stop_string_chars for s in params.stop), "stop",
         f"strings must be at most {limits.max_stop_string_chars} characters long (--max-stop-string-chars)"),
        (len(params.stop_token_ids) <= limits.max_stop_token_ids, "stop_token_ids",
         f"holds {len(params.stop_token_ids)} ids; at most {limits.max_stop_token_ids} are allowed "
         f"(--max-stop-token-ids)"),
        (room is None or params.max_tokens is None or params.max_tokens <= room, "max_tokens",
         f"{params.max_tokens} plus the prompt's {num_prompt_tokens} tokens exceeds max_model_len "
         f"{limits.max_model_len} (at most {room} new tokens fit)"),
    ]
    for ok, name, why in checks:
        if not ok:
            raise invalid(name, why)
    check_token_ids("stop_token_ids", params.stop_token_ids, limits)
    check_token_ids("allowed_token_ids", params.allowed_token_ids, limits)
    if params.logit_bias:
        if len(params.logit_bias) > limits.max_logit_bias:
            raise invalid("logit_bias", f"holds {len(params.logit_bias)} entries; at most {limits.max_logit_bias} "
                                        f"are allowed")
        check_token_ids("logit_bias", list(params.logit_bias), limits)
    if params.structured_outputs is not None:
        check_token_ids("structured_outputs.starts_after_token_ids",
                        params.structured_outputs.starts_after_token_ids, limits)
        check_structured_outputs(params.structured_outputs, limits.max_constraint_chars, compile_constraint,
                                 field=constraint_field)
    max_tokens = params.max_tokens if params.max_tokens is not None else (room or 0)
    cost = request_token_cost(params, max_tokens)
    if cost > limits.max_request_tokens:
        raise InvalidParameter("max_tokens", f"max_tokens {max_tokens} x n ({params.n}) x (1 + logprobs "
                         f"({params.logprobs or 0})) is {cost}, more than one request may ask for "
                         f"({limits.max_request_tokens}, --max-request-tokens)")


def check_prompt(ids: list[int], limits: RequestLimits, generates: bool = True) -> None:
    """generates: tokens follow the prompt, so it must leave room for one (an embedding's prompt may fill
    max_model_len)."""
    if not ids:
        raise invalid("prompt", "must not be empty (it has 0 tokens)")
    if not generates and limits.max_model_len > 0 and len(ids) > limits.max_model_len:
        raise InvalidParameter("prompt", f"prompt has {len(ids)} tokens, more than max_model_len "
                                         f"{limits.max_model_len}")
    if generates and limits.max_model_len > 0 and len(ids) >= limits.max_model_len:
        raise InvalidParameter("prompt", f"prompt has {len(ids)} tokens, which leaves no room to generate within "
                         f"max_model_len {limits.max_model_len}")
    check_token_ids("prompt", ids, limits)


def check_beam_search(request: EngineCoreRequest, limits: RequestLimits) -> None:
    """A beam search runs beam_width sequences of max_tokens each: its sampling_params carry the same n and
    max_tokens, which check_sampling_params then holds to the request limits (max_model_len, the token cost)."""
    beam = request.beam_search
    if limits.max_beam_width and beam.beam_width > limits.max_beam_width:
        raise invalid("beam_width", f"must be at most {limits.max_beam_width} (--max-n, and no more sequences than "
                                    f"one engine step runs), got {beam.beam_width}")
    beam.validate(limits.max_n)
    if request.sampling_params.max_tokens != beam.max_tokens:
        raise invalid("max_tokens", f"of the sampling parameters ({request.sampling_params.max_tokens}) must equal "
                                    f"the beam search's ({beam.max_tokens})")
    if request.sampling_params.n != beam.beam_width:
        raise invalid("n", f"of a beam search is its beam_width ({beam.beam_width}), got {request.sampling_params.n}")


def check_request(request: EngineCoreRequest, limits: RequestLimits, compile_constraint: bool = False,
                  constraint_field: str | None = None) -> None:
    """Raises InvalidParameter naming the first bad field of the request and its limit."""
    if not request.request_id or len(request.request_id) > limits.max_request_id_chars:
        raise InvalidParameter("request_id", f"request_id must be 1 to {limits.max_request_id_chars} characters, got "
                         f"{len(request.request_id)}")
    check_runner(request, limits)
    check_prompt(request.prompt_token_ids, limits, generates=request.pooling_params is None)
    if request.pooling_params is not None:
        check_pooling_request(request, limits)
    elif request.beam_search is not None:  # first: a width over the limit is named as the beam search's
        check_beam_search(request, limits)
    if request.pooling_params is None:
        check_sampling_params(request.sampling_params, limits, len(request.prompt_token_ids), compile_constraint,
                              constraint_field)
    if len(request.eos_token_ids) > limits.max_stop_token_ids:
        raise InvalidParameter("eos_token_ids", f"eos_token_ids holds {len(request.eos_token_ids)} ids; at most "
                         f"{limits.max_stop_token_ids} are allowed")
    check_token_ids("eos_token_ids", request.eos_token_ids, limits)
    if not math.isfinite(request.arrival_time):
        raise InvalidParameter("arrival_time", f"arrival_time must be a finite number, got {request.arrival_time}")
    if request.cache_salt is not None and len(request.cache_salt) > limits.max_cache_salt_chars:
        raise InvalidParameter("cache_salt", f"cache_salt must be at most {limits.max_cache_salt_chars} characters, got "
                         f"{len(request.cache_salt)}")
    if request.lora_request is not None:
        check_lora_request(request.lora_request)
    if request.trace_headers is not None:
        check_trace_headers(request.trace_headers)


# W3C trace context: traceparent is 55 characters, tracestate at most 32 members in 512
MAX_TRACE_HEADER_CHARS = 512


def check_trace_headers(headers: dict[str, str]) -> None:
    """Only traceparent and tracestate, each a short string (what a span context needs, nothing more)."""
    for name, value in headers.items():
        if name not in TRACE_HEADERS:
            raise invalid("trace_headers", f"may hold only {' and '.join(TRACE_HEADERS)}, got {name[:40]!r}")
        if len(value) > MAX_TRACE_HEADER_CHARS:
            raise invalid("trace_headers", f"{name} must be at most {MAX_TRACE_HEADER_CHARS} characters, got "
                                           f"{len(value)}")


POOLING_SERVED = "the model is served for embeddings (--runner pooling): use /v1/embeddings or LLM.embed"
NOT_POOLING = ("the model is not served for embeddings: start the engine with --runner pooling "
               "(LLM(..., runner=\"pooling\"))")


def check_runner(request: EngineCoreRequest, limits: RequestLimits) -> None:
    """A pooling engine takes embedding requests only, a generating one none."""
    if limits.runner == "pooling" and request.pooling_params is None:
        raise InvalidParameter("model", POOLING_SERVED)
    if limits.runner != "pooling" and request.pooling_params is not None:
        raise InvalidParameter("model", NOT_POOLING)


def check_pooling_request(request: EngineCoreRequest, limits: RequestLimits) -> None:
    """An embedding request samples nothing (no beams, samples, prompt logprobs or constraints) and asks for
    `dimensions` only of a Matryoshka model, and only sizes it was trained for."""
    params = request.sampling_params
    if (request.beam_search is not None or params.n != 1 or params.prompt_logprobs is not None
            or params.structured_outputs is not None):
        raise invalid("pooling_params", "an embedding request samples nothing: no beam search, n, prompt "
                                        "logprobs or output constraint")
    dimensions = request.pooling_params.dimensions
    if dimensions is None:
        return
    if not limits.matryoshka:
        raise invalid("dimensions", "the model does not support Matryoshka truncation (its config.json says no "
                                    "is_matryoshka or matryoshka_dimensions): leave dimensions out")
    sizes = limits.matryoshka_dimensions
    if sizes and dimensions not in sizes:
        raise invalid("dimensions", f"must be one of the model's matryoshka_dimensions {list(sizes)}, got "
                                    f"{dimensions}")
    top = limits.embedding_size or 2**31
    if not 1 <= dimensions <= top:
        raise invalid("dimensions", f"must be from 1 to {top}, got {dimensions}")


def check_lora_request(lora: LoRARequest) -> None:
    """The adapter's name, id and path are well formed (whether its files are is the engine core's check)."""
    if not lora.lora_name or len(lora.lora_name) > MAX_LORA_NAME_CHARS:
        raise invalid("lora_request.lora_name", f"must be 1 to {MAX_LORA_NAME_CHARS} characters, got "
                                                f"{len(lora.lora_name)}")
    if not 1 <= lora.lora_int_id < 2**63:
        raise invalid("lora_request.lora_int_id", f"must be a positive integer, got {lora.lora_int_id}")
    if not lora.lora_path or len(lora.lora_path) > MAX_LORA_PATH_CHARS or "\x00" in lora.lora_path:
        raise invalid("lora_request.lora_path", f"must be a path of 1 to {MAX_LORA_PATH_CHARS} characters")
