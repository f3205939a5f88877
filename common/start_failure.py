"""Why a child engine core failed to start, handed to the frontend that started it.

The child's log says it too, but a user of `LLM(...)` or `nvllm serve` should get the reason in the error
raised where they called (an unsupported architecture, a missing model file), not "see the log above". The
child writes one JSON record to a file the parent named; the parent reads it when the child has exited.
Plain JSON, decoded into a typed record: the frontend reads this file.
"""

import os

import msgspec


class StartFailure(msgspec.Struct, frozen=True):
    kind: str  # the exception's class name
    message: str
    bad_input: bool  # a ValueError: the arguments or the model are at fault, not the engine


class EngineStartError(RuntimeError):
    """The engine core process exited before it was ready; `why` is its reason alone."""

    def __init__(self, why: str):
        super().__init__(f"the engine core failed to start: {why}")
        self.why = why


class EngineStartValueError(EngineStartError, ValueError):
    """The engine core refused its arguments or its model (an unsupported architecture or config field, a model
    that is not there): the caller's input, as a ValueError."""


def write_start_failure(path: str, error: BaseException) -> None:
    record = StartFailure(type(error).__name__, str(error) or type(error).__name__, isinstance(error, ValueError))
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode(record))
    os.replace(tmp, path)


def read_start_failure(path: str) -> StartFailure | None:
    """The record a child wrote at `path`; None where it wrote none (it was killed, or failed before it could)."""
    try:
        with open(path, "rb") as f:
            return msgspec.json.decode(f.read(), type=StartFailure)
    except (OSError, msgspec.DecodeError):
        return None


def start_error(failure: StartFailure | None, exit_code: int | None) -> EngineStartError:
    """The error the frontend raises for a child core that exited during its start."""
    if failure is None:
        return EngineStartError(f"its process exited with code {exit_code}; its log above says why")
    return (EngineStartValueError if failure.bad_input else EngineStartError)(failure.message)
