"""The pool of fixed-size KV cache blocks: reference counts, an LRU free queue, and the prefix cache.

A block whose reference count drops to 0 goes to the tail of the free queue but keeps its hash, so a
later request with the same prefix can take it back (`touch`) until `get_new_blocks` pops it from the
head of the queue for new data, which is when its hash is forgotten.
"""

from collections import OrderedDict


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0  # requests whose block table holds this block
        self.block_hash: int | None = None  # set once the block is full and registered in the prefix cache

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # blocks with ref_cnt 0, least recently freed first; popped from the front
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (free but still cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """n blocks for new data, least recently freed first; each leaves the prefix cache."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} KV cache blocks, only {self.num_free_blocks} are free")
        blocks = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def uncache(self, block: KVCacheBlock) -> None:
        """Forget a block's hash now, whoever holds it (its contents are not what the hash says)."""
        self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def touch(self, blocks) -> None:
        """Take a reference on each block (a prefix-cache hit); a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks) -> None:
        """Drop a reference on each block. Callers pass a request's blocks tail first, so its tail
        blocks reach the free queue (and are evicted) before the prefix blocks others may share."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"freeing {block}, which no request holds")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def cache_full_block(self, block: KVCacheBlock, block_hash: int) -> bool:
        """Register a full block under its hash. False (and nothing changes) if another block
        already holds that hash: the existing mapping wins, and this block stays unhashed.
        Also False with caching off."""
        if not self.enable_caching:
            return False
        existing = self.cached_block_hash_to_block.get(block_hash)
        if existing is not None and existing is not block:
            return False
        if block.block_hash is not None and block.block_hash != block_hash:
            raise RuntimeError(f"{block} is already cached under another hash")
        block.block_hash = block_hash
        self.cached_block_hash_to_block[block_hash] = block
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every hash. Refused (False) while any block is in use, since running requests
        may still be writing blocks the cache points to."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
