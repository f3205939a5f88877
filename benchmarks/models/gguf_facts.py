"""What the catalogue checks about a GGUF file, read by the gguf library from the header alone: architecture,
tensor types, tensor names, and where the tensor data ends.

A truncated file (what PyPI's DeepSeek-R1-Distill-Qwen-7B parts join into) is exactly what needs reading here:
gguf's GGUFReader maps every tensor's data and fails on a short file, while the header alone says how many
bytes a complete file has. So the reader below stops after the tensor infos and maps no data.
"""

from dataclasses import dataclass

MAGIC = b"GGUF"


class GGUFUnreadable(ValueError):
    """The bytes are not a GGUF header the gguf library reads (the message says why)."""


@dataclass(frozen=True)
class TensorFacts:
    name: str
    type_name: str
    n_elements: int
    data_end: int  # file offset one past the tensor's bytes


@dataclass(frozen=True)
class GGUFFacts:
    architecture: str
    tensors: tuple[TensorFacts, ...]

    @property
    def data_end(self) -> int:
        """The file offset one past the last tensor's bytes: a complete file has at least this many bytes."""
        return max((t.data_end for t in self.tensors), default=0)

    def type_counts(self) -> dict[str, int]:
        """{tensor type name: how many tensors have it}, names sorted."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return dict(sorted(counts.items()))

    def has_tensor(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)


def read_facts(path: str) -> GGUFFacts:
    """The facts of the GGUF file at path; GGUFUnreadable when it is not one."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != MAGIC:  # gguf says only "GGUF magic invalid"; the catalogue's message shows the bytes
        raise GGUFUnreadable(f"no GGUF magic: the file starts with {magic!r}, not {MAGIC!r}")
    try:
        reader = _header_reader()(path)
    except (ValueError, KeyError, IndexError) as e:
        raise GGUFUnreadable(str(e)) from e
    field = reader.get_field("general.architecture")
    architecture = field.contents() if field is not None else ""
    return GGUFFacts(str(architecture), tuple(reader.tensor_facts))


def _header_reader():
    """gguf's GGUFReader that records each tensor's facts instead of mapping its data (gguf is imported here, at
    the first read: `nvllm --help` does not pay for it)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    class HeaderReader(GGUFReader):
        def _build_tensors(self, start_offs: int, fields) -> None:
            self.tensor_facts = []
            for field in fields:
                _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
                quant = GGMLQuantizationType(int(raw_dtype[0]))
                n_elements = int(np.prod(dims))
                block, block_bytes = GGML_QUANT_SIZES[quant]
                end = int(start_offs + offset_tensor[0]) + n_elements * block_bytes // block
                self.tensor_facts.append(TensorFacts(bytes(name_data).decode("utf-8"), quant.name, n_elements, end))

    return HeaderReader
