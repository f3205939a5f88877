"""The model a frontend serves, and what it needs to serve it: the core's READY, a tokenizer built from
the files the core sent, the Processor and OutputProcessor for them. Made once per model: a core that
comes back serving another model gets a new ServedModel (AsyncLLM follows it), never a patched one."""

from dataclasses import dataclass

from common.wire_messages import Ready
from frontend.request_path.output_processor import OutputProcessor
from frontend.request_path.processor import Processor
from frontend.request_path.request_tracker import RequestTracker
from frontend.request_path.tokenizer import tokenizer_from_files


@dataclass(frozen=True)
class ServedModel:
    info: Ready
    tokenizer: object
    processor: Processor
    output_processor: OutputProcessor

    @classmethod
    def from_ready(cls, info: Ready, tracker: RequestTracker | None = None, tracing=None) -> "ServedModel":
        """`tracker`: where the output processor keeps its requests' records (AsyncLLM's one tracker, which
        outlives a model change; a fresh one when None); `tracing`: a RequestTracing when tracing is on."""
        tokenizer = tokenizer_from_files(info.tokenizer_files)
        return cls(info, tokenizer, Processor.for_model(tokenizer, info),
                   OutputProcessor(tokenizer, tracker, tracing, info.model_name))

    @property
    def fingerprint(self) -> str:
        return self.processor.fingerprint

    @property
    def name(self) -> str:
        return self.info.model_name
