"""AsyncLLM: the engine as the HTTP server sees it.

`async for out in engine.generate(prompt, params, request_id)` yields RequestOutputs as tokens
arrive; `engine.process(...)` then `engine.stream(processed)` does the same in two steps, so the
HTTP layer validates a request (a 400) before any stream starts and sends that same object. The core's output
batches are detokenized by one OutputProcessor and handed to each request through its own asyncio queue.
Cancelling a consumer aborts its request. Each request in flight is one TrackedRequest in `requests`
(frontend/request_path/request_tracker.py): its samples, its core, its stream, its output state, in one record.

The engine is one core (a child process, or a core given by address) or several cores given by
address (frontend/async_engine/engine_router.py picks the least-loaded live one per request). A core that is
lost fails the requests it had; a request that had produced nothing yet moves to another live
core. While no core is up, `dead` says why and requests fail at once; a core given by address is
reconnected by itself, and if it comes back serving another model, the tokenizer, limits and
model name follow it; a child-process core that dies is restarted (restart_core, the default).
"""

import asyncio
import logging
from typing import AsyncIterator, Callable

from common.beam_search_params import BeamSearchParams
from common.config import EngineArgs
from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.sampling_params import SamplingParams
from common.wire_messages import SchedulerStats, UtilityMethod
from frontend.async_engine.engine_router import CoreLink, EngineRouter, sum_stats
from frontend.core_link.core_client import EngineDeadError
from frontend.core_link.core_client_mp import STARTUP_TIMEOUT_SECONDS, AsyncMPClient, lora_args
from frontend.request_path.output_processor import OutputProcessor
from frontend.request_path.outputs import RequestOutput
from frontend.request_path.processor import ProcessedRequest
from frontend.request_path.request_tracing import request_tracing_for
from frontend.request_path.request_tracker import RequestTracker, TrackedRequest
from frontend.request_path.served_model import ServedModel

logger = logging.getLogger("nvllm")


class AsyncLLM:
    def __init__(self, clients: AsyncMPClient | list[AsyncMPClient], otlp_traces_endpoint: str | None = None):
        clients = [clients] if isinstance(clients, AsyncMPClient) else list(clients)
        # tracing (frontend/request_path/request_tracing.py): a span per request when given an OTLP endpoint; None: off
        self.tracing = request_tracing_for(otlp_traces_endpoint)
        self.requests = RequestTracker()  # every request in flight, whichever model or core it is on
        self.router = EngineRouter(clients, self, self.requests)
        self.model: ServedModel | None = None  # what the live cores serve (set at the first READY)
        self.stats = SchedulerStats()
        self.stats_listeners: list[Callable[[SchedulerStats], None]] = []

    @classmethod
    async def create(cls, args: EngineArgs | None = None, address: str | list[str] | None = None,
                     socket_setup=None, restart_core: bool = True,
                     on_starting: Callable[["AsyncLLM"], None] | None = None,
                     otlp_traces_endpoint: str | None = None) -> "AsyncLLM":
        """Starts a core child process for `args` (restarted when it dies, if restart_core), or connects
        to the core(s) at `address` (socket_setup: the CURVE client keys). on_starting(engine) is called
        before any core answers, so that a caller can say why it is still waiting (engine.waiting_reason).
        otlp_traces_endpoint: trace requests to this collector (default: args.otlp_traces_endpoint)."""
        if otlp_traces_endpoint is None and args is not None:
            otlp_traces_endpoint = args.otlp_traces_endpoint
        if address is None:
            clients = [AsyncMPClient(args, None, restart_core=restart_core)]
        else:
            addresses = [address] if isinstance(address, str) else list(address)
            if not addresses or len(set(addresses)) != len(addresses):
                raise ValueError(f"engine core addresses must be given once each, got {addresses}")
            clients = []
            try:
                for a in addresses:
                    clients.append(AsyncMPClient(None, a, socket_setup))
            except BaseException:
                for c in clients:
                    c.shutdown()
                raise
        engine = cls(clients, otlp_traces_endpoint)
        if on_starting is not None:
            on_starting(engine)
        try:
            await engine.router.start(STARTUP_TIMEOUT_SECONDS)
        except BaseException:  # failed or cancelled: stop the core child (if ours) and close the sockets
            engine.shutdown()
            raise
        return engine

    def waiting_reason(self) -> str:
        """Before the first READY: what each core link waits for (a refused CURVE key, no connection, ...)."""
        return self.router.describe()

    @property
    def client(self) -> AsyncMPClient:
        """The first core's client."""
        return self.router.links[0].client

    # ---- the served model -------------------------------------------------------------------

    @property
    def model_info(self):
        return self.model.info if self.model else None

    @property
    def tokenizer(self):
        return self.model.tokenizer if self.model else None

    @property
    def processor(self):
        return self.model.processor if self.model else None

    @property
    def limits(self):
        """What one request may ask for (the served model's, from its core's READY)."""
        return self.model.processor.limits if self.model else None

    @property
    def output_processor(self) -> OutputProcessor | None:
        return self.model.output_processor if self.model else None

    @property
    def fingerprint(self) -> str | None:
        return self.model.fingerprint if self.model else None

    def _follow_model(self) -> None:
        """Keeps the current model while a live core serves it; else takes a live core's model (a core
        given by address may come back serving another one)."""
        if self.model is not None and self.router.live(self.model.fingerprint):
            return
        for link in self.router.links:
            if link.up and link.client.dead_reason is None:
                if self.model is not None:
                    logger.info("the engine now serves %s (was %s)", link.client.model_info.model_name,
                                self.model.name)
                self.model = ServedModel.from_ready(link.client.model_info, self.requests, self.tracing)
                return

    # ---- RouterEvents: cores coming and going, outputs (on the event loop) --------------------

    def core_up(self, link: CoreLink) -> None:
        self._follow_model()
        if link.fingerprint != self.fingerprint:
            logger.error("engine core at %s serves %s, not %s like the others: no requests go there while they are up",
                         link.address, link.client.model_info.model_name, self.model.name)
        self._publish_stats()

    def core_down(self, link: CoreLink, error: EngineDeadError, lost: list[str]) -> None:
        for request_id in lost:
            record = self.requests.remove(request_id)
            if record is not None and record.stream is not None:
                record.stream.put_nowait(error)
        self._follow_model()
        self._publish_stats()

    def core_outputs(self, link: CoreLink, outputs) -> None:
        if outputs.scheduler_stats is not None:
            self._publish_stats()
        if not outputs.outputs or link.fingerprint != self.fingerprint:
            return
        # only outputs of requests this core runs for us (not the last words of one moved elsewhere)
        mine = [o for o in outputs.outputs if self._core_of(o.request_id) is link]
        if len(mine) != len(outputs.outputs):
            outputs.outputs = mine
        results, to_abort = self.output_processor.process_outputs(outputs)  # a finished request leaves the tracker
        for record, ro in results:
            if record.stream is not None:
                record.stream.put_nowait(ro)
        if to_abort:
            asyncio.get_running_loop().create_task(link.client.abort_requests(to_abort))

    def _core_of(self, core_request_id: str):
        record = self.requests.owner_of(core_request_id)
        return record.core if record is not None else None

    def _publish_stats(self) -> None:
        live = self.router.live(self.fingerprint)
        self.stats = sum_stats([link.stats for link in live]) if live else SchedulerStats()
        for listener in self.stats_listeners:
            listener(self.stats)

    # ---- state ------------------------------------------------------------------------------

    @property
    def dead(self) -> EngineDeadError | None:
        """None while a core serving the model is up; else an error that says why none is."""
        if self.router.live(self.fingerprint):
            return None
        links = self.router.links
        if len(links) == 1:
            client = links[0].client
            return EngineDeadError(client.dead_reason or client.waiting_reason())
        return EngineDeadError(f"no engine core is available ({self.router.describe()})")

    @property
    def num_unfinished_requests(self) -> int:
        """Requests this frontend holds state for (tracked: registered for outputs, or placed on a core)."""
        return len(self.requests)

    # ---- requests ---------------------------------------------------------------------------

    def process(self, request_id: str, prompt: str | list[int], sampling_params: SamplingParams,
                prompt_token_ids: list[int] | None = None, cache_salt: str | None = None,
                constraint_field: str | None = None, beam_search: BeamSearchParams | None = None,
                lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """Validates and tokenizes one request for the served model (InvalidParameter names a bad field)."""
        dead = self.dead
        if dead is not None:
            raise dead
        return self.processor.process(request_id, prompt, sampling_params, prompt_token_ids, cache_salt,
                                      constraint_field, beam_search=beam_search, lora_request=lora_request)

    def process_embedding(self, request_id: str, prompt: str | list[int], pooling_params: PoolingParams | None = None,
                          lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """Validates and tokenizes one embedding request (stream() then yields its one EmbeddingRequestOutput)."""
        dead = self.dead
        if dead is not None:
            raise dead
        return self.processor.process_embedding(request_id, prompt, pooling_params, lora_request)

    async def generate(self, prompt: str | list[int] | None, sampling_params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None,
                       cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        request = self.process(request_id, prompt, sampling_params, prompt_token_ids, cache_salt)
        async for out in self.stream(request):
            yield out

    async def stream(self, request: ProcessedRequest) -> AsyncIterator[RequestOutput]:
        """Runs a processed request on a core and yields its outputs; cancelling the consumer aborts it."""
        dead = self.dead
        if dead is not None:
            raise dead
        if request.model_fingerprint != self.fingerprint:
            raise EngineDeadError("the engine core changed its model since this request was checked; send it again")
        outputs, queue, tried = self.output_processor, asyncio.Queue(), []
        finished = produced = False
        record = None
        try:
            while True:
                record = await self._place(request, outputs, queue, tried)
                while not finished:
                    item = await queue.get()
                    if self._moves_on(item, produced, request, tried):
                        logger.info("request %s moves to another engine core: %s", request.request_id, item)
                        break
                    if isinstance(item, BaseException):
                        raise item
                    finished, produced = item.finished, True
                    yield item
                if finished:
                    return
        finally:
            # only this stream's own record (a refused duplicate id must not touch the request that has it)
            if not finished and record is not None and self.requests.get(request.request_id) is record:
                self._abort_now(request.request_id)

    async def _place(self, request: ProcessedRequest, outputs: OutputProcessor, queue: asyncio.Queue,
                     tried: list[CoreLink]) -> TrackedRequest:
        """Tracks the request and sends its core requests to the least-loaded live core not tried yet;
        a core that dies while they are sent is passed over for the next."""
        while True:
            core_requests = outputs.add_request(request, queue)  # a request id in use is refused here
            record = self.requests.get(request.request_id)
            link = self.router.submit(request.request_id, request.model_fingerprint, len(core_requests),
                                      exclude=tried)
            if link is None:
                self.requests.remove(request.request_id)
                raise self.dead or EngineDeadError("the engine core changed its model while this request was "
                                                   "being placed; send it again")
            tried.append(link)
            try:
                for core_request in core_requests:
                    await link.client.add_request(core_request)
                return record
            except EngineDeadError:  # the core went away under us (its reader will say so too)
                if self.requests.get(request.request_id) is record:
                    self.requests.remove(request.request_id)
                if not self._another_core(request, tried):
                    raise

    def _moves_on(self, item, produced: bool, request: ProcessedRequest, tried: list[CoreLink]) -> bool:
        """A request whose core was lost moves to another live core if it has produced nothing yet (its
        client has seen nothing, so running it afresh elsewhere changes nothing for it)."""
        return isinstance(item, EngineDeadError) and not produced and self._another_core(request, tried)

    def _another_core(self, request: ProcessedRequest, tried: list[CoreLink]) -> bool:
        return any(link not in tried for link in self.router.live(request.model_fingerprint))

    def _abort_now(self, request_id: str) -> None:
        record = self.requests.remove(request_id)
        if record is None:
            return
        ids, link = record.unfinished_core_requests(), record.core
        if ids and link is not None and link.up:
            # the consumer may be unwinding a cancellation: send from a task of its own
            asyncio.get_running_loop().create_task(link.client.abort_requests(ids))

    async def abort(self, request_id: str) -> None:
        record = self.requests.remove(request_id)
        if record is not None and record.core is not None:
            await record.core.client.abort_requests(record.unfinished_core_requests())

    # ---- utilities --------------------------------------------------------------------------

    async def _on_live_cores(self, method: UtilityMethod, *args, timeout: float = 10.0, every: bool = False) -> list:
        """Each live core's answer; raises when none answers (`every`: when any fails, with its error)."""
        live = self.router.live(self.fingerprint)
        if not live:
            raise self.dead or EngineDeadError("no engine core is available")
        results = await asyncio.gather(*(link.client.call_utility(method, *args, timeout=timeout) for link in live),
                                       return_exceptions=True)
        good = [r for r in results if not isinstance(r, BaseException)]
        bad = [r for r in results if isinstance(r, BaseException)]
        if not good or (every and bad):
            raise bad[0]
        return good

    async def add_lora(self, lora: LoRARequest, timeout: float = 60.0) -> None:
        """Every live core reads and checks the adapter; ValueError with a core's reason if one refuses it."""
        try:
            await self._on_live_cores(UtilityMethod.ADD_LORA, *lora_args(lora), timeout=timeout, every=True)
        except RuntimeError as e:  # a core's answer: the adapter is bad (EngineDeadError: no core to ask)
            if isinstance(e, EngineDeadError):
                raise
            raise ValueError(str(e)) from None

    async def remove_lora(self, lora: LoRARequest) -> None:
        await self._on_live_cores(UtilityMethod.REMOVE_LORA, *lora_args(lora))

    async def check_health(self) -> None:
        """Raises unless a core serving the model answers a ping."""
        dead = self.dead
        if dead is not None:
            raise dead
        await self._on_live_cores(UtilityMethod.PING, timeout=5.0)

    async def reset_prefix_cache(self) -> bool:
        return all(await self._on_live_cores(UtilityMethod.RESET_PREFIX_CACHE))

    async def get_stats(self) -> SchedulerStats:
        return sum_stats(await self._on_live_cores(UtilityMethod.GET_STATS))

    def shutdown(self) -> None:
        self.router.shutdown()
        if self.tracing is not None:
            self.tracing.shutdown()
