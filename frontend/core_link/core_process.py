"""Starting an engine core as a child process of this frontend (ipc:// on this host).

The child is a fresh interpreter (`python -m engine_core`) given its arguments as JSON, so no
pickled object crosses between the two processes.
"""

import os
import signal
import subprocess

import msgspec

from common import hugepages
from common.child_process import spawn_module
from common.config import EngineArgs


def start_core_process(args: EngineArgs, listen: str, engine_index: int = 0,
                       start_failure_file: str | None = None) -> subprocess.Popen:
    """start_failure_file: where the child writes why it could not start (common/start_failure.py)."""
    argv = ["--args-json", msgspec.json.encode(args).decode(), "--listen", listen, "--engine-index",
            str(engine_index), "--parent-pid", str(os.getpid()), "--log-level",
            os.environ.get("NVLLM_LOG_LEVEL", "INFO")]
    if start_failure_file is not None:
        argv += ["--start-failure-file", start_failure_file]
    return spawn_module("engine_core", argv, hugepages.with_tunable(os.environ))


def stop_core_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
