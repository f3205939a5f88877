"""Plumbing for streams of outputs: Server-Sent Events, merging several requests' streams, and
cancelling a request whose client has gone away.

Cancelling the task that iterates AsyncLLM.generate aborts that request in the engine core, so
every path here that gives up on a stream does it by cancellation.
"""

import asyncio
from typing import AsyncIterator, Awaitable, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

T = TypeVar("T")

SSE_DONE = "data: [DONE]\n\n"


def sse(event: BaseModel) -> str:
    return f"data: {event.model_dump_json()}\n\n"


class ClientDisconnected(Exception):
    pass


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(stream index, item) from several streams as items arrive. The first error ends it;
    leaving early (or being cancelled) cancels every stream still running."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`; if the HTTP client disconnects first, cancels it and raises ClientDisconnected."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientDisconnected()
    return task.result()
