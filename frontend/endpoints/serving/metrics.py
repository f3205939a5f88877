"""Prometheus metrics for GET /metrics (prometheus-client, one registry per app).

Two sources:
- the engine core's scheduler stats (running / waiting requests, KV blocks, prefix cache),
  fetched fresh from the core at each scrape and exported by a collector;
- per-request figures the frontend sees as tokens stream back (token counters, time to first
  token, inter-token latency, end-to-end latency), recorded by `Metrics.track`.
"""

import time
from typing import AsyncIterator

from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from common.wire_messages import SchedulerStats
from frontend.request_path.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # no *_created series next to every counter and histogram

TTFT_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
ITL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
E2E_BUCKETS = [0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0]


class EngineStatsCollector:
    """Exports the last SchedulerStats the core reported (and whether the core is up)."""

    def __init__(self):
        self.stats: SchedulerStats | None = None
        self.engine_up = False
        self.frontend_requests = 0

    def collect(self):
        up = GaugeMetricFamily("nvllm:engine_up", "1 while the engine core is ready and answering, else 0")
        up.add_metric([], 1.0 if self.engine_up else 0.0)
        yield up
        mine = GaugeMetricFamily("nvllm:frontend_requests_in_flight",
                                 "requests this frontend holds state for (sent to a core, not finished)")
        mine.add_metric([], float(self.frontend_requests))
        yield mine
        if self.stats is None:
            return
        g, s = self.stats.gauges, self.stats.totals
        gauges = [
            ("nvllm:num_requests_running", "requests the core scheduler is running", g.num_running),
            ("nvllm:num_requests_waiting", "requests waiting in the core scheduler's queue", g.num_waiting),
            ("nvllm:kv_cache_usage_perc", "fraction of KV cache blocks in use (0 to 1)", g.kv_cache_usage),
            ("nvllm:kv_cache_free_blocks", "KV cache blocks not held by any request", g.num_free_blocks),
            ("nvllm:kv_cache_total_blocks", "KV cache blocks in the pool", g.num_total_blocks),
            ("nvllm:prefix_cache_hit_rate", "prompt tokens found in the prefix cache / tokens looked up, since start",
             s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        counters = [
            ("nvllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache", s.prefix_cache_queries),
            ("nvllm:prefix_cache_hits", "prompt tokens found in the prefix cache", s.prefix_cache_hits),
            ("nvllm:num_preemptions", "requests preempted (KV cache full) and recomputed later", s.num_preemptions),
            ("nvllm:core_aborted_requests", "requests the engine core stopped on an abort (client gone, stop string)",
             s.num_aborted),
        ]
        counters += [
            ("nvllm:spec_decode_num_drafts", "speculative decoding: steps in which a request verified proposed tokens",
             s.spec_num_drafts),
            ("nvllm:spec_decode_num_draft_tokens", "speculative decoding: tokens proposed", s.spec_num_draft_tokens),
            ("nvllm:spec_decode_num_accepted_tokens", "speculative decoding: proposed tokens the target model kept",
             s.spec_num_accepted_tokens),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
        rate = GaugeMetricFamily("nvllm:spec_decode_acceptance_rate",
                                 "speculative decoding: accepted / proposed tokens, since start")
        rate.add_metric([], s.spec_num_accepted_tokens / s.spec_num_draft_tokens if s.spec_num_draft_tokens else 0.0)
        yield rate
        per_pos = CounterMetricFamily("nvllm:spec_decode_num_accepted_tokens_per_pos",
                                      "speculative decoding: how often the proposal at this position of a step was kept",
                                      labels=["position"])
        for position, value in enumerate(s.spec_accepted_per_position):
            per_pos.add_metric([str(position)], float(value))
        yield per_pos


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.engine = EngineStatsCollector()
        self.registry.register(self.engine)
        r = self.registry
        self.prompt_tokens = Counter("nvllm:prompt_tokens", "prompt tokens of requests that began generating",
                                     registry=r)
        self.generation_tokens = Counter("nvllm:generation_tokens", "tokens generated", registry=r)
        self.request_success = Counter("nvllm:request_success", "finished completions by finish reason "
                                       "(stop, length, abort, error); n > 1 counts n",
                                       ["finished_reason"], registry=r)
        self.ttft = Histogram("nvllm:time_to_first_token_seconds", "arrival to first generated token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("nvllm:inter_token_latency_seconds", "time between two outputs of one request",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("nvllm:e2e_request_latency_seconds", "arrival to the last token",
                             buckets=E2E_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def track(self, stream: AsyncIterator[RequestOutput], n: int = 1) -> AsyncIterator[RequestOutput]:
        """Passes a request's (delta) outputs through, recording its latencies and token counts."""
        start = time.perf_counter()
        last = None
        reasons: dict[int, str] = {}
        try:
            async for out in stream:
                now = time.perf_counter()
                new_tokens = sum(len(c.token_ids) for c in out.outputs)
                if new_tokens:
                    if last is None:
                        self.ttft.observe(now - start)
                        self.prompt_tokens.inc(len(out.prompt_token_ids))
                    else:
                        self.itl.observe(now - last)
                    last = now
                    self.generation_tokens.inc(new_tokens)
                for c in out.outputs:
                    if c.finish_reason is not None:
                        reasons[c.index] = c.finish_reason
                if out.finished:
                    self.e2e.observe(now - start)
                yield out
        finally:
            for reason in reasons.values():
                self.request_success.labels(finished_reason=reason).inc()
            if len(reasons) < n:  # the client went away, or the engine died, before the end
                self.request_success.labels(finished_reason="abort").inc(n - len(reasons))
