"""AsyncLLM: the engine as the HTTP server sees it.

`async for out in engine.generate(prompt, params, request_id)` yields RequestOutputs as tokens
arrive. One reader task takes the core's output batches, detokenizes them and hands each
request its outputs through its own asyncio queue. Cancelling a consumer aborts its request.
"""

import asyncio
import logging
from typing import AsyncIterator, Callable

from common.config import EngineArgs
from common.protocol import SchedulerStats
from common.sampling_params import SamplingParams
from frontend.core_client import EngineDeadError
from frontend.core_client_mp import AsyncMPClient
from frontend.output_processor import OutputProcessor
from frontend.outputs import RequestOutput
from frontend.processor import Processor, child_request
from frontend.tokenizer import tokenizer_from_files

logger = logging.getLogger("nvllm")


class AsyncLLM:
    def __init__(self, client: AsyncMPClient):
        self.client = client
        self.tokenizer = None
        self.processor: Processor | None = None
        self.output_processor: OutputProcessor | None = None
        self.model_info = None
        self.stats = SchedulerStats()
        self.stats_listeners: list[Callable[[SchedulerStats], None]] = []
        self.dead: EngineDeadError | None = None
        self._reader: asyncio.Task | None = None

    @classmethod
    async def create(cls, args: EngineArgs | None = None, address: str | None = None, socket_setup=None) -> "AsyncLLM":
        """Starts a core child process for `args`, or connects to the core at `address`."""
        engine = cls(AsyncMPClient(args, address, socket_setup))
        try:
            await engine.start()
        except BaseException:  # failed or cancelled: stop the core child (if ours) and close the socket
            engine.shutdown()
            raise
        return engine

    async def start(self) -> None:
        await self.client.start()
        self._setup_model(self.client.model_info)
        self._reader = asyncio.create_task(self._read_outputs(), name="nvllm-output-reader")

    def _setup_model(self, info) -> None:
        self.model_info = info
        self.tokenizer = tokenizer_from_files(info.tokenizer_files)
        self.processor = Processor(self.tokenizer, info.max_model_len, info.vocab_size, info.eos_token_ids)
        self.output_processor = OutputProcessor(self.tokenizer)

    @property
    def is_running(self) -> bool:
        return self.dead is None and self._reader is not None and not self._reader.done()

    async def generate(self, prompt: str | list[int] | None, sampling_params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        if self.dead is not None:
            raise self.dead
        text, request = self.processor.process(request_id, prompt, sampling_params, prompt_token_ids)
        queue: asyncio.Queue = asyncio.Queue()
        children = self.output_processor.add_request(request_id, text if text is not None else prompt,
                                                     request.prompt_token_ids, request.sampling_params, queue)
        finished = False
        try:
            for i, cid in enumerate(children):
                await self.client.add_request(child_request(request, cid, i))
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._abort_now(request_id)

    def _abort_now(self, request_id: str) -> None:
        ids = self.output_processor.abort_request(request_id)
        if ids and self.dead is None:
            # the consumer may be unwinding a cancellation: send from a task of its own
            asyncio.get_running_loop().create_task(self.client.abort_requests(ids))

    async def abort(self, request_id: str) -> None:
        ids = self.output_processor.abort_request(request_id)
        await self.client.abort_requests(ids)

    async def _read_outputs(self) -> None:
        try:
            while True:
                outputs = await self.client.get_output()
                if outputs.scheduler_stats is not None:
                    self.stats = outputs.scheduler_stats
                    for listener in self.stats_listeners:
                        listener(outputs.scheduler_stats)
                if not outputs.outputs:
                    continue
                results, to_abort = self.output_processor.process_outputs(outputs)
                for parent, ro in results:
                    if parent.queue is not None:
                        parent.queue.put_nowait(ro)
                if to_abort:
                    await self.client.abort_requests(to_abort)
        except EngineDeadError as e:
            self._fail_all(e)
        except Exception as e:  # a bug here must not leave requests hanging
            logger.exception("output reader failed")
            self._fail_all(EngineDeadError(f"output reader failed: {e}"))

    def _fail_all(self, error: EngineDeadError) -> None:
        self.dead = error
        self.client.fail_pending_calls(error)
        for rid, parent in list(self.output_processor.parents.items()):
            if parent.queue is not None:
                parent.queue.put_nowait(error)
            self.output_processor.abort_request(rid)

    async def check_health(self) -> None:
        """Raises EngineDeadError unless the core answers a ping."""
        if self.dead is not None:
            raise self.dead
        await self.client.call_utility("ping", timeout=5.0)

    async def reset_prefix_cache(self) -> bool:
        return await self.client.call_utility("reset_prefix_cache")

    async def get_stats(self) -> SchedulerStats:
        return await self.client.call_utility("get_stats")

    def shutdown(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.client.shutdown()
