"""How busy this host's CPUs are, from /proc/stat (Linux). No torch: the frontend's benchmarks use it too."""

import os

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
