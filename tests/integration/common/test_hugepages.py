"""The glibc huge-page tunable that model-running processes start with."""

import sys
import time

import pytest

from common import hugepages

pytestmark = pytest.mark.integration  # one test starts a real engine-core child


@pytest.mark.skipif(sys.platform != "linux", reason="glibc tunables are Linux-only")
def test_tunable_is_added_once_beside_others_and_can_be_turned_off():
    assert hugepages.with_tunable({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert hugepages.with_tunable(other)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}  # the user's own choice stands
    assert hugepages.with_tunable(mine) == mine
    off = {"NVLLM_HUGEPAGE_MALLOC": "0"}
    assert hugepages.with_tunable(off) == off


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/environ; glibc tunables are Linux-only")
def test_core_child_process_gets_it(monkeypatch, tmp_path):
    """A real engine core child, started as `nvllm serve` starts it: the environment the kernel gave it at
    exec (/proc/PID/environ, what glibc reads the tunable from) asks for huge pages."""
    from common.config import EngineArgs
    from frontend.core_link import core_process

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("NVLLM_HUGEPAGE_MALLOC", raising=False)
    proc = core_process.start_core_process(EngineArgs(), f"ipc://{tmp_path}/core.sock")
    raw, deadline = b"", time.monotonic() + 60
    try:
        # Popen can return while execve is still setting up the new image (environ reads empty until
        # then); the child spends seconds importing torch after that, so poll while it lives
        while not raw and proc.poll() is None and time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                raw = f.read()
            time.sleep(0.001)
    finally:
        core_process.stop_core_process(proc)
    assert raw, f"could not read the core child's environment (it exited with {proc.returncode}, or too slow)"
    environ = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    assert b"glibc.malloc.hugetlb=1" in environ.get(b"GLIBC_TUNABLES", b"").split(b":"), environ.get(b"GLIBC_TUNABLES")
