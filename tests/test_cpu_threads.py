"""The engine core's CPU pool: sized to the CPUs other processes leave free."""

import os
import subprocess
import sys
import time

import pytest
import torch

from engine_core.cpu_threads import ThreadPoolSizer, allowed_cpus, pool_size

pytestmark = pytest.mark.unit


def test_pool_size_leaves_busy_cpus_to_their_owners():
    assert pool_size(0.0, 2, 2) == 2
    assert pool_size(0.3, 2, 2) == 2  # housekeeping, a lightly loaded frontend: keep every CPU
    assert pool_size(0.5, 2, 2) == 1
    assert pool_size(1.0, 2, 2) == 1
    assert pool_size(2.0, 2, 2) == 1  # never fewer than one
    assert pool_size(1.0, 8, 8) == 7
    assert pool_size(0.0, 8, 4) == 4  # never more than asked for
    assert pool_size(0.3, 2, 2, taken_at=0.25) == 1  # growing back asks for a clearly free CPU


@pytest.mark.skipif(len(allowed_cpus()) < 2 or not os.path.exists("/proc/stat"),
                    reason="needs two CPUs and /proc/stat")
def test_a_busy_neighbour_takes_a_thread_and_gives_it_back():
    threads_before = torch.get_num_threads()
    cpus = set(allowed_cpus()[:2])
    sizer = ThreadPoolSizer(cpus=cpus)
    assert sizer.threads == 2 == torch.get_num_threads()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {min(cpus)})
        time.sleep(1.2)
        assert sizer.update() == 1 == torch.get_num_threads()
    finally:
        busy.kill()
        busy.wait()
    # once the neighbour is gone (other work on a shared test machine may hold it up a little)
    for _ in range(8):
        time.sleep(1.1)
        if sizer.update() == 2:
            break
    assert sizer.threads == 2 == torch.get_num_threads()
    torch.set_num_threads(threads_before)


def test_a_fixed_pool_stays_as_asked():
    threads_before = torch.get_num_threads()
    sizer = ThreadPoolSizer(1, fixed=True)
    assert sizer.update() == 1 == torch.get_num_threads()
    torch.set_num_threads(threads_before)
