"""Which failures end the engine core, and which only fail the step's requests.

A step that raises fails the requests it ran and the core serves on. Only a fault that leaves the
model unusable stops the core: a lost tensor-parallel rank, or a device error that poisons the
device context (CUDA's are sticky: every later kernel fails too).
"""


class FatalEngineError(RuntimeError):
    """The engine cannot run another step."""


_STICKY_DEVICE_ERRORS = ("CUDA error", "device-side assert", "CUBLAS_STATUS", "cuDNN error", "NCCL error")


def is_fatal(error: BaseException) -> bool:
    if isinstance(error, FatalEngineError):
        return True
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: not a request's fault
        return True
    text = str(error)
    return type(error).__name__ == "AcceleratorError" or any(s in text for s in _STICKY_DEVICE_ERRORS)
