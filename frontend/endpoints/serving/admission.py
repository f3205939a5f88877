"""Overload control: at most --max-queued-requests sequences of this frontend may be waiting for
their first token (being tokenized, in flight to a core, or in a core's waiting queue); a request
that arrives while that many wait is answered 503 with Retry-After, before any work is done on it.

Counting here is exact and needs no figures from the cores: a sequence stops waiting when its
first token (or its end) comes back.
"""

from typing import AsyncIterator

from frontend.endpoints.serving.errors import APIError
from frontend.request_path.outputs import RequestOutput

RETRY_AFTER_SECONDS = 1


class Ticket:
    """The waiting sequences of one HTTP request; each is let go once, however the request ends."""

    def __init__(self, gate: "AdmissionGate", count: int):
        self.gate = gate
        self.held = count

    def release(self, count: int | None = None) -> None:
        count = self.held if count is None else min(count, self.held)
        self.held -= count
        self.gate.waiting -= count

    def __del__(self):  # a stream that was never iterated (its client left before the response began)
        if self.held:
            self.release()

    async def track(self, stream: AsyncIterator[RequestOutput], n: int) -> AsyncIterator[RequestOutput]:
        """Passes one engine request's outputs through, releasing each of its n sequences at its
        first token or its end."""
        started: set[int] = set()
        try:
            async for out in stream:
                for c in out.outputs:
                    if c.index not in started and (c.token_ids or c.finish_reason is not None):
                        started.add(c.index)
                        self.release(1)
                yield out
        finally:
            self.release(n - len(started))


class AdmissionGate:
    def __init__(self, limit: int):
        self.limit = limit  # 0: no limit
        self.waiting = 0

    def admit(self, sequences: int) -> Ticket:
        if self.limit and self.waiting >= self.limit:
            raise APIError(503, f"the server is overloaded: {self.waiting} sequences are waiting for their first "
                           f"token (--max-queued-requests {self.limit}); retry shortly",
                           code="server_overloaded", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.waiting += sequences
        return Ticket(self, sequences)
