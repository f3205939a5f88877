"""Tokenizer work off the event loop.

Encoding a long text takes long (about 0.5 s per million characters here) and the tokenizers
library releases the GIL meanwhile, so a big prompt is tokenized in a worker thread while the
event loop goes on serving everyone else. Small texts are tokenized in place: a thread hop costs
more than they do. One worker: big tokenizations queue behind each other, not beside every
request, and the tokenizer is never used by two of them at once.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

BIG_TEXT_CHARS = 4096  # about 3 ms of tokenizing: above it, off the loop
BIG_TOKEN_LIST = 4096  # token ids to decode, likewise
ALWAYS = 1 << 62  # a size that is always big: work whose cost the text length does not tell

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvllm-tokenize")


async def run(work: Callable[[], T], size: int, big: int = BIG_TEXT_CHARS) -> T:
    """work() in place when `size` (characters or tokens) is small, else in the tokenizer thread."""
    if size <= big:
        return work()
    return await asyncio.get_running_loop().run_in_executor(_executor, work)
