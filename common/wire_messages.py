"""Messages between frontend and engine core.

msgspec Structs encoded as msgpack arrays. Each socket decodes with one typed decoder, so a frame
that is not exactly the expected type is a DecodeError the receiver logs and drops (MALFORMED: what a
decode of hostile bytes may raise).
"""

from enum import IntEnum, StrEnum

import msgspec

from common.beam_search_params import BeamSearchParams
from common.limits import RequestLimits
from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.sampling_params import SamplingParams

# msgspec raises UnicodeDecodeError, not DecodeError, for a string that is not UTF-8
MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)

PROTOCOL_VERSION = 7  # 2: frontend sessions (HEARTBEAT, Hello.resume; Ready.frontend_timeout, .resumed);
# 3: SchedulerStats as gauges, totals and step counts; EngineCoreOutputs without engine_index;
# 4: UtilityCall.method a UtilityMethod; EngineCoreOutput.failure (tagged) for error and error_param;
# 5: EngineCoreOutput.prompt_logprobs; 6: EngineCoreRequest.beam_search, EngineCoreOutput.beams,
# EngineCoreRequest.lora_request, Ready.enable_lora, ADD_LORA / REMOVE_LORA;
# 7: EngineCoreRequest.trace_headers, EngineCoreOutput.time_in_queue (tracing); EngineCoreRequest.pooling_params,
# EngineCoreOutput.embedding, RequestLimits' runner and embedding fields (embeddings)


class FinishReason(IntEnum):
    STOP = 0  # EOS, a stop token id (EngineCoreOutput.stop_reason says which id) or a stop string (frontend)
    LENGTH = 1  # max_tokens or max_model_len
    ABORT = 2  # aborted by the client or the engine
    ERROR = 3  # EngineCoreOutput.failure says what failed

    def __str__(self) -> str:
        return ("stop", "length", "abort", "error")[self.value]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    cache_salt: str | None = None  # mixed into the prefix-cache hashes: only requests with the same salt share blocks
    lora_request: LoRARequest | None = None  # the LoRA adapter the request runs with (None: the base model)
    # a beam search: the core runs its beams as one request and answers once, with EngineCoreOutput.beams
    beam_search: BeamSearchParams | None = None
    # tracing: the W3C traceparent/tracestate of the frontend's span for this request; the core's span is its child
    # (None: not traced, and the core does no tracing work for it)
    trace_headers: dict[str, str] | None = None
    # an embedding request (--runner pooling): the core computes the prompt only and answers its pooled vector
    pooling_params: PoolingParams | None = None


class BeamHypothesis(msgspec.Struct, array_like=True, omit_defaults=True):
    """One finished beam: its generated tokens (EOS included when it ended on one), their summed logprob and
    its score (cum_logprob / len(token_ids) ** length_penalty)."""
    token_ids: list[int]
    cum_logprob: float
    score: float
    finish_reason: FinishReason = FinishReason.LENGTH  # STOP: it ended on EOS


class Logprobs(msgspec.Struct, array_like=True, omit_defaults=True):
    """Logprobs of one generated token: the sampled one, then the top N (ids and values)."""

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int] = []
    top_logprobs: list[float] = []


# ---- why a request failed: one tagged struct per meaning -------------------------------------------

class RequestRejected(msgspec.Struct, tag="rejected", array_like=True):
    """The core's own check of an ADD refused a field (the message starts with the field's name)."""
    message: str


class ConstraintFailed(msgspec.Struct, tag="constraint", array_like=True):
    """The output constraint cannot go on (the grammar refused a sampled token): about the request's `field`."""
    field: str
    message: str


class EngineFailed(msgspec.Struct, tag="engine", array_like=True):
    """The engine failed the request (a step raised, the runner answered wrongly, no room): not the request's fault."""
    message: str


class CoreShutDown(msgspec.Struct, tag="shutdown", array_like=True):
    """With finish_reason ABORT: the core shut down while the request ran."""
    message: str


class SessionLost(msgspec.Struct, tag="session_lost", array_like=True):
    """Made by a frontend's client, never sent: the core ended this frontend's session, and its requests."""
    message: str


Failure = RequestRejected | ConstraintFailed | EngineFailed | CoreShutDown | SessionLost


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[Logprobs] = []
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None  # the stop token id that ended it (only that: stop strings are the frontend's)
    num_cached_tokens: int = 0
    failure: Failure | None = None  # with finish_reason ERROR (or ABORT, CoreShutDown): what went wrong
    # with the first token of a request that asked for prompt logprobs: those of prompt tokens 1.. (token 0 has none)
    prompt_logprobs: list[Logprobs] = []
    # a finished beam search: its beam_width best beams, best score first (new_token_ids stays empty)
    beams: list[BeamHypothesis] = []
    # a traced request's first output: seconds it waited in the core's queue before it was first scheduled
    time_in_queue: float | None = None
    # a finished embedding request: its vector, float32 little-endian (bytes: a quarter of msgpack's floats)
    embedding: bytes = b""

    @property
    def error(self) -> str | None:
        return self.failure.message if self.failure is not None else None

    @property
    def error_param(self) -> str | None:
        """The request field the failure is about (None: the engine failed, not the request)."""
        return self.failure.field if isinstance(self.failure, ConstraintFailed) else None


class SchedulerGauges(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """The scheduler as it is now."""
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    kv_cache_usage: float = 0.0


class SchedulerTotals(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """Counts since the core started (they only grow)."""
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    num_preemptions: int = 0
    # speculative decoding: verification steps of a request with proposals, tokens proposed, tokens kept,
    # and how often the j-th proposal of a step was kept
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = []
    # requests the core stopped on an ABORT it had work for (a client gone, a stop string the frontend found)
    num_aborted: int = 0


class StepCounts(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """What one engine step computed."""
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0


class SchedulerStats(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """Gauges and totals in every batch, heartbeat and get_stats answer; `step` only in the batch of the
    step it counts (a heartbeat repeats the latest gauges and totals, never a step's counts)."""
    gauges: SchedulerGauges = msgspec.field(default_factory=SchedulerGauges)
    totals: SchedulerTotals = msgspec.field(default_factory=SchedulerTotals)
    step: StepCounts | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0


# ---- frames ------------------------------------------------------------------------------------
# Every frame is [one type byte, msgpack body]. Frontends talk to the core's ROUTER socket through
# a DEALER, so the core sees [frontend identity, type, body] and answers the same identity.


# frames a frontend sends
HELLO = b"\x01"  # body: Hello
ADD = b"\x02"  # body: EngineCoreRequest
ABORT = b"\x03"  # body: list[str] of request ids
UTILITY = b"\x04"  # body: UtilityCall
GOODBYE = b"\x05"  # body: empty; the frontend is leaving
HEARTBEAT = b"\x06"  # body: empty; the frontend is alive (sent while it waits for outputs)

# frames the core sends
READY = b"\x81"  # body: Ready
OUTPUTS = b"\x82"  # body: EngineCoreOutputs (also sent as a heartbeat when idle)
UTILITY_RESULT = b"\x83"  # body: UtilityResult
SHUTDOWN = b"\x84"  # body: str, why the core is going away
REJECTED = b"\x85"  # body: str, e.g. a protocol version the core does not speak
UNKNOWN_FRONTEND = b"\x86"  # body: str; a frame came from a frontend that has no session with this core
#                             (the core restarted, or ended the session: the connection dropped, or the frontend
#                             was silent too long): the frontend's requests there are lost, it must say HELLO


class Hello(msgspec.Struct, array_like=True, omit_defaults=True):
    protocol_version: int
    client_name: str = ""
    # False: start afresh (the core aborts what this frontend had running in its session); True: keep the
    # session if the core still has it on this connection (a client that was only quiet for a while)
    resume: bool = False


class Ready(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    protocol_version: int
    core_id: str  # new at every core start, so a frontend can tell a restarted core
    engine_index: int = 0
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    tokenizer_files: dict[str, str]  # empty in a repeated READY on the same connection: keep the known files
    block_size: int = 16
    num_gpu_blocks: int = 0
    dtype: str = ""
    frontend_timeout: float = 0.0  # the core ends the session of a frontend silent this long (0: not said)
    resumed: bool = False  # answering HELLO(resume=True): the session, with its requests, lives on
    limits: RequestLimits = RequestLimits()  # what a request may ask for; the core refuses more
    enable_lora: bool = False  # requests may name a LoRA adapter (--enable-lora)


class UtilityMethod(StrEnum):
    """What a UtilityCall asks the core; any other name is a decode error (the core drops the frame)."""
    RESET_PREFIX_CACHE = "reset_prefix_cache"
    GET_STATS = "get_stats"
    PING = "ping"
    ADD_LORA = "add_lora"  # args: lora_name, lora_int_id, lora_path; checks and reads the adapter (error: why not)
    REMOVE_LORA = "remove_lora"  # args: lora_name, lora_int_id, lora_path; forgets its CPU copy


class UtilityCall(msgspec.Struct, array_like=True, omit_defaults=True):
    call_id: int
    method: UtilityMethod
    args: list[int | float | str | bool | None] = []


class UtilityResult(msgspec.Struct, array_like=True, omit_defaults=True):
    call_id: int
    result: int | float | str | bool | None | SchedulerStats = None
    error: str | None = None
