"""A request as the engine core tracks it, from arrival to finish."""

from enum import IntEnum

from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.wire_messages import EngineCoreRequest, FinishReason
from common.sampling_params import SamplingParams


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # blocks freed; waits to recompute everything it had
    FINISHED = 3


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_ids: list[int] = (), arrival_time: float = 0.0, cache_salt: str | None = None,
                 lora_request: LoRARequest | None = None, pooling_params: PoolingParams | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids)  # checked per token: a set, not a list
        self.cache_salt = cache_salt
        self.lora_request = lora_request  # the adapter it runs with (None: the base model)
        # an embedding request: computes its prompt, answers the pooled vector, samples nothing
        self.pooling_params = pooling_params
        # its pooling reads every prompt position (MEAN) or the first (CLS): prefix-cache hits would skip them
        self.pools_every_position = False
        self.arrival_time = arrival_time
        self.all_token_ids: list[int] = list(prompt_token_ids)  # prompt, then generated tokens
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = -1  # prefix-cache hit at first admission; -1 until admitted
        self.block_ids: list[int] = []  # the block table, managed by the KVCacheManager
        # leading blocks of the table given back to the pool: their keys are out of every layer's sliding window
        # (their ids stay in the table, never read; the blocks may hold another request's keys by now)
        self.num_dropped_blocks = 0
        self.block_hashes: list[int] = []  # hashes of this request's full blocks, in order
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | None = None
        self.num_preemptions = 0
        self.prompt_logprobs: list = []  # Logprobs of prompt tokens 1.. as chunks compute them, until sent
        self.grammar = None  # a RequestGrammar when the request carries an output constraint (set by the core)
        # beam search (sched/beam_group.py): the group, on its root request and on each of its beams; a beam's
        # summed logprob, and the block it copies into a block of its own before its next step (copy on write)
        self.group = None
        self.cum_logprob = 0.0
        self.cow_src: int | None = None

    @classmethod
    def from_engine_core_request(cls, req: EngineCoreRequest) -> "Request":
        return cls(req.request_id, req.prompt_token_ids, req.sampling_params, req.eos_token_ids,
                   req.arrival_time, req.cache_salt, req.lora_request, req.pooling_params)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def scores_prompt(self) -> bool:
        """It asks for prompt logprobs and has not had them: its prompt must be computed, not taken from the
        prefix cache."""
        return self.sampling_params.prompt_logprobs is not None and not self.output_token_ids

    @property
    def computes_every_position(self) -> bool:
        """Its prompt must be computed whole, never taken from the prefix cache (prompt logprobs, MEAN or CLS
        pooling: hidden states of cached positions are not kept)."""
        return self.scores_prompt or self.pools_every_position

    @property
    def is_pooling(self) -> bool:
        return self.pooling_params is not None

    @property
    def is_beam(self) -> bool:
        """One of a beam search's live sequences (the root request stands for the group elsewhere)."""
        return self.group is not None and self.group.root is not self

    @property
    def owner(self) -> "Request":
        """The request the frontend sent: the root for a beam, itself otherwise."""
        return self.group.root if self.is_beam else self

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)
