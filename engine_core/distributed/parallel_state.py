"""Tensor-parallel group of this process, its collectives, and how tensors split over its ranks.

With no process group, everything is rank 0 of 1. Splits need not be even: the first ranks take
one more row (or head) when a size does not divide, so SmolLM2's 9 heads run on 2 ranks.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x: torch.Tensor, op=None) -> torch.Tensor:
    if tp_size() > 1:
        dist.all_reduce(x, op=op if op is not None else dist.ReduceOp.SUM)
    return x


def gather_to_rank0(x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
    """Concatenate each rank's shard of x along dim on rank 0; other ranks get None.
    Every rank's shard must have the same shape."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())] if tp_rank() == 0 else None
    dist.gather(x.contiguous(), parts, dst=0)
    return torch.cat(parts, dim=dim) if parts is not None else None


# ---- how things split over ranks -------------------------------------------------------------

def split_evenly(total: int, parts: int, index: int) -> tuple[int, int]:
    """(start, count) of part `index` of `total` items split over `parts` as evenly as possible;
    the first total % parts parts hold one item more."""
    base, extra = divmod(total, parts)
    return index * base + min(index, extra), base + (index < extra)


class HeadShard(NamedTuple):
    q_start: int  # first query head of this rank
    num_q: int
    kv_start: int  # first KV head of this rank
    num_kv: int


def partition_heads(num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadShard:
    """The attention heads rank `rank` of `size` computes.

    KV heads split over ranks as evenly as possible and each rank takes the query heads of its
    KV groups (9 heads / 3 KV heads on 2 ranks: rank 0 has KV 0-1 and q 0-5, rank 1 KV 2 and q 6-8).
    With fewer KV heads than ranks, each rank keeps one KV head, replicated on the ranks that
    share it, and a share of that head's query group.
    """
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    if num_kv_heads >= size:
        kv_start, num_kv = split_evenly(num_kv_heads, size, rank)
        return HeadShard(kv_start * group, num_kv * group, kv_start, num_kv)
    kv = rank * num_kv_heads // size
    sharers = [r for r in range(size) if r * num_kv_heads // size == kv]
    if group < len(sharers):
        raise ValueError(f"{num_heads} attention heads ({num_kv_heads} KV heads) do not spread over "
                         f"{size} tensor-parallel ranks: use at most {num_heads} ranks")
    q_offset, num_q = split_evenly(group, len(sharers), sharers.index(rank))
    return HeadShard(kv * group + q_offset, num_q, kv, 1)
