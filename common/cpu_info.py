"""This CPU's model name and feature flags, from /proc/cpuinfo (Linux). No torch: the engine core picks
its kernels by the flags, and the frontend's benchmark result files record both."""

import functools


def read_cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU listed; ("unknown", empty) where they cannot be read."""
    model, flags = "unknown", frozenset()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return model, flags


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags, empty where they cannot be read."""
    return read_cpuinfo()[1]
