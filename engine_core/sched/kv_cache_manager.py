"""Per-request block tables on top of the BlockPool, with prefix caching by chained block hashes.

Block i of a request is identified by hash(hash of block i-1, token ids of block i), so equal hashes
mean equal whole prefixes, not just equal blocks. Only full blocks are ever hashed or shared.

Sliding windows: where every layer of the model slides (ModelSpec.attention_reach, the widest window w), the
query at position p reads no key before p - w + 1. Before a step that computes from position c, the request's
blocks wholly before c - w + 1 go back to the pool (`num_dropped_blocks`): they keep their hashes and sit in
the free queue like any freed block, so a later request with the same prefix can still hit them until they are
evicted. Their ids stay in the request's table, which keeps block i at index i; the attention kernels never
read them (they start at each row's window). A prefix-cache hit takes no reference on hit blocks that are
already out of the window: it only notes their ids.
"""

from array import array

import xxhash

from engine_core.sched.block_pool import BlockPool, KVCacheBlock
from engine_core.sched.request import Request


def hash_block_tokens(parent_hash: int | None, token_ids, prompt_tokens: int | None = None) -> int:
    """xxh3_64 over the parent hash and the block's token ids (int64 each), and, where given, how many of them
    are prompt tokens of the request that computed the block (key_prompt_rows)."""
    h = xxhash.xxh3_64()
    if parent_hash is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01" + (parent_hash & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    if prompt_tokens is not None:
        h.update(b"\x02" + prompt_tokens.to_bytes(8, "little"))
    return h.intdigest()


def salt_hash(cache_salt: str | None, lora_key: tuple | None = None) -> int | None:
    """The parent hash of a request's first block: a salt makes its whole chain differ from those of
    requests without it (or with another), so tenants cannot probe each other's cached prompts; a LoRA
    adapter likewise (its K/V differ from the base model's), so two adapters never share blocks."""
    if cache_salt is None and lora_key is None:
        return None
    h = xxhash.xxh3_64()
    if cache_salt is not None:
        h.update(b"nvllm-cache-salt\x00" + cache_salt.encode("utf-8", "surrogatepass"))
    if lora_key is not None:
        name, int_id, path = lora_key
        h.update(b"\x00nvllm-lora\x00" + lora_identity_bytes(name, int_id, path))
    return h.intdigest()


def lora_identity_bytes(name: str, int_id: int, path: str) -> bytes:
    """The adapter's identity as bytes no two identities share (lengths included)."""
    parts = [name.encode("utf-8", "surrogatepass"), str(int_id).encode(), path.encode("utf-8", "surrogatepass")]
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 attention_reach: int | None = None, key_prompt_rows: bool = False):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if attention_reach is not None and attention_reach < 1:
            raise ValueError(f"attention_reach must be at least 1, got {attention_reach}")
        self.block_size = block_size
        self.attention_reach = attention_reach  # keys a query reads back, itself included; None: all
        # the model computes prompt tokens with another arithmetic than output tokens (amx_quant.c): a block that
        # holds output tokens is then keyed by how many of its tokens were prompt tokens, so a later request whose
        # prompt repeats an earlier answer computes those tokens itself rather than reading the answer's K/V
        # (its result stays its own); blocks of prompt tokens only are keyed as always and shared as always
        self.key_prompt_rows = key_prompt_rows
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.prefix_cache_queries = 0  # tokens looked up (cumulative)
        self.prefix_cache_hits = 0  # tokens found (cumulative)

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def _hash_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Extend request.block_hashes to cover every full block among its first num_tokens tokens."""
        bs, hashes, tokens = self.block_size, request.block_hashes, request.all_token_ids
        for i in range(len(hashes), min(num_tokens, len(tokens)) // bs):
            lora = request.lora_request
            parent = hashes[-1] if hashes else salt_hash(request.cache_salt, lora.key if lora is not None else None)
            prompt = min(max(request.num_prompt_tokens - i * bs, 0), bs)
            hashes.append(hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs],
                                            prompt if self.key_prompt_rows and prompt < bs else None))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks that prefixes the request, and the tokens they hold.
        At least one token is left to compute, since the model must run to sample the next one. A request that
        scores its prompt gets no hits: its logprobs need every position's logits; nor does one that pools
        every position (MEAN, CLS) its hidden states."""
        if not self.enable_caching or request.computes_every_position:
            return [], 0
        self._hash_full_blocks(request, request.num_tokens)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_hit_tokens
        return hits, num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] = ()) -> bool:
        """Grow the request's block table to hold its computed tokens, the prefix hits and
        num_new_tokens more. All or nothing: False, with nothing changed, if blocks run short."""
        bs, pool = self.block_size, self.block_pool
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * bs
        total = num_computed + num_new_tokens
        num_needed = -(-total // bs) - len(request.block_ids) - len(new_computed_blocks)
        # blocks out of every window go back whatever follows (no query of this step or later reads them)
        self._drop_out_of_window(request, num_computed)
        # hits (a request being admitted: its table is empty) already out of the window are noted, not held
        unseen = 0 if request.block_ids else min(len(new_computed_blocks), self._blocks_out_of_window(num_computed))
        held_hits = new_computed_blocks[unseen:]
        # hits sitting in the free queue stop being free once touched
        num_hits_free = sum(1 for b in held_hits if b.ref_cnt == 0)
        if num_needed > pool.num_free_blocks - num_hits_free:
            return False
        pool.touch(held_hits)  # before get_new_blocks, so the hits cannot be evicted
        request.block_ids.extend(b.block_id for b in new_computed_blocks)
        request.num_dropped_blocks += unseen
        if num_needed > 0:
            request.block_ids.extend(b.block_id for b in pool.get_new_blocks(num_needed))
        if self.enable_caching:  # proposed tokens are not known yet: their blocks wait for verification
            self._cache_blocks(request, num_computed // bs, min(total, request.num_tokens) // bs)
        return True

    def _blocks_out_of_window(self, first_query: int) -> int:
        """How many leading blocks hold only keys that no query from position first_query on reads."""
        if self.attention_reach is None:
            return 0
        return max(0, (first_query - self.attention_reach + 1) // self.block_size)

    def _drop_out_of_window(self, request: Request, first_query: int) -> None:
        """Give back the request's blocks that fell out of every window before a step from first_query."""
        end = min(self._blocks_out_of_window(first_query), len(request.block_ids))
        if end > request.num_dropped_blocks:
            blocks = self.block_pool.blocks
            self.block_pool.free_blocks([blocks[i] for i in request.block_ids[request.num_dropped_blocks:end]])
            request.num_dropped_blocks = end

    def keep_verified(self, request: Request, num_computed_before: int) -> None:
        """After a step that verified proposed tokens: free the blocks past the request's computed tokens
        (they held only rejected proposals) and register the blocks that kept proposals filled."""
        keep = -(-request.num_computed_tokens // self.block_size)
        if len(request.block_ids) > keep:
            blocks = self.block_pool.blocks
            self.block_pool.free_blocks([blocks[i] for i in reversed(request.block_ids[keep:])])
            del request.block_ids[keep:]
        if self.enable_caching:
            self._cache_blocks(request, num_computed_before // self.block_size,
                               min(request.num_computed_tokens, request.num_tokens) // self.block_size)

    def _cache_blocks(self, request: Request, first: int, end: int) -> None:
        """Register blocks [first, end) of the request, which are full once this step has run.
        Registering now, before the step runs, is safe: a request that hits them in this same step
        is in the same forward pass, and every layer writes the step's K/V before reading any."""
        self._hash_full_blocks(request, end * self.block_size)
        pool = self.block_pool
        for i in range(first, end):
            block = pool.blocks[request.block_ids[i]]
            if block.block_hash is None:
                pool.cache_full_block(block, request.block_hashes[i])

    def uncache_from(self, request: Request, num_tokens: int) -> None:
        """Take the request's blocks past its first num_tokens tokens out of the prefix cache (their
        K/V were never written: the step that was to write them failed)."""
        for block_id in request.block_ids[max(num_tokens // self.block_size, request.num_dropped_blocks):]:
            self.block_pool.uncache(self.block_pool.blocks[block_id])

    def fork(self, parent: Request, child: Request) -> int | None:
        """Give child (a new beam of parent's, all of whose tokens are computed) parent's block table: a
        reference on each full block, whose K/V the two now share. Returns parent's last block when it is partial:
        the child gets its own copy of it (the caller copies it into a fresh block before the next forward)."""
        num_full = parent.num_tokens // self.block_size
        child.num_dropped_blocks = min(parent.num_dropped_blocks, num_full)
        child.block_ids = parent.block_ids[:num_full]
        child.block_hashes = parent.block_hashes[:num_full]
        blocks = self.block_pool.blocks
        self.block_pool.touch([blocks[i] for i in child.block_ids[child.num_dropped_blocks:]])
        if parent.num_tokens % self.block_size == 0:
            return None
        return parent.block_ids[num_full]

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first; they keep their hashes until evicted."""
        blocks = self.block_pool.blocks
        self.block_pool.free_blocks([blocks[i] for i in reversed(request.block_ids[request.num_dropped_blocks:])])
        request.block_ids.clear()
        request.num_dropped_blocks = 0

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
