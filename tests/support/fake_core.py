"""A stand-in for AsyncMPClient with no process and no socket, for unit tests of the frontend
(EngineRouter, AsyncLLM): it says READY with the default model's tokenizer files and answers each
core request with `tokens_per_request` tokens (ids 100, 101, ...), one output batch per token, unless
`hold` is set, in which case requests wait until the test calls `release()` or `die()`."""

import asyncio
import os

from common import wire_messages as P
from common.limits import RequestLimits
from common.wire_messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason, SchedulerStats
from frontend.core_link.core_client import EngineDeadError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def ready_for(model_dir: str, model_name: str = "fake-model", max_model_len: int = 256) -> P.Ready:
    files = {}
    for name in TOKENIZER_FILES:
        with open(os.path.join(model_dir, name), encoding="utf-8") as f:
            files[name] = f.read()
    return P.Ready(protocol_version=P.PROTOCOL_VERSION, core_id=model_name, model_name=model_name,
                   max_model_len=max_model_len, vocab_size=49152, eos_token_ids=[2], tokenizer_files=files,
                   limits=RequestLimits())


class FakeCoreClient:
    owns_core = False
    reconnects = False

    def __init__(self, ready: P.Ready, address: str = "fake://core", tokens_per_request: int = 3,
                 hold: bool = False):
        self.model_info = ready
        self.address = address
        self.tokens_per_request = tokens_per_request
        self.hold = hold
        self.dead_reason: str | None = None
        self.added: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.held: list[EngineCoreRequest] = []
        self._outputs: asyncio.Queue = asyncio.Queue()
        self.stats = SchedulerStats()

    # ---- what the router calls ----------------------------------------------------------------

    async def handshake(self, timeout: float | None = None) -> P.Ready:
        return self.model_info

    async def get_output(self) -> EngineCoreOutputs:
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def fail_pending_calls(self, error: Exception) -> None:
        pass

    def waiting_reason(self) -> str:
        return f"the fake core at {self.address} has not answered"

    def shutdown(self) -> None:
        pass

    # ---- what AsyncLLM calls -------------------------------------------------------------------

    async def add_request(self, request: EngineCoreRequest) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self.added.append(request)
        if self.hold:
            self.held.append(request)
        else:
            self._answer(request)

    async def abort_requests(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)

    async def call_utility(self, method: str, *args, timeout: float = 10.0):
        return {"ping": True, "get_stats": self.stats, "reset_prefix_cache": True}[method]

    # ---- what a test does ----------------------------------------------------------------------

    def _answer(self, request: EngineCoreRequest) -> None:
        n = min(self.tokens_per_request, request.sampling_params.max_tokens)
        for i in range(n):
            done = FinishReason.LENGTH if i == n - 1 else None
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[100 + i], finish_reason=done)
            self._outputs.put_nowait(EngineCoreOutputs(outputs=[out], scheduler_stats=self.stats))

    def release(self) -> None:
        """Answers the held requests."""
        held, self.held = self.held, []
        for request in held:
            self._answer(request)

    def die(self, why: str = "the fake core died") -> None:
        self.dead_reason = why
        self._outputs.put_nowait(EngineDeadError(why))
