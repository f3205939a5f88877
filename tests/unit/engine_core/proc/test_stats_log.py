"""The engine core's periodic throughput line."""

import logging

import pytest

from common.wire_messages import SchedulerGauges, SchedulerStats, SchedulerTotals, StepCounts
from engine_core.proc.stats_log import ThroughputLog

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_one_line_per_interval_with_rates_and_occupancy(caplog):
    clock = Clock()
    log = ThroughputLog(interval=10, clock=clock)
    caplog.set_level(logging.INFO, logger="nvllm")
    for step in range(20):  # 20 steps of 0.5 s: 100 prompt + 30 generated tokens each
        clock.now += 0.5
        log.record(SchedulerStats(gauges=SchedulerGauges(num_running=3, num_waiting=1, kv_cache_usage=0.25),
                                  totals=SchedulerTotals(prefix_cache_queries=200 * (step + 1),
                                                         prefix_cache_hits=50 * (step + 1)),
                                  step=StepCounts(num_prompt_tokens=100, num_generation_tokens=30)))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["engine: prompt 200.0 tok/s, generation 60.0 tok/s; 3 running, 1 waiting; KV cache 25.0% used; "
                     "prefix cache hit rate 25.0%"]


def test_idle_spells_are_not_counted(caplog):
    clock = Clock()
    log = ThroughputLog(interval=10, clock=clock)
    caplog.set_level(logging.INFO, logger="nvllm")
    clock.now += 3600  # an hour idle, then 11 s of work
    for _ in range(11):
        clock.now += 1
        log.record(SchedulerStats(gauges=SchedulerGauges(num_running=1), step=StepCounts(num_generation_tokens=20)))
    assert [r.getMessage().split(";")[0] for r in caplog.records] == ["engine: prompt 0.0 tok/s, generation 20.0 tok/s"]
