"""The engine core's CPU pool: sized to the CPUs other processes leave free.

The sizer's tests feed it chosen load readings (ScriptedLoad), so they check the sizing rule and not
how busy the machine running them happens to be; one test checks that this host's reader reads."""

import os

import pytest
import torch

from common.cpu_load import LoadSample, ProcStatLoad
from engine_core.platform.cpu_threads import ThreadPoolSizer, pool_size

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """The sizer sets torch's pool for the whole process: put it back whatever a test did or failed at."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


class ScriptedLoad:
    """A LoadSource whose clock and CPU times advance only when the test says so."""

    def __init__(self):
        self.now = 100.0
        self.busy = 5000.0  # every process's CPU time on the CPUs since boot
        self.own = 20.0  # this process's CPU time

    def advance(self, seconds: float, others: float, own: float = 0.0) -> None:
        """`seconds` pass in which other processes use `others` CPUs' worth and we use `own`."""
        self.now += seconds
        self.own += own * seconds
        self.busy += (others + own) * seconds

    def clock(self) -> float:
        return self.now

    def read(self, cpus: set[int]) -> LoadSample:
        return LoadSample(self.busy, self.own)


def test_pool_size_leaves_busy_cpus_to_their_owners():
    assert pool_size(0.0, 2, 2) == 2
    assert pool_size(0.3, 2, 2) == 2  # housekeeping, a lightly loaded frontend: keep every CPU
    assert pool_size(0.5, 2, 2) == 1
    assert pool_size(1.0, 2, 2) == 1
    assert pool_size(2.0, 2, 2) == 1  # never fewer than one
    assert pool_size(1.0, 8, 8) == 7
    assert pool_size(0.0, 8, 4) == 4  # never more than asked for
    assert pool_size(0.3, 2, 2, taken_at=0.25) == 1  # growing back asks for a clearly free CPU


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back():
    load = ScriptedLoad()
    sizer = ThreadPoolSizer(cpus={0, 1}, load=load)
    assert sizer.threads == 2 == torch.get_num_threads()
    load.advance(0.5, others=1.0, own=1.0)
    assert sizer.update() == 2  # too soon to measure: no change
    load.advance(0.7, others=1.0, own=1.0)  # a neighbour spins on one CPU
    assert sizer.update() == 1 == torch.get_num_threads()
    load.advance(1.2, others=0.3, own=1.0)  # its leftovers: not yet clearly free, so no flip back
    assert sizer.update() == 1 == torch.get_num_threads()
    load.advance(1.2, others=0.05, own=1.0)  # the neighbour is gone
    assert sizer.update() == 2 == torch.get_num_threads()


def test_our_own_threads_do_not_count_as_a_neighbour():
    load = ScriptedLoad()
    sizer = ThreadPoolSizer(cpus={0, 1}, load=load)
    load.advance(1.5, others=0.0, own=2.0)  # both CPUs busy, all of it ours
    assert sizer.update() == 2 == torch.get_num_threads()


def test_a_fixed_pool_stays_as_asked():
    load = ScriptedLoad()
    sizer = ThreadPoolSizer(1, fixed=True, load=load)
    load.advance(2.0, others=0.0)
    assert sizer.update() == 1 == torch.get_num_threads()


def test_without_readings_the_pool_stays_as_it_starts():
    class NoReadings(ScriptedLoad):
        def read(self, cpus):
            return None

    load = NoReadings()
    sizer = ThreadPoolSizer(cpus={0, 1}, load=load)
    assert sizer.fixed
    load.advance(2.0, others=2.0)
    assert sizer.update() == 2 == torch.get_num_threads()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat (Linux)")
def test_this_hosts_reader_counts_our_own_work():
    cpus = set(os.sched_getaffinity(0))
    before = ProcStatLoad.read(cpus)
    start = ProcStatLoad.clock()
    while ProcStatLoad.read(cpus).own - before.own < 0.05:  # spin until the kernel has charged us some time
        assert ProcStatLoad.clock() - start < 120, "os.times() never grew"
    after = ProcStatLoad.read(cpus)
    assert after.busy >= before.busy and after.own > before.own
