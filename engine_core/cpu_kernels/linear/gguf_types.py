"""The GGUF block types whose weights stay quantized in memory, and which kernel takes which.

quant_int8_rows.c takes them all (every CPU tier); quant_exact_f32.c (float32 engines: the dequantized model's results
to the bit) and quant_bf16_dot.c (bfloat16 engines on the avx512_bf16 and amx tiers) take Q4_0, Q4_1 and Q8_0,
and hand the others to quant_int8_rows.c (cpu_packing.pack_quantized).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufType:
    name: str  # lower case, as stored in an import's metadata ("q4_k")
    type_id: int  # ggml.h's
    block_inputs: int  # inputs per block: 32, or a K-quant's super-block of 256
    block_bytes: int
    cpu_quant_format: int | None = None  # quant_bf16_dot.c's packed format; None: quant_bf16_dot.c does not take it
    exact_f32_kernel: bool = False  # quant_exact_f32.c takes it

    def row_bytes(self, in_features: int) -> int:
        return in_features // self.block_inputs * self.block_bytes

    def fits(self, in_features: int) -> bool:
        return in_features > 0 and in_features % self.block_inputs == 0


GGUF_TYPES = {t.name: t for t in (
    GgufType("q4_0", 2, 32, 18, cpu_quant_format=0, exact_f32_kernel=True),
    GgufType("q4_1", 3, 32, 20, cpu_quant_format=0, exact_f32_kernel=True),
    GgufType("q5_0", 6, 32, 22),
    GgufType("q5_1", 7, 32, 24),
    GgufType("q8_0", 8, 32, 34, cpu_quant_format=1, exact_f32_kernel=True),
    GgufType("q4_k", 12, 256, 144),
    GgufType("q5_k", 13, 256, 176),
    GgufType("q6_k", 14, 256, 210),
)}
