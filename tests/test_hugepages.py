"""The glibc huge-page tunable that model-running processes start with."""

import sys

import pytest

from common import hugepages

pytestmark = pytest.mark.unit


@pytest.mark.skipif(sys.platform != "linux", reason="glibc tunables are Linux-only")
def test_tunable_is_added_once_beside_others_and_can_be_turned_off():
    assert hugepages.with_tunable({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert hugepages.with_tunable(other)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}  # the user's own choice stands
    assert hugepages.with_tunable(mine) == mine
    off = {"NVLLM_HUGEPAGE_MALLOC": "0"}
    assert hugepages.with_tunable(off) == off


def test_core_child_process_gets_it(monkeypatch):
    from common.config import EngineArgs
    from frontend import core_process

    seen = {}
    monkeypatch.setattr(core_process.subprocess, "Popen", lambda cmd, env: seen.setdefault("env", env))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("NVLLM_HUGEPAGE_MALLOC", raising=False)
    core_process.start_core_process(EngineArgs(), "ipc:///tmp/unused.sock")
    assert ("glibc.malloc.hugetlb=1" in seen["env"]["GLIBC_TUNABLES"]) == (sys.platform == "linux")
