"""One frontend on one or several engine cores (data parallel): a link per core, and the choice of
core for each request.

Each CoreLink owns one AsyncMPClient and a task that handshakes, then reads the core's outputs;
when the core is lost the task says so and handshakes again until a core answers: for a core given
by address, whatever core comes back there (perhaps serving another model); for a child-process core,
the new child the client starts (with a growing delay). A child core that fails at its first start
is a start error. The router picks, per request, the live core with the least load: running + waiting
requests from the core's latest stats (every output batch and heartbeat carries them), plus the
requests this frontend sent it since those stats; ties go round-robin.

Which core runs which request is the `core` of that request's record in the RequestTracker (shared with
AsyncLLM and its OutputProcessor); the router sets and clears it (`submit`, `finish`, `core_of`): when a
core is lost it unplaces that core's requests and hands their ids to the listener. It tells its listener
(RouterEvents, AsyncLLM) about cores and outputs; the listener never edits a link.
"""

import asyncio
import logging
from typing import Protocol

from common.wire_messages import EngineCoreOutputs, SchedulerGauges, SchedulerStats, SchedulerTotals
from frontend.core_link.core_client import EngineDeadError
from frontend.core_link.core_client_mp import AsyncMPClient
from frontend.request_path.processor import model_fingerprint
from frontend.request_path.request_tracker import RequestTracker, TrackedRequest

logger = logging.getLogger("nvllm")

FAILED_HANDSHAKE_PAUSE_SECONDS = 5.0  # before trying again a core that refused this frontend


class CoreLink:
    def __init__(self, client: AsyncMPClient, index: int):
        self.client = client
        self.index = index
        self.up = False  # handshaken and not lost since
        self.fingerprint: str | None = None
        self.stats = SchedulerStats()
        self.sent_since_stats = 0  # core requests sent after the latest stats
        self.task: asyncio.Task | None = None

    @property
    def address(self) -> str:
        return self.client.address

    @property
    def load(self) -> int:
        return self.stats.gauges.num_running + self.stats.gauges.num_waiting + self.sent_since_stats

    def note_stats(self, stats: SchedulerStats) -> None:
        self.stats = stats
        self.sent_since_stats = 0

    def status(self) -> str:
        if self.up:
            return "up"
        return self.client.dead_reason or self.client.waiting_reason()


class RouterEvents(Protocol):
    """What the router tells its listener, on the event loop."""

    def core_up(self, link: CoreLink) -> None:
        """After each READY."""

    def core_down(self, link: CoreLink, error: EngineDeadError, lost: list[str]) -> None:
        """A core was lost; `lost` are the requests it ran, which the router has already forgotten."""

    def core_outputs(self, link: CoreLink, outputs: EngineCoreOutputs) -> None:
        """Each batch a core sends (its stats already noted)."""


class EngineRouter:
    """Runs the links and places each request on a core (in its record in `requests`)."""

    def __init__(self, clients: list[AsyncMPClient], events: RouterEvents, requests: RequestTracker | None = None):
        self.links = [CoreLink(c, i) for i, c in enumerate(clients)]
        self.events = events
        self.requests = requests if requests is not None else RequestTracker()
        self._first_up: asyncio.Event | None = None
        self._start_error: BaseException | None = None
        self._next = 0  # round-robin start among equally loaded cores

    async def start(self, timeout: float) -> None:
        """Runs every link; returns once one core is up (the others keep trying in the background)."""
        loop = asyncio.get_running_loop()
        self._first_up = asyncio.Event()
        for link in self.links:
            link.task = asyncio.create_task(self._run(link, timeout), name=f"nvllm-core-{link.index}")
        waiter = asyncio.create_task(self._first_up.wait())
        deadline = loop.time() + timeout
        try:
            while not self._first_up.is_set():
                pending = [waiter, *(link.task for link in self.links if not link.task.done())]
                if len(pending) == 1:  # every link gave up
                    raise self._start_error or RuntimeError("no engine core could be reached")
                if loop.time() >= deadline:
                    raise TimeoutError(f"no engine core answered within {timeout:.0f} s ({self.describe()})")
                await asyncio.wait(pending, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _run(self, link: CoreLink, timeout: float) -> None:
        client = link.client
        first = True
        while True:
            try:
                await client.handshake(timeout if first and client.owns_core else None)
            except asyncio.CancelledError:
                raise
            except RuntimeError as e:  # REJECTED, or a child process that failed to start
                if not client.reconnects or client.owns_core:
                    self._start_error = e
                    return
                logger.error("engine core at %s: %s; trying again in %.0f s", link.address, e,
                             FAILED_HANDSHAKE_PAUSE_SECONDS)
                await asyncio.sleep(FAILED_HANDSHAKE_PAUSE_SECONDS)
                continue
            except TimeoutError as e:
                self._start_error = e
                return
            if first:
                logger.info("engine core at %s is up, serving %s", link.address, client.model_info.model_name)
            first = False
            link.up = True
            link.fingerprint = model_fingerprint(client.model_info)
            link.note_stats(SchedulerStats())
            self.events.core_up(link)
            if self._first_up is not None:
                self._first_up.set()
            try:
                while True:
                    outputs = await client.get_output()
                    if outputs.scheduler_stats is not None:
                        link.note_stats(outputs.scheduler_stats)
                    self.events.core_outputs(link, outputs)
            except EngineDeadError as e:
                error = e
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug here must not leave requests hanging
                logger.exception("the output reader of engine core %s failed", link.address)
                error = EngineDeadError(f"output reader failed: {e}")
                if client.dead_reason is None:
                    client.dead_reason = str(error)
            link.up = False
            client.fail_pending_calls(error)
            lost = self.requests.on_core(link)
            for record in lost:
                record.core = None
            self.events.core_down(link, error, [record.request_id for record in lost])
            if not client.reconnects:
                return

    def live(self, fingerprint: str | None) -> list[CoreLink]:
        return [link for link in self.links
                if link.up and link.client.dead_reason is None and link.fingerprint == fingerprint]

    def pick(self, fingerprint: str | None, exclude=()) -> CoreLink | None:
        """The least-loaded live core serving `fingerprint`, not in `exclude`; None if there is none."""
        candidates = [link for link in self.live(fingerprint) if link not in exclude]
        if not candidates:
            return None
        n = len(self.links)
        best = min(candidates, key=lambda link: (link.load, (link.index - self._next) % n))
        self._next = (best.index + 1) % n
        return best

    def submit(self, request_id: str, fingerprint: str | None, num_core_requests: int,
               exclude=()) -> CoreLink | None:
        """Places a request on the least-loaded live core serving `fingerprint` (not in `exclude`) and
        counts its core requests there; None if there is no such core. A request not tracked yet is tracked
        with no samples (the router used on its own)."""
        link = self.pick(fingerprint, exclude)
        if link is not None:
            record = self.requests.get(request_id) or self.requests.add(TrackedRequest(request_id))
            record.core = link
            link.sent_since_stats += num_core_requests
        return link

    def finish(self, request_id: str) -> CoreLink | None:
        """Unplaces a request (finished, aborted or about to move); returns the core it was on."""
        record = self.requests.get(request_id)
        if record is None:
            return None
        link, record.core = record.core, None
        return link

    def core_of(self, request_id: str | None) -> CoreLink | None:
        record = self.requests.get(request_id)
        return record.core if record is not None else None

    @property
    def routed_requests(self) -> set[str]:
        return {record.request_id for record in self.requests if record.core is not None}

    def describe(self) -> str:
        return "; ".join(f"{link.address}: {link.status()}" for link in self.links)

    def shutdown(self) -> None:
        for link in self.links:
            if link.task is not None:
                link.task.cancel()
        for link in self.links:
            link.client.shutdown()


def sum_stats(stats: list[SchedulerStats]) -> SchedulerStats:
    """Several cores' gauges and totals as one (KV cache usage weighted by blocks; no step counts)."""
    if len(stats) == 1:
        return stats[0]
    gauges, totals = SchedulerGauges(), SchedulerTotals()
    for s in stats:
        for name in SchedulerGauges.__struct_fields__:
            setattr(gauges, name, getattr(gauges, name) + getattr(s.gauges, name))
        for name in SchedulerTotals.__struct_fields__:
            mine, theirs = getattr(totals, name), getattr(s.totals, name)
            if isinstance(mine, list):  # per position: add elementwise
                width = max(len(mine), len(theirs))
                mine = [sum(v[i] for v in (mine, theirs) if i < len(v)) for i in range(width)]
                setattr(totals, name, mine)
            else:
                setattr(totals, name, mine + theirs)
    if gauges.num_total_blocks:
        gauges.kv_cache_usage = sum(s.gauges.kv_cache_usage * s.gauges.num_total_blocks
                                    for s in stats) / gauges.num_total_blocks
    return SchedulerStats(gauges=gauges, totals=totals)
