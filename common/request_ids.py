"""The one way request ids are composed.

A request that becomes several (the prompts of one HTTP request, the n samples of one prompt) gives
its parts `part_id(parent, i)`; a request with one part keeps its own id. The engine core keeps
frontends apart by scoping each frontend's ids with its session tag (`scoped_id`), and strips the
scope again before it sends outputs back. Nothing parses ids: whoever composes one keeps the
mapping back (the OutputProcessor from sample to request, the core from scoped id to session).
"""

SCOPE_SEPARATOR = "|"


def part_id(parent: str, index: int) -> str:
    return f"{parent}-{index}"


def sample_id(request_id: str, index: int, n: int) -> str:
    """The core request id of sample `index` of n (the request's own id when n is 1)."""
    return request_id if n == 1 else part_id(request_id, index)


def scoped_id(scope: str, request_id: str) -> str:
    return f"{scope}{SCOPE_SEPARATOR}{request_id}"


def unscoped_id(scoped: str) -> str:
    return scoped.split(SCOPE_SEPARATOR, 1)[1]
