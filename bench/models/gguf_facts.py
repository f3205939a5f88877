"""A GGUF file's header read with the standard library: metadata, tensor infos, and where the tensor data ends.

The frontend does not import gguf (pyproject's import-linter contracts), and a truncated file (what PyPI's
DeepSeek-R1-Distill-Qwen-7B parts join into) is exactly what needs reading here: gguf's reader maps the
tensors and fails on a short file, while the header alone says how many bytes a complete file has.
Layout (GGUF v2/v3, little-endian): magic, version, tensor count, metadata count, the metadata key/values,
the tensor infos (name, dims, type, offset into the data), padding to general.alignment, the tensor data.
"""

import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml type id: (name, elements per block, bytes per block), as gguf.constants' GGML_QUANT_SIZES
# (tests/test_real_models_fetch.py compares the two)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# metadata value type id: struct format of a scalar (8 string, 9 array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """The bytes are not a GGUF header this reader understands (the message says where it stopped)."""


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array, kept as its length (a tokenizer's vocabulary is 150k strings)."""
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    n_elements: int
    offset: int  # from the start of the tensor data
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict  # key -> int / float / bool / str / ArrayInfo
    tensors: tuple[TensorInfo, ...]
    data_start: int  # file offset of the tensor data

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def data_end(self) -> int:
        """The file offset one past the last tensor's bytes: a complete file has at least this many bytes."""
        return self.data_start + max((t.offset + t.n_bytes for t in self.tensors), default=0)

    def type_counts(self) -> dict[str, int]:
        """{tensor type name: how many tensors have it}, names sorted."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return dict(sorted(counts.items()))

    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def has_tensor(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)


class _Reader:
    def __init__(self, f: BinaryIO):
        self.f = f
        self.pos = 0

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise GGUFHeaderError(f"the header ends early: wanted {n} bytes at offset {self.pos}, got {len(data)}")
        self.pos += n
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.f.seek(n, 1)
        self.pos += n

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, length = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:
                size = struct.calcsize(_SCALARS[item]) * length
                self.f.seek(size, 1)
                self.pos += size
            elif item == _STRING:
                for _ in range(length):
                    self.skip_string()
            else:
                for _ in range(length):
                    self.value(item)
            return ArrayInfo(length)
        raise GGUFHeaderError(f"unknown metadata value type {kind} at offset {self.pos}")


def read_header(f: BinaryIO) -> GGUFHeader:
    """The header of the GGUF file open in f (binary, at its start). GGUFHeaderError when it is not one."""
    r = _Reader(f)
    magic = f.read(4)
    r.pos = len(magic)
    if magic != MAGIC:
        raise GGUFHeaderError(f"no GGUF magic: the file starts with {magic!r}, not {MAGIC!r}")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version} (this reader knows 2 and 3)")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.unpack("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        n_elements = 1
        for _ in range(n_dims):
            n_elements *= r.unpack("<Q")
        type_id, offset = r.unpack("<I"), r.unpack("<Q")
        if type_id not in GGML_TYPES:
            raise GGUFHeaderError(f"tensor {name} has unknown ggml type {type_id}")
        type_name, block, block_bytes = GGML_TYPES[type_id]
        tensors.append(TensorInfo(name, type_name, n_elements, offset, n_elements // block * block_bytes))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-r.pos // alignment) * alignment
    return GGUFHeader(version, metadata, tuple(tensors), data_start)


def read_header_of(path: str) -> GGUFHeader:
    with open(path, "rb") as f:
        return read_header(f)
