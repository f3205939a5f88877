"""The chunk attention kernel on AMX tiles (amx_attention.c): its values against a float64 reference, and a
query row's bits the same however its prompt is chunked (1, 7, 16, 33, 512 rows at a time), beside other
sequences or alone, on one thread or two."""

import random

import pytest
import torch

from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.cpu_kernels import table

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(paged_avx512_bf16.load() is None
                                 or paged_avx512_bf16.load() is not paged_avx512_bf16._amx_library(),
                                 reason="needs AMX (amx_bf16) with the tile state granted: amx_attention.c does not "
                                        "run here")]

CHUNKS = (1, 7, 16, 33, 512)
BLOCK = 16


class Prompt:
    """One sequence's q [L, H, D] and k, v [L, Hkv, D], bf16, random."""

    def __init__(self, length: int, num_kv_heads: int, group: int, head_dim: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)  # noqa: E731
        self.q = rand(length, num_kv_heads * group, head_dim)
        self.k, self.v = rand(length, num_kv_heads, head_dim), rand(length, num_kv_heads, head_dim)


def attend(prompts: list[Prompt], pieces: list[tuple[int, int, int]], window: int = 0) -> dict:
    """One kernel call over pieces (prompt, first position, rows), on a shuffled cache whose unused slots hold
    NaN; {(prompt, position): output [H, D]}."""
    num_kv_heads, head_dim = prompts[0].k.shape[1:]
    need = [-(-(start + rows) // BLOCK) for _, start, rows in pieces]
    pool = list(range(sum(need) + 1))
    random.Random(len(pieces)).shuffle(pool)
    k_cache = torch.full((len(pool), BLOCK, num_kv_heads, head_dim), float("nan"), dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    tables = torch.zeros(len(pieces), max(need), dtype=torch.int32)
    for i, (p, start, rows) in enumerate(pieces):
        tables[i, :need[i]] = torch.tensor(pool[sum(need[:i]):sum(need[:i + 1])], dtype=torch.int32)
        positions = torch.arange(start + rows)
        blocks, slots = tables[i, positions // BLOCK].long(), positions % BLOCK
        k_cache[blocks, slots], v_cache[blocks, slots] = prompts[p].k[:start + rows], prompts[p].v[:start + rows]
    q = torch.cat([prompts[p].q[start:start + rows] for p, start, rows in pieces])
    starts = torch.tensor([0] + [rows for _, _, rows in pieces], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor([start + rows for _, start, rows in pieces], dtype=torch.int32)
    out = torch.empty_like(q)
    assert paged_avx512_bf16.paged_attention(q, k_cache, v_cache, tables, seq_lens, starts, prompts[0].q.shape[2] ** -0.5,
                                             out, window)
    rows_out = iter(out)
    return {(p, start + r): next(rows_out) for p, start, rows in pieces for r in range(rows)}


def reference(prompt: Prompt, position: int, window: int = 0) -> torch.Tensor:
    heads, head_dim = prompt.q.shape[1:]
    group = heads // prompt.k.shape[1]
    first = max(0, position - window + 1) if window else 0
    out = torch.empty(heads, head_dim, dtype=torch.float64)
    for h in range(heads):
        keys, values = prompt.k[first:position + 1, h // group].double(), prompt.v[first:position + 1, h // group].double()
        out[h] = torch.softmax(keys @ prompt.q[position, h].double() * head_dim ** -0.5, 0) @ values
    return out


def test_the_amx_kernel_serves_bf16_attention():
    assert table.serving("attention bfloat16") == "attention/amx_attention.c"


@pytest.mark.parametrize("num_kv_heads,group,head_dim,window", [(3, 3, 64, 0), (2, 4, 128, 0), (1, 8, 64, 0),
                                                                (1, 2, 96, 0), (3, 3, 64, 100)])
def test_values_against_float64_and_rows_alike_however_chunked(num_kv_heads, group, head_dim, window):
    prompts = [Prompt(n, num_kv_heads, group, head_dim, seed=n) for n in (530, 77, 1)]
    whole = attend(prompts, [(p, 0, len(prompt.q)) for p, prompt in enumerate(prompts)], window)
    for (p, position), row in whole.items():
        expected = reference(prompts[p], position, window)
        # the output rounded to bf16 (half an ulp) plus the bf16 probabilities' rounding
        assert torch.all((row.double() - expected).abs() <= expected.abs() * 2**-8 + 0.02), (p, position)
    for rows in CHUNKS:
        chunked = {}
        for start in range(0, 530, rows):
            # each chunk after its cached prefix, beside a one-row decode of another prompt
            chunked |= attend(prompts, [(1, 76, 1), (0, start, min(rows, 530 - start))], window)
        assert all(torch.equal(row, whole[key]) for key, row in chunked.items()), rows


def test_threads_do_not_change_a_row():
    prompts = [Prompt(300, 3, 3, 64, seed=4), Prompt(45, 3, 3, 64, seed=5)]
    pieces = [(0, 0, 300), (1, 40, 5)]
    whole = attend(prompts, pieces)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend(prompts, pieces)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(alone[key], row) for key, row in whole.items())
