"""What every endpoint needs: the engine (once it is ready), the served model name, the metrics."""

from common.lora import LoRARequest
from common.validation import POOLING_SERVED
from frontend.async_engine.async_llm import AsyncLLM
from frontend.endpoints.serving.admission import AdmissionGate
from frontend.endpoints.serving.chat_options import ChatOptions
from frontend.endpoints.serving.errors import APIError, engine_unavailable, model_not_found
from frontend.endpoints.serving.limits import HTTPLimits
from frontend.endpoints.serving.lora_adapters import LoRAAdapters
from frontend.endpoints.serving.metrics import Metrics

MAX_SEQUENCES_PER_REQUEST = 1024  # prompts x n in one HTTP request


class ServerState:
    def __init__(self, served_model_name: str | None = None, api_key: str | None = None,
                 limits: HTTPLimits | None = None, chat: ChatOptions | None = None,
                 loras: LoRAAdapters | None = None):
        self.engine: AsyncLLM | None = None  # once the core said READY
        self.chat = chat or ChatOptions()  # how tool calls and reasoning are read out of chat outputs
        self.served_model_name = served_model_name
        self.api_key = api_key
        self.loras = loras or LoRAAdapters()  # adapters a request names as its model
        self.limits = limits or HTTPLimits()
        self.admission = AdmissionGate(self.limits.max_queued_requests)
        self.metrics = Metrics()
        self.startup_error: str | None = None
        self.starting: AsyncLLM | None = None  # created, not yet READY: says what it waits for

    def engine_starting(self, engine: AsyncLLM) -> None:
        self.starting = engine

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.engine.model_info.model_name if self.engine is not None else ""

    def ready_engine(self) -> AsyncLLM:
        """The engine, or a 503 while it is starting, failed to start, or died."""
        if self.engine is None:
            raise engine_unavailable(self.startup_error or self._still_starting())
        if self.engine.dead is not None:
            raise engine_unavailable(str(self.engine.dead))
        return self.engine

    def generating_engine(self) -> AsyncLLM:
        """The engine for an endpoint that generates text (completions, chat, responses): a 400 when it serves
        embeddings (--runner pooling)."""
        engine = self.ready_engine()
        if engine.limits.runner == "pooling":
            raise APIError(400, POOLING_SERVED, param="model")
        return engine

    def _still_starting(self) -> str:
        # a core that refuses this frontend's key looks like one still starting unless we say so
        if self.starting is not None:
            return f"it is still starting ({self.starting.waiting_reason()}); retry shortly"
        return "it is still starting; retry shortly"

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's `model` names (None: the base model); a 404 for a name not served."""
        if name is None or name == self.model_name:
            return None
        lora = self.loras.get(name)
        if lora is None:
            raise model_not_found(name, self.model_name)
        return lora

    def response_model(self, lora: LoRARequest | None) -> str:
        """The `model` a response reports: the adapter's name where the request used one."""
        return lora.lora_name if lora is not None else self.model_name

    def check_chars(self, num_chars: int, param: str) -> None:
        """A prompt's characters against --max-prompt-chars, before any tokenizing."""
        limit = self.limits.max_prompt_chars
        if limit and num_chars > limit:
            raise APIError(400, f"{param} has {num_chars} characters, more than --max-prompt-chars {limit}",
                           param=param, code="prompt_too_long")
