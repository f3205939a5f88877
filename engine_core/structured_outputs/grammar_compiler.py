"""Compiling constraints against the model's vocabulary, off the busy loop and once per constraint.

A compile is llguidance building its parser for the grammar text (about 1-3 ms for a typical JSON schema
here; a pathological grammar is bounded by llguidance's parser limits). It runs in a worker thread (the
library drops the GIL meanwhile) and the result, a matcher in its start state, is cached by constraint:
every request with that constraint starts from a copy of it. The vocabulary index llguidance needs
(~0.2 s for 49k tokens) is built once, in the same thread, before the first compile (not at start: most
cores never see a constraint).
"""

import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from threading import Lock

from common.structured_outputs import StructuredOutputsParams, grammar_text

logger = logging.getLogger("nvllm")

CACHE_ENTRIES = 256


@dataclass(frozen=True)
class CompiledGrammar:
    """A matcher in its start state (copied for each request), or why the constraint did not compile."""
    start: object | None  # llguidance.LLMatcher
    error: str = ""


def first_line(message: str) -> str:
    """llguidance's errors may go on with a dump of the parser state; the reason is its first line."""
    return message.strip().splitlines()[0][:2000] if message.strip() else "unknown error"


class GrammarCompiler:
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvllm-grammar")
        self._cache: "OrderedDict[tuple[str, str], Future[CompiledGrammar]]" = OrderedDict()
        self._lock = Lock()
        self._vocabulary_args = (tokenizer_json, vocab_size, list(eos_token_ids))
        self._tokenizer = None  # llguidance.LLTokenizer, built by the worker thread on first use
        self.compiles = self.hits = 0

    def compile(self, params: StructuredOutputsParams) -> "Future[CompiledGrammar]":
        """The constraint's compiled grammar, now (cached) or later (compiling in the worker thread)."""
        key = params.key()
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return future
            future = self._pool.submit(self._compile, key)
            self._cache[key] = future
            self.compiles += 1
            if len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)  # requests holding its future keep it alive
            return future

    def _compile(self, key: tuple[str, str]) -> CompiledGrammar:
        import llguidance
        start = time.perf_counter()
        try:
            if self._tokenizer is None:
                self._tokenizer = _vocabulary(*self._vocabulary_args)
                logger.info("structured outputs: llguidance's vocabulary index built in %.0f ms",
                            (time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
            matcher = llguidance.LLMatcher(self._tokenizer, grammar_text(*key), log_level=0)
        except Exception as e:  # a tokenizer llguidance cannot read, a grammar text it cannot parse
            return CompiledGrammar(None, first_line(str(e)))
        logger.debug("compiled a %s constraint of %d characters in %.2f ms", key[0], len(key[1]),
                     (time.perf_counter() - start) * 1e3)
        if matcher.is_error():
            return CompiledGrammar(None, first_line(matcher.get_error()))
        return CompiledGrammar(matcher)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _vocabulary(tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
    import llguidance
    # n_vocab: the logits' width (the embedding may have more rows than the tokenizer has tokens)
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
