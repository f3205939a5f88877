"""Types for command-line flags: a bad value is argparse's one-line error naming the flag."""

import argparse
import math


def number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a{'n integer' if kind is int else ' number'}, got {text!r}") from None
    return value


def at_least(minimum, kind=int):
    """A flag type: an int (or a finite float) no smaller than `minimum`."""
    def parse(text: str):
        value = number(kind, text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"{kind.__name__}_at_least_{minimum}"
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)
non_negative_float = at_least(0, float)


LOG_LEVELS = ["debug", "info", "warning", "error"]
DEFAULT_CORE_ADDRESS = "tcp://127.0.0.1:5555"  # where `nvllm engine-core` listens and `nvllm frontend` looks


def add_log_level(p) -> None:
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="logging level")


def zmq_address(text: str) -> str:
    if not text.startswith(("tcp://", "ipc://")):
        raise argparse.ArgumentTypeError(f"must be tcp://HOST:PORT or ipc://PATH, got {text!r}")
    return text
