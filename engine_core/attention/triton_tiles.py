"""How the Triton paged-attention kernel is tiled for one launch (triton_kernels.paged_attention).

A program owns BLOCK_M rows (query token, query head of one kv head's group) and walks its keys in
tiles of BLOCK_N; num_warps spreads that over the GPU's threads. On a GPU each distinct choice is a
separately compiled kernel with its own MMA instructions and reduction trees, so a row's last bits
can depend on which tiles computed it.

Two policies:

* batch-invariant (`invariant_tiles`): one choice per engine, from the model's shapes alone (group,
  head dim, dtype). Every step, decode or prefill, runs the same compiled kernel, so a row's
  arithmetic cannot depend on what else the step holds.
* shape-tuned (`shape_tuned_tiles`, --no-batch-invariant): a decode-only step takes a smaller tile
  (one program per sequence and kv head, all its query heads); other steps take the invariant tile.

Imports no triton: the choice is plain arithmetic, testable anywhere.
"""

from typing import NamedTuple


class AttentionTiles(NamedTuple):
    block_m: int  # rows (query token, query head) per program
    block_n: int  # keys per tile
    num_warps: int


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def padded_head_dim(head_dim: int) -> int:
    """Head dim as the kernel holds it: a power of two, >= 16 (tl.dot wants >= 16 in every dim)."""
    return max(16, _next_power_of_2(head_dim))


def _key_tile(head_dim: int, elem_size: int) -> int:
    """BLOCK_N. Fixed per (head dim, dtype): key tiles start at absolute key positions 0, BLOCK_N, ...
    whatever the step, which is what lets a row see the same tiles as a decode or in any chunk."""
    dim_pad = padded_head_dim(head_dim)
    if elem_size >= 4:  # fp32 dots run as exact fp32 FMAs, not tensor cores: smaller key tiles
        return 32 if dim_pad <= 64 else 16
    return 64 if dim_pad <= 128 else 32


def invariant_tiles(group: int, head_dim: int, elem_size: int) -> AttentionTiles:
    """The one tiling of every step in batch-invariant mode: the prefill tile (>= 64 rows), decodes
    included. A decode then fills group of its 64 rows; decode attention is bound by K/V reads, which
    do not grow with BLOCK_M. Chosen so that head dims 64..256 in bf16/fp16 and 64/128 in fp32
    compile for sm_90 without register spills (ptxas -v)."""
    dim_pad = padded_head_dim(head_dim)
    block_m = max(64, _next_power_of_2(group))
    return AttentionTiles(block_m, _key_tile(head_dim, elem_size), 4 if dim_pad * elem_size <= 128 else 8)


def shape_tuned_tiles(group: int, head_dim: int, elem_size: int, max_query_len: int) -> AttentionTiles:
    """--no-batch-invariant: a decode-only step (max_query_len <= 1) takes the smallest tile that holds
    the group, one program per (sequence, kv head); any other step the invariant tile."""
    if max_query_len <= 1:
        return AttentionTiles(max(16, _next_power_of_2(group)), _key_tile(head_dim, elem_size), 4)
    return invariant_tiles(group, head_dim, elem_size)
