"""AsyncLLM: the engine as the HTTP server sees it.

`async for out in engine.generate(prompt, params, request_id)` yields RequestOutputs as tokens
arrive. The core's output batches are detokenized by one OutputProcessor and handed to each
request through its own asyncio queue. Cancelling a consumer aborts its request.

The engine is one core (a child process, or a core given by address) or several cores given by
address (frontend/engine_router.py picks the least-loaded live one per request). A core that is
lost fails the requests it had; a request that had produced nothing yet moves to another live
core. While no core is up, `dead` says why and requests fail at once; a core given by address is
reconnected by itself, and if it comes back serving another model, the tokenizer, limits and
model name follow it; a child-process core that dies is restarted (restart_core, the default).
"""

import asyncio
import logging
from typing import AsyncIterator, Callable

from common.config import EngineArgs
from common.protocol import SchedulerStats
from common.sampling_params import SamplingParams
from frontend.core_client import EngineDeadError
from frontend.core_client_mp import STARTUP_TIMEOUT_SECONDS, AsyncMPClient
from frontend.engine_router import CoreLink, EngineRouter, sum_stats
from frontend.output_processor import OutputProcessor
from frontend.outputs import RequestOutput
from frontend.processor import Processor, child_request
from frontend.tokenizer import tokenizer_from_files

logger = logging.getLogger("nvllm")


class AsyncLLM:
    def __init__(self, clients: AsyncMPClient | list[AsyncMPClient]):
        clients = [clients] if isinstance(clients, AsyncMPClient) else list(clients)
        self.router = EngineRouter(clients, self._core_up, self._core_down, self._core_outputs)
        self.tokenizer = None
        self.processor: Processor | None = None
        self.output_processor: OutputProcessor | None = None
        self.model_info = None
        self.fingerprint: str | None = None
        self.stats = SchedulerStats()
        self.stats_listeners: list[Callable[[SchedulerStats], None]] = []
        self._routes: dict[str, CoreLink] = {}  # request id -> the core running it
        self._started = False

    @classmethod
    async def create(cls, args: EngineArgs | None = None, address: str | list[str] | None = None,
                     socket_setup=None, restart_core: bool = True) -> "AsyncLLM":
        """Starts a core child process for `args` (restarted when it dies, if restart_core), or connects
        to the core(s) at `address`."""
        if address is None:
            clients = [AsyncMPClient(args, None, socket_setup, restart_core=restart_core)]
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
        engine = cls(clients)
        try:
            await engine.start()
        except BaseException:  # failed or cancelled: stop the core child (if ours) and close the sockets
            engine.shutdown()
            raise
        return engine

    async def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
        await self.router.start(timeout)
        self._started = True

    @property
    def client(self) -> AsyncMPClient:
        """The first core's client."""
        return self.router.links[0].client

    # ---- cores coming and going (called by the router on the event loop) ------------------------

    def _setup_model(self, info, fingerprint: str) -> None:
        if self.model_info is not None:
            logger.info("the engine now serves %s (was %s)", info.model_name, self.model_info.model_name)
        self.tokenizer = tokenizer_from_files(info.tokenizer_files)
        self.processor = Processor.for_model(self.tokenizer, info)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.model_info, self.fingerprint = info, fingerprint

    def _choose_model(self) -> None:
        """Keeps the current model while a live core serves it; else follows a live core's model."""
        if self.fingerprint is not None and self.router.live(self.fingerprint):
            return
        for link in self.router.links:
            if link.up and link.client.dead_reason is None:
                self._setup_model(link.client.model_info, link.fingerprint)
                return

    def _core_up(self, link: CoreLink) -> None:
        self._choose_model()
        if link.fingerprint != self.fingerprint:
            logger.error("engine core at %s serves %s, not %s like the others: no requests go there while they are up",
                         link.address, link.client.model_info.model_name, self.model_info.model_name)
        self._publish_stats()

    def _core_down(self, link: CoreLink, error: EngineDeadError) -> None:
        for request_id in list(link.requests):
            self._routes.pop(request_id, None)
            parent = self.output_processor.parents.get(request_id)
            if parent is not None:
                if parent.queue is not None:
                    parent.queue.put_nowait(error)
                self.output_processor.abort_request(request_id)
        link.requests.clear()
        self._choose_model()
        self._publish_stats()

    def _core_outputs(self, link: CoreLink, outputs) -> None:
        if outputs.scheduler_stats is not None:
            link.note_stats(outputs.scheduler_stats)
            self._publish_stats()
        if not outputs.outputs or link.fingerprint != self.fingerprint:
            return
        # only outputs of requests this core runs for us (not the last words of one moved elsewhere)
        parents = self.output_processor.child_to_parent
        mine = [o for o in outputs.outputs if self._routes.get(parents.get(o.request_id)) is link]
        if len(mine) != len(outputs.outputs):
            outputs.outputs = mine
        results, to_abort = self.output_processor.process_outputs(outputs)
        for parent, ro in results:
            if parent.queue is not None:
                parent.queue.put_nowait(ro)
            if ro.finished:
                self._unroute(parent.request_id)
        if to_abort:
            asyncio.get_running_loop().create_task(link.client.abort_requests(to_abort))

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
        """Requests this frontend holds state for: registered for outputs, or placed on a core."""
        held = set(self.output_processor.parents) if self.output_processor is not None else set()
        return len(held | set(self._routes))

    @property
    def is_running(self) -> bool:
        return self._started and self.dead is None

    # ---- requests ---------------------------------------------------------------------------

    def _unroute(self, request_id: str) -> CoreLink | None:
        link = self._routes.pop(request_id, None)
        if link is not None:
            link.requests.discard(request_id)
        return link

    async def generate(self, prompt: str | list[int] | None, sampling_params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None,
                       cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        dead = self.dead
        if dead is not None:
            raise dead
        # tokenized for this model: it may go only to cores serving it
        fingerprint, outputs = self.fingerprint, self.output_processor
        text, request = self.processor.process(request_id, prompt, sampling_params, prompt_token_ids, cache_salt)
        queue: asyncio.Queue = asyncio.Queue()
        tried: list[CoreLink] = []
        finished = produced = False

        def another_core() -> bool:
            return any(link not in tried for link in self.router.live(fingerprint))

        try:
            while True:
                link = self.router.pick(fingerprint, exclude=tried)
                if link is None:
                    raise self.dead or EngineDeadError("the engine core changed its model while this request was "
                                                       "being placed; send it again")
                tried.append(link)
                children = outputs.add_request(request_id, text if text is not None else prompt,
                                               request.prompt_token_ids, request.sampling_params, queue)
                self._routes[request_id] = link
                link.requests.add(request_id)
                link.sent_since_stats += len(children)
                try:
                    for i, cid in enumerate(children):
                        await link.client.add_request(child_request(request, cid, i))
                except EngineDeadError:  # the core went away under us (its reader will say so too)
                    self._unroute(request_id)
                    outputs.abort_request(request_id)
                    if not another_core():
                        raise
                    continue
                moved = False
                while not finished:
                    item = await queue.get()
                    if isinstance(item, EngineDeadError) and not produced and another_core():
                        logger.info("request %s moves to another engine core: %s", request_id, item)
                        moved = True
                        break
                    if isinstance(item, BaseException):
                        raise item
                    finished, produced = item.finished, True
                    yield item
                if not moved:
                    return
        finally:
            if not finished:
                self._abort_now(request_id, outputs)
            self._unroute(request_id)

    def _abort_now(self, request_id: str, outputs: OutputProcessor | None = None) -> None:
        ids = (outputs or self.output_processor).abort_request(request_id)
        link = self._unroute(request_id)
        if ids and link is not None and link.up:
            # the consumer may be unwinding a cancellation: send from a task of its own
            asyncio.get_running_loop().create_task(link.client.abort_requests(ids))

    async def abort(self, request_id: str) -> None:
        ids = self.output_processor.abort_request(request_id)
        link = self._unroute(request_id)
        if link is not None:
            await link.client.abort_requests(ids)

    # ---- utilities --------------------------------------------------------------------------

    async def _on_live_cores(self, method: str, timeout: float = 10.0) -> list:
        live = self.router.live(self.fingerprint)
        if not live:
            raise self.dead or EngineDeadError("no engine core is available")
        results = await asyncio.gather(*(link.client.call_utility(method, timeout=timeout) for link in live),
                                       return_exceptions=True)
        good = [r for r in results if not isinstance(r, BaseException)]
        if not good:
            raise results[0]
        return good

    async def check_health(self) -> None:
        """Raises unless a core serving the model answers a ping."""
        dead = self.dead
        if dead is not None:
            raise dead
        await self._on_live_cores("ping", timeout=5.0)

    async def reset_prefix_cache(self) -> bool:
        return all(await self._on_live_cores("reset_prefix_cache"))

    async def get_stats(self) -> SchedulerStats:
        return sum_stats(await self._on_live_cores("get_stats"))

    def shutdown(self) -> None:
        self.router.shutdown()
