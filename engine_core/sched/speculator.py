"""What the scheduler asks of a speculative proposer (spec_decode/proposer.py implements it)."""

from typing import Protocol

from engine_core.sched.request import Request


class Speculator(Protocol):
    num_speculative_tokens: int
    disable_by_batch_size: int | None

    def propose(self, request: Request, limit: int) -> list[int]:
        """At most `limit` proposed tokens to follow the request's last one."""
