"""Huge pages for the large malloc'd buffers of processes that run the model (Linux, glibc 2.35+).

oneDNN's packed weights are plain malloc memory. A CPU decode step streams all of them, and on 4 KiB
pages it misses the TLB all the way; glibc backs malloc's large chunks with transparent huge pages when
the process starts with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (about 5% more decode throughput on
the development machine). glibc reads the tunable only at start, so the engine core child gets it in
its environment and the CLI commands that run the model in their own process restart themselves
once with it. Other C libraries ignore it. NVLLM_HUGEPAGE_MALLOC=0 turns this off.
"""

import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"


def wanted(env=os.environ) -> bool:
    return sys.platform == "linux" and env.get("NVLLM_HUGEPAGE_MALLOC", "1") != "0"


def has_tunable(env=os.environ) -> bool:
    return "glibc.malloc.hugetlb" in env.get("GLIBC_TUNABLES", "")


def with_tunable(env: dict) -> dict:
    """A copy of env whose GLIBC_TUNABLES asks for huge pages (unless turned off or already set)."""
    env = dict(env)
    if wanted(env) and not has_tunable(env):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), TUNABLE]))
    return env


def restart_with_tunable() -> None:
    """Replaces this process with the same command line under the tunable; returns if not needed.
    Only for a process's own command line (never a caller's process that imported nvllm)."""
    if wanted() and not has_tunable():
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], with_tunable(os.environ))
