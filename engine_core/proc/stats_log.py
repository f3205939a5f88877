"""The engine core's progress line: every LOG_INTERVAL_SECONDS while it works, throughput and occupancy.

Like vLLM's periodic throughput line, so a server's log shows how it is doing; an idle core logs
nothing, and the first window after an idle spell starts where its first step ends.
"""

import logging
import time

from common.wire_messages import SchedulerStats

logger = logging.getLogger("nvllm")

LOG_INTERVAL_SECONDS = 10.0


class ThroughputLog:
    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, clock=time.monotonic):
        self.interval = interval
        self.clock = clock
        self.window_start = self.last_step = clock()
        self.prompt_tokens = self.generation_tokens = 0
        self.queries = self.hits = 0  # the cumulative prefix-cache counters at the window's start
        self.spec = (0, 0, 0)  # and the speculative-decoding ones (drafts, proposed, kept)

    def record(self, stats: SchedulerStats) -> None:
        """One engine step's figures."""
        now = self.clock()
        idle, self.last_step = now - self.last_step > self.interval, now
        if idle:  # a fresh window from this step's end (when its work began is not known)
            self._restart(now, stats)
            return
        if stats.step is not None:
            self.prompt_tokens += stats.step.num_prompt_tokens
            self.generation_tokens += stats.step.num_generation_tokens
        elapsed = now - self.window_start
        if elapsed < self.interval:
            return
        gauges, totals = stats.gauges, stats.totals
        queries, hits = totals.prefix_cache_queries - self.queries, totals.prefix_cache_hits - self.hits
        logger.info("engine: prompt %.1f tok/s, generation %.1f tok/s; %d running, %d waiting; KV cache %.1f%% "
                    "used; prefix cache hit rate %.1f%%", self.prompt_tokens / elapsed,
                    self.generation_tokens / elapsed, gauges.num_running, gauges.num_waiting,
                    100 * gauges.kv_cache_usage, 100 * hits / queries if queries else 0.0)
        drafts = totals.spec_num_drafts - self.spec[0]
        if drafts:
            proposed, kept = totals.spec_num_draft_tokens - self.spec[1], totals.spec_num_accepted_tokens - self.spec[2]
            logger.info("speculative decoding: %.1f%% of proposed tokens kept (%d of %d), %.2f tokens per "
                        "verifying step (kept + 1)", 100 * kept / proposed, kept, proposed, 1 + kept / drafts)
        self._restart(now, stats)

    def _restart(self, now: float, stats: SchedulerStats) -> None:
        self.window_start = now
        self.prompt_tokens = self.generation_tokens = 0
        totals = stats.totals
        self.queries, self.hits = totals.prefix_cache_queries, totals.prefix_cache_hits
        self.spec = (totals.spec_num_drafts, totals.spec_num_draft_tokens, totals.spec_num_accepted_tokens)
