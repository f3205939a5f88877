"""How busy this host's CPUs are, from /proc/stat (Linux). No torch: the frontend's benchmarks use it too."""

import os
import time
from typing import NamedTuple, Protocol

# /proc/stat fields after the cpu name: user nice system idle iowait irq softirq steal ...
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # steal too: time the hypervisor gave elsewhere is not ours to use


def all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def busy_ticks(cpus: set[int]) -> int | None:
    """Clock ticks the given CPUs spent busy since boot, or None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            total = 0
            for line in f:
                name, _, rest = line.partition(" ")
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    values = rest.split()
                    total += sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values))
            return total
    except (OSError, ValueError):
        return None


class LoadSample(NamedTuple):
    """One reading of CPU time in seconds; the difference of two says how much other processes used."""
    busy: float  # time the CPUs asked about spent busy since boot: every process's work
    own: float  # time this process has used (all its threads)


class LoadSource(Protocol):
    """Where load readings come from. The real one, ProcStatLoad, reads this host; a test passes one that
    returns chosen readings, so what it checks does not depend on how busy the machine running it is."""

    def clock(self) -> float: ...  # seconds, monotonic; cheap, asked before every step

    def read(self, cpus: set[int]) -> LoadSample | None: ...  # None: nothing to measure with


class ProcStatLoad:
    """This host's readings: /proc/stat for the CPUs, os.times() for this process."""

    clock = staticmethod(time.monotonic)

    @staticmethod
    def read(cpus: set[int]) -> LoadSample | None:
        busy = busy_ticks(cpus)
        if busy is None:
            return None
        times = os.times()
        return LoadSample(busy / os.sysconf("SC_CLK_TCK"), times.user + times.system)
