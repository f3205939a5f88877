"""A safetensors file written one tensor at a time.

safetensors' own writers take every tensor at once; a GGUF import knows each tensor's name, dtype and shape
from the file's metadata before reading any data, so it writes the header first and then the tensors as it
converts them, holding one in memory at a time (a multi-GB model imports on a machine not much bigger).
The layout is the format's: an 8-byte little-endian header length, the JSON header (padded with spaces to a
multiple of 8), then the tensors' bytes back to back in header order.
"""

import json
import math
import struct

import torch

_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8"}


class SafetensorsStream:
    """Opened with every entry (name, dtype, shape) in the order `write` will be called; closed by `close`."""

    def __init__(self, path: str, entries: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        header: dict = {"__metadata__": metadata} if metadata else {}
        self._pending: list[tuple[str, int]] = []
        offset = 0
        for name, dtype, shape in entries:
            size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self._pending.append((name, size))
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._file = open(path, "wb")
        self._file.write(struct.pack("<Q", len(blob)))
        self._file.write(blob)
        self._pending.reverse()

    def write(self, name: str, tensor: torch.Tensor) -> None:
        expected, size = self._pending.pop()
        data = tensor.detach().contiguous()
        if name != expected or data.numel() * data.element_size() != size:
            raise ValueError(f"safetensors stream: got {name!r} ({data.numel() * data.element_size()} bytes) where "
                             f"{expected!r} ({size} bytes) comes next")
        self._file.write(memoryview(data.reshape(-1).view(torch.uint8).numpy()))

    def close(self) -> None:
        self._file.close()
        if self._pending:
            raise ValueError(f"safetensors stream: {len(self._pending)} tensors never written "
                             f"(next: {self._pending[-1][0]!r})")


def write_streamed(path: str, tensors, metadata: dict[str, str] | None = None) -> None:
    """Writes `tensors`, a list of (name, dtype, shape, make) whose make() returns the tensor, one at a time."""
    stream = SafetensorsStream(path, [(name, dtype, shape) for name, dtype, shape, _ in tensors], metadata)
    try:
        for name, dtype, _, make in tensors:
            stream.write(name, make().to(dtype))
    finally:
        stream.close()
