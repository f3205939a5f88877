"""The KV cache block count all tensor-parallel ranks use: the smallest any rank can hold.

Every rank sizes its own cache (its memory budget over its bytes per block; ranks may hold different
numbers of heads and see different free memory), then all take the minimum by one all-reduce. It is a
collective: rank 0 (in the core's executor) and every worker call it at the same point of start-up.
"""

import torch
from torch.distributed import ReduceOp

from engine_core.distributed.parallel_state import all_reduce


def agree_on_num_blocks(runner) -> int:
    """The minimum over the ranks of max(0, runner.kv_cache_budget() // runner.kv_bytes_per_block())."""
    mine = max(0, runner.kv_cache_budget() // runner.kv_bytes_per_block())
    agreed = all_reduce(torch.tensor([mine], dtype=torch.int64, device=runner.device), ReduceOp.MIN)
    return int(agreed.item())
