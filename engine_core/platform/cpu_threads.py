"""The engine core's CPU threads: torch's OpenMP pool sized to the CPUs other processes leave free.

Why: every matmul and kernel of a step splits its work evenly over the pool and waits for the
slowest thread. On a host where another process keeps a core busy, one of our threads is
descheduled for whole time slices and every parallel region waits for it: two threads beside a
busy process ran at a quarter of their speed. One thread fewer loses only that thread's share.

So the core measures, about once a second between steps, how much CPU time the CPUs it may run on
(its affinity mask) gave to other processes, and sets the pool to the CPUs left, rounded down:
with a neighbour busy on one of two cores it runs one thread, and two again once the neighbour
stops. Our own threads are not "other" work, so the pool's size does not feed back into the
measure. The frontend of `nvllm serve` is another process: when tokenizing and streaming keep it
busy, the core leaves it room the same way (vLLM instead reserves it a whole core).
`--cpu-threads N` fixes the pool at N threads instead.
"""

import logging
import os

import torch

from common.cpu_load import LoadSample, LoadSource, ProcStatLoad

logger = logging.getLogger("nvllm")

_CHECK_SECONDS = 1.0
# a CPU counts as taken once other processes use this much of it: a thread sharing its CPU with
# that much work stalls every parallel region; housekeeping (well under it) does not
_TAKEN = 0.4
# and free again only below this: a frontend whose load follows ours (it streams what we generate)
# would otherwise flip the pool every second
_FREED = 0.25


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def pool_size(others_load: float, num_cpus: int, max_threads: int, taken_at: float = _TAKEN) -> int:
    """Threads for a pool on num_cpus CPUs of which other processes use others_load CPUs' worth, a CPU
    counting as taken once others use `taken_at` of it."""
    taken = int(others_load + 1 - taken_at)
    return max(1, min(max_threads, num_cpus - taken))


class ThreadPoolSizer:
    """Call `update()` between steps: it resizes torch's pool when the free CPUs change."""

    def __init__(self, max_threads: int | None = None, fixed: bool = False, cpus: set[int] | None = None,
                 load: LoadSource | None = None):
        """`load` gives the readings (this host's by default); tests pass their own."""
        self.cpus = cpus or set(allowed_cpus())
        self.max_threads = max(1, min(max_threads or len(self.cpus), len(self.cpus)))
        self.load = load or ProcStatLoad()
        first = self.load.read(self.cpus)
        self.fixed = fixed or first is None  # nothing to measure with: keep the pool as it starts
        self.threads = self.max_threads
        torch.set_num_threads(self.threads)
        self._mark: tuple[float, LoadSample | None] = (self.load.clock(), first)

    def others_load(self) -> float | None:
        """CPUs' worth of work other processes ran on our CPUs since the last check; None if too soon."""
        now = self.load.clock()
        then, before = self._mark
        if now - then < _CHECK_SECONDS:
            return None
        sample = self.load.read(self.cpus)
        self._mark = (now, sample)
        if sample is None or before is None:
            return None
        others = (sample.busy - before.busy) - (sample.own - before.own)
        return max(0.0, others / (now - then))

    def update(self) -> int:
        """The pool's size now (resized first when a check is due)."""
        if self.fixed:
            return self.threads
        load = self.others_load()
        if load is None:
            return self.threads
        wanted = pool_size(load, len(self.cpus), self.max_threads)
        if wanted > self.threads:  # grow only once the load is clearly gone
            wanted = max(self.threads, pool_size(load, len(self.cpus), self.max_threads, _FREED))
        if wanted != self.threads:
            logger.info("CPU threads: %d -> %d (other processes use %.1f of %d CPUs)", self.threads, wanted,
                        load, len(self.cpus))
            self.threads = wanted
            torch.set_num_threads(wanted)
        return self.threads
