"""Build-and-load of small C kernels for the CPU, called through ctypes.

A C source is compiled at first use with the system's C compiler (-O3, OpenMP, the active tier's flags:
tiers.py) into <cache>/kernels/NAME-<tier>-<hash>.so, the hash covering the source (and the local files
it includes) and the flags: a build is for its tier, not for the machine that made it, so a cache made
on one CPU serves another of the same tier. Several processes may start at once: the build
holds a file lock and renames a finished temporary file into place. Where a library cannot be had
(no compiler, a failed build, a load error) load_library returns None and logs why, once per source.

OpenMP: the library needs libgomp.so.1; the torch wheel's copy is already loaded under that name,
so the dynamic linker hands it to the kernel too and both share one thread pool.
"""

import ctypes
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile

from common.cache_dir import cache_dir
from engine_core.cpu_kernels import tiers

logger = logging.getLogger("nvllm")

FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-pthread")

_loaded: dict[tuple, ctypes.CDLL | None] = {}


def _build(source: str, flags: list[str], target: str) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    # one lock per build: builds of different libraries run side by side (table.prebuild), one library once
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(target):  # another process built it while we waited
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            subprocess.run([compiler, *flags, source, "-o", tmp, "-lm"], check=True, capture_output=True, text=True)
            os.replace(tmp, target)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{compiler} failed: {e.stderr.strip()[-2000:]}") from None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def source_text(source: str) -> bytes:
    """The source and the local files it #includes (and theirs): a change to any makes a new build."""
    with open(source, "rb") as f:
        text = f.read()
    folder = os.path.dirname(source)
    for name in re.findall(rb'^#include "([^"]+)"', text, re.MULTILINE):
        text += source_text(os.path.join(folder, name.decode()))
    return text


def build_for(source: str, extra_flags: tuple[str, ...] = (), tier: str | None = None, what: str | None = None) -> str:
    """The path of `source`'s library for `tier` (default: the active one), compiled first where the cache does
    not hold it; raises OSError or RuntimeError where it cannot be built."""
    tier = tier or tiers.active_tier()
    flags = [*FLAGS, *tiers.compile_flags(tier), *extra_flags]
    name = os.path.splitext(os.path.basename(source))[0]
    digest = hashlib.sha256(source_text(source) + " ".join(flags).encode()).hexdigest()[:16]
    target = os.path.join(cache_dir(), "kernels", f"{name}-{tier}-{digest}.so")
    if not os.path.exists(target):
        logger.info("building %s into %s", what or name, target)
        _build(source, flags, target)
    return target


def load_library(source: str, extra_flags: tuple[str, ...] = (), what: str | None = None) -> ctypes.CDLL | None:
    """The ctypes library built from the C file `source` for the active tier, or None where it cannot be
    had (logged once).

    `what` names the kernels in log lines (default: the file's name)."""
    tier = tiers.active_tier()
    key = (source, tuple(extra_flags), tier)
    if key in _loaded:
        return _loaded[key]
    what = what or os.path.splitext(os.path.basename(source))[0]
    library = None
    try:
        library = ctypes.CDLL(build_for(source, extra_flags, tier, what))
    except (OSError, RuntimeError) as e:
        logger.warning("%s unavailable (%s); the torch code runs instead", what, e)
    _loaded[key] = library
    return library
