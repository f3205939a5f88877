"""The frontend: tokenizing, validating, detokenizing, the offline and HTTP APIs. Imports no torch."""

from common.beam_search_params import BeamSearchParams
from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.sampling_params import RequestOutputKind, SamplingParams
from common.structured_outputs import StructuredOutputsParams
from frontend.request_path.outputs import (BeamSearchOutput, BeamSearchSequence, CompletionOutput, EmbeddingOutput,
                                           EmbeddingRequestOutput, Logprob, RequestOutput)


def __getattr__(name):
    # LLM pulls in the engine-core client; import it on first use so `import frontend` stays light
    if name == "LLM":
        from frontend.offline.llm import LLM
        return LLM
    if name == "AsyncLLM":
        from frontend.async_engine.async_llm import AsyncLLM
        return AsyncLLM
    raise AttributeError(name)


__all__ = ["LLM", "AsyncLLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "Logprob", "RequestOutputKind", "BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence",
           "LoRARequest", "PoolingParams", "EmbeddingOutput", "EmbeddingRequestOutput"]
