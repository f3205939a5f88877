"""The same query rows attended in many ways, for batch-invariance tests of paged attention.

A few sequences with fixed q/k/v. Each query row (sequence, position p) is computed as a lone decode,
inside prefill chunks of several sizes, as the chunk after a cached prefix, among many decodes in
one batch, and in mixed batches beside other sequences at other positions. Every launch gets its own
cache layout (shuffled block ids; slots past a sequence's length hold NaN), as preemption and
recomputation would give it. A batch-invariant kernel returns the same bits for a row in all of them.
"""

import random
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Piece:
    """Query positions start .. start + length - 1 of one sequence; its keys are 0 .. start + length - 1."""
    seq: int
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


Batch = list[Piece]
# attend(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, max_query_len, max_seq_len) -> out
Attend = Callable[..., torch.Tensor]


class Sequences:
    """q [L, H, D] and k, v [L, Hkv, D] of each sequence, random, in dtype."""

    def __init__(self, lengths: list[int], num_kv_heads: int, group: int, head_dim: int,
                 dtype: torch.dtype, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
        self.q = [rand(n, num_kv_heads * group, head_dim) for n in lengths]
        self.k = [rand(n, num_kv_heads, head_dim) for n in lengths]
        self.v = [rand(n, num_kv_heads, head_dim) for n in lengths]

    def rows(self) -> list[tuple[int, int]]:
        return [(s, p) for s, n in enumerate(self.lengths) for p in range(n)]


def run_batch(seqs: Sequences, batch: Batch, attend: Attend, block_size: int, rng: random.Random,
              device: str) -> list[tuple[tuple[int, int], torch.Tensor]]:
    """One launch of `attend` over `batch` (decodes first, as the model runner orders them) on a
    fresh cache layout. Returns ((sequence, position), output [H, D]) for each computed row."""
    batch = sorted(batch, key=lambda piece: piece.length > 1)  # stable: keeps the shuffled order otherwise
    need = [-(-piece.end // block_size) for piece in batch]
    pool = list(range(sum(need) + 2))
    rng.shuffle(pool)
    shape = (len(pool), block_size, seqs.num_kv_heads, seqs.head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=seqs.dtype)
    v_cache = torch.full(shape, float("nan"), dtype=seqs.dtype)
    tables = torch.zeros(len(batch), max(need), dtype=torch.int32)
    for i, (piece, n) in enumerate(zip(batch, need)):
        blocks = [pool.pop() for _ in range(n)]
        tables[i, :n] = torch.tensor(blocks, dtype=torch.int32)
        for b, block in enumerate(blocks):
            lo, hi = b * block_size, min(piece.end, (b + 1) * block_size)
            k_cache[block, : hi - lo] = seqs.k[piece.seq][lo:hi]
            v_cache[block, : hi - lo] = seqs.v[piece.seq][lo:hi]
    q = torch.cat([seqs.q[piece.seq][piece.start: piece.end] for piece in batch])
    starts = [0]
    for piece in batch:
        starts.append(starts[-1] + piece.length)
    to = lambda x: x.to(device)  # noqa: E731
    out = attend(to(q), to(k_cache), to(v_cache), to(torch.tensor(starts, dtype=torch.int32)),
                 to(torch.tensor([piece.end for piece in batch], dtype=torch.int32)), to(tables),
                 max(piece.length for piece in batch), max(piece.end for piece in batch)).cpu()
    return [((piece.seq, piece.start + j), out[starts[i] + j])
            for i, piece in enumerate(batch) for j in range(piece.length)]


def chunked(seq: int, length: int, sizes: list[int]) -> list[Piece]:
    """The sequence cut into consecutive chunks of the given sizes (the last one cycled), up to its length."""
    pieces, start, i = [], 0, 0
    while start < length:
        size = min(sizes[min(i, len(sizes) - 1)], length - start)
        pieces.append(Piece(seq, start, size))
        start, i = start + size, i + 1
    return pieces


def scenarios(lengths: list[int], rng: random.Random, chunk_sizes=(3, 16), lone_decodes: int = 8,
              batched_decodes: int = 24) -> dict[str, list[Batch]]:
    """Named ways to compute the rows, each a list of batches (one launch each). Every row is
    computed whole, in each chunk size and in the mixed steps; decodes (alone or batched) and cached
    prefixes are drawn at random positions (a decode costs a program each: the interpreter is slow)."""
    rows = [(s, p) for s, n in enumerate(lengths) for p in range(n)]
    out = {"whole prompt": [[Piece(s, 0, n)] for s, n in enumerate(lengths)]}
    for size in chunk_sizes:
        out[f"chunks of {size}"] = [[piece] for s, n in enumerate(lengths) for piece in chunked(s, n, [size])]
    out["cached prefix"] = [[Piece(s, p, n - p)] for s, n in enumerate(lengths) if n > 1
                            for p in [rng.randrange(1, n)]]
    out["lone decode"] = [[Piece(s, p, 1)] for s, p in rng.sample(rows, min(lone_decodes, len(rows)))]
    out["one batch of decodes"] = [[Piece(s, p, 1) for s, p in rng.sample(rows, min(batched_decodes, len(rows)))]]
    out["mixed steps"] = mixed_steps(lengths, rng)
    return out


def mixed_steps(lengths: list[int], rng: random.Random, max_decodes: int = 6) -> list[Batch]:
    """A scheduler's view: every sequence cut into random chunks (up to max_decodes decodes at its
    tail), step k runs the k-th chunk of each, in a shuffled order, beside a stranger (a random piece
    of a random sequence)."""
    plans = []
    for s, n in enumerate(lengths):
        prompt = n - rng.randrange(min(n, max_decodes + 1))  # the positions after it come one decode at a time
        prompt = max(prompt, 1)
        plans.append(chunked(s, prompt, [rng.randrange(1, 20) for _ in range(n)])
                     + [Piece(s, p, 1) for p in range(prompt, n)])
    steps = []
    for k in range(max(map(len, plans))):
        batch = [plan[k] for plan in plans if k < len(plan)]
        s = rng.randrange(len(lengths))
        start = rng.randrange(lengths[s])
        batch.append(Piece(s, start, rng.randrange(1, lengths[s] - start + 1)))
        rng.shuffle(batch)
        steps.append(batch)
    return steps
