"""GGUF blocks built by hand, through nvllm's import and load path, against values known exactly.

test_gguf_import.py compares the import with transformers, but both call gguf-py's dequantizer. Here the
expected values come from the block layouts as ggml documents them, computed in this file:
  Q8_0: fp16 d, 32 int8 q                -> d * q
  Q4_0: fp16 d, 16 bytes of nibbles      -> d * (q - 8); low nibbles are elements 0-15, high ones 16-31
  Q4_1: fp16 d, fp16 m, 16 bytes nibbles -> d * q + m
  F16 / BF16 / F32: the value itself
Scales and mins are exact in fp16 (powers of two, small multiples of them), so every value is exact in
float32 (and in bfloat16, what the quantized kernels return): the checks are equalities.
"""

import json
import os

import gguf
import numpy as np
import pytest
import torch

from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.weights.gguf_import import import_gguf
from engine_core.weights.loader import load_safetensors_weights, quantized_tensors

pytestmark = pytest.mark.unit
needs_kernels = pytest.mark.skipif(quant_bf16_dot.load() is None, reason="quant_bf16_dot.c does not run on this CPU")

BLOCK = 32
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 2, 1, 32, 64
TOKENS = ["<|endoftext|>", "a", "b", "ab"]


def _float32(exact: np.ndarray) -> np.ndarray:
    """float64 values as float32, which must hold them exactly (the scales are fp16-exact)."""
    out = exact.astype(np.float32)
    assert np.array_equal(out.astype(np.float64), exact)
    return out


def q8_0_block(d: float, q: np.ndarray) -> tuple[bytes, np.ndarray]:
    """One Q8_0 block (its 34 bytes) and its 32 values."""
    assert q.shape == (BLOCK,) and q.min() >= -128 and q.max() <= 127
    raw = np.float16(d).tobytes() + q.astype(np.int8).tobytes()
    return raw, _float32(d * q)


def _nibbles(q: np.ndarray) -> bytes:
    assert q.shape == (BLOCK,) and q.min() >= 0 and q.max() <= 15
    return (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()  # byte j: element j low, element j + 16 high


def q4_0_block(d: float, q: np.ndarray) -> tuple[bytes, np.ndarray]:
    """One Q4_0 block (18 bytes) and its 32 values."""
    return np.float16(d).tobytes() + _nibbles(q), _float32(d * (q - 8))


def q4_1_block(d: float, m: float, q: np.ndarray) -> tuple[bytes, np.ndarray]:
    """One Q4_1 block (20 bytes) and its 32 values."""
    return np.float16(d).tobytes() + np.float16(m).tobytes() + _nibbles(q), _float32(d * q + m)


# fp16-exact scales and mins, a negative scale and one that is not a power of two included, chosen so that
# every value has at most 8 significant bits: exact in float32 and in bfloat16 (checked where they are built)
Q4_SCALES = [2.0 ** -5, 0.125, -0.25, 1.0, 0.375]
Q8_SCALES = [2.0 ** -5, 0.125, -0.25, 1.0, 2.0 ** -12]  # q takes up to 7 bits: powers of two only
MINS = [-1.5, 0.25, 0.0, -0.5, 2.0]


def bf16_exact(values: np.ndarray) -> bool:
    return bool(np.array_equal(torch.from_numpy(values).to(torch.bfloat16).float().numpy(), values))


def quantized(kind: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A [rows, cols] tensor of hand-built blocks: (uint8 [rows, bytes per row], float32 values)."""
    raw_rows, values = [], []
    for r in range(rows):
        raw_row, row = b"", []
        for b in range(cols // BLOCK):
            d = Q4_SCALES[(r + b) % len(Q4_SCALES)]
            if kind == "Q8_0":
                raw, v = q8_0_block(Q8_SCALES[(r + b) % len(Q8_SCALES)], rng.integers(-128, 128, BLOCK))
            elif kind == "Q4_0":
                raw, v = q4_0_block(d, rng.permutation(np.arange(32) % 16))  # every nibble value, twice
            else:
                raw, v = q4_1_block(d, MINS[(r + 2 * b) % len(MINS)], rng.permutation(np.arange(32) % 16))
            raw_row += raw
            row.append(v)
        raw_rows.append(np.frombuffer(raw_row, dtype=np.uint8))
        values.append(np.concatenate(row))
    values = np.stack(values)
    assert bf16_exact(values)
    return np.stack(raw_rows), values


def plain(kind: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A float tensor as stored (F32, F16, or BF16 as its uint8 bytes) and its float32 values."""
    values = (rng.integers(-128, 128, (rows, cols)) * 2.0 ** -5).astype(np.float32)  # exact in all three
    if kind == "F32":
        return values, values
    if kind == "F16":
        return values.astype(np.float16), values
    high = (values.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16: the top half of the float32 bits
    assert np.array_equal((high.astype(np.uint32) << 16).view(np.float32), values)
    return high.view(np.uint8), values


def gguf_rows(hf_rows: int, heads: int) -> np.ndarray:
    """For llama q/k: the HF row each GGUF row holds. llama.cpp's converter stores each head's two rotary
    halves interleaved: GGUF row 2i of a head is HF row i of it, row 2i + 1 is HF row i + head_dim / 2."""
    d = hf_rows // heads
    return np.array([h * d + half * (d // 2) + i for h in range(heads) for i in range(d // 2) for half in (0, 1)])


# name -> (GGUF type, [rows, cols]); one layer with every type nvllm keeps (Q4_0, Q4_1, Q8_0) or reads
# through its float path (F32, F16, BF16, and the same quantized types dequantized)
TENSORS = {
    "token_embd.weight": ("Q8_0", (len(TOKENS), HIDDEN)),
    "blk.0.attn_norm.weight": ("F32", (HIDDEN,)),
    "blk.0.attn_q.weight": ("Q4_0", (HEADS * HEAD_DIM, HIDDEN)),
    "blk.0.attn_k.weight": ("Q4_1", (KV_HEADS * HEAD_DIM, HIDDEN)),
    "blk.0.attn_v.weight": ("Q8_0", (KV_HEADS * HEAD_DIM, HIDDEN)),
    "blk.0.attn_output.weight": ("F16", (HIDDEN, HEADS * HEAD_DIM)),
    "blk.0.ffn_norm.weight": ("F32", (HIDDEN,)),
    "blk.0.ffn_gate.weight": ("BF16", (INTER, HIDDEN)),
    "blk.0.ffn_up.weight": ("Q4_1", (INTER, HIDDEN)),
    "blk.0.ffn_down.weight": ("Q4_0", (HIDDEN, INTER)),
    "output_norm.weight": ("F32", (HIDDEN,)),
    "output.weight": ("Q4_0", (len(TOKENS), HIDDEN)),
}
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
for _gguf, _hf in [("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                   ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                   ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"),
                   ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")]:
    HF_NAMES[f"blk.0.{_gguf}.weight"] = f"model.layers.0.{_hf}.weight"


def write_model(path: str, arch: str) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """A one-layer model of hand-built tensors; HF name -> (GGUF type, stored bytes or floats in HF row
    order, exact float32 values in HF row order)."""
    rng = np.random.default_rng(37)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(0)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    expected = {}
    for name, (kind, shape) in TENSORS.items():
        rows, cols = shape if len(shape) == 2 else (1, shape[0])
        stored, values = (quantized if kind.startswith("Q") else plain)(kind, rows, cols, rng)
        if len(shape) == 1:
            stored, values = stored[0], values[0]
        expected[HF_NAMES[name]] = (kind, stored, values)
        heads = {"blk.0.attn_q.weight": HEADS, "blk.0.attn_k.weight": KV_HEADS}.get(name)
        if arch == "llama" and heads:  # rows of whole blocks go where llama.cpp puts them
            stored = stored[gguf_rows(rows, heads)]
        if kind in ("F32", "F16"):
            writer.add_tensor(name, np.ascontiguousarray(stored))
        else:
            writer.add_tensor(name, np.ascontiguousarray(stored), raw_shape=stored.shape,
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_block_layouts_by_hand():
    """The layout helpers on one block each, values worked out by hand."""
    q = np.arange(32) % 16
    raw, v = q4_0_block(0.5, q)
    assert raw[:2] == b"\x00\x38" and raw[2] == 0x00 and raw[3] == 0x11 and raw[17] == 0xFF  # 0.5 is fp16 0x3800
    assert v[0] == -4.0 and v[15] == 3.5 and v[16] == -4.0 and v[31] == 3.5
    raw, v = q4_1_block(0.25, -1.0, q)
    assert len(raw) == 20 and v[0] == -1.0 and v[31] == 2.75
    raw, v = q8_0_block(-2.0, np.arange(-16, 16))
    assert len(raw) == 34 and raw[2] == 0xF0 and v[0] == 32.0 and v[31] == -30.0
    assert np.array_equal(gguf_rows(8, 2), [0, 2, 1, 3, 4, 6, 5, 7])


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_import_gives_the_exact_values_of_hand_built_blocks(tmp_path, arch):
    """Every tensor, dequantized by the import and loaded as nvllm loads it, equals its exact values; the
    Q4_0 / Q4_1 / Q8_0 ones are also kept as their blocks, byte for byte, in HF row order (llama: the q/k
    rows un-permuted as whole rows of blocks)."""
    path = str(tmp_path / f"blocks-{arch}.gguf")
    expected = write_model(path, arch)
    folder = import_gguf(path, str(tmp_path / "out"))
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "float32"
    got = dict(load_safetensors_weights(folder))
    assert set(got) == set(expected)
    for name, (kind, _, values) in expected.items():
        assert got[name].dtype == torch.float32, name
        assert np.array_equal(got[name].numpy(), values), (name, kind)
    kept = quantized_tensors(folder)  # what --quantization gguf gives the layers
    assert {name: qtype for name, (_, qtype) in kept.items()} == {
        name: kind.lower() for name, (kind, _, _) in expected.items() if kind in ("Q4_0", "Q4_1", "Q8_0")}
    for name, (read, qtype) in kept.items():
        rows = read()
        assert np.array_equal(rows.numpy(), expected[name][1]), name
        quant_bf16_dot.QuantizedTensor(rows, qtype, expected[name][2].shape[1])  # the shape the kernels accept


@pytest.fixture
def cpu_quant_itself(monkeypatch):
    """quant_bf16_dot.c, where the amx tier would serve amx_quant.c (its inputs scaled per block: a unit input gives
    its weight to within fp32's rounding of the scale, test_amx_quant.py) in its place."""
    from engine_core.cpu_kernels import table
    monkeypatch.setenv("NVLLM_CPU_AMX_QUANT", "0")
    monkeypatch.delenv("NVLLM_CPU_QUANT_VNNI", raising=False)
    table.forget()
    yield
    monkeypatch.undo()
    table.forget()


@needs_kernels
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_quantized_kernels_unpack_hand_built_blocks_exactly(kind, cpu_quant_itself):
    """quant_bf16_dot.c unpacks its panels (the rows of a quantized embedding) to the exact values; x = identity
    through the linear kernel gives them too (one nonzero product per output, exact in bf16), on the
    small-M path (4 rows at a time) and the large-M one (all 96)."""
    rows, values = quantized(kind, 48, 96, np.random.default_rng(5))
    weight = quant_bf16_dot.QuantPanelWeight(quant_bf16_dot.QuantizedTensor(torch.from_numpy(rows), kind.lower(), 96))
    exact = torch.from_numpy(values).to(torch.bfloat16)  # no rounding: quantized() checked it
    assert torch.equal(weight.rows_of(torch.arange(48)), exact)
    eye = torch.eye(96, dtype=torch.bfloat16)
    small = torch.cat([weight.matmul(eye[i:i + 4]) for i in range(0, 96, 4)])
    for product in (small, weight.matmul(eye)):
        assert torch.equal(product.float(), exact.float().T)
