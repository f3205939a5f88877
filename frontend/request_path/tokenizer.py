"""The model's tokenizer, built from the files the engine core sends at handshake."""

import logging
import os
import tempfile

# AutoTokenizer would import torch (through transformers' config classes); the fast tokenizer
# class reads the same files and needs only the tokenizers library
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger("nvllm")


def safe_file_name(name: str) -> str:
    """Where a file the core sent goes inside the folder: under its base name only, so a core (or
    whoever speaks for it) cannot make the frontend write `../x` or `/etc/x`."""
    base = os.path.basename(name.replace("\\", "/"))
    if base in ("", ".", "..") or "\x00" in base:
        raise ValueError(f"the engine core sent a tokenizer file named {name!r}, which has no usable file name")
    if base != name:
        logger.warning("the engine core sent a tokenizer file named %r; writing it as %r", name, base)
    return base


def tokenizer_from_files(files: dict[str, str]) -> PreTrainedTokenizerBase:
    """A fast HF tokenizer from {file name: text}; needs tokenizer.json among them."""
    if "tokenizer.json" not in files:
        raise ValueError("the engine core sent no tokenizer.json; only models with a fast tokenizer are served")
    with tempfile.TemporaryDirectory(prefix="nvllm-tok-") as folder:
        for name, text in files.items():
            with open(os.path.join(folder, safe_file_name(name)), "w", encoding="utf-8") as f:
                f.write(text)
        return PreTrainedTokenizerFast.from_pretrained(folder)
