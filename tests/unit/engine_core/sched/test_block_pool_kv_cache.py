"""BlockPool and KVCacheManager: reference counts, LRU eviction, chained hashes, prefix hits."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.sampling_params import SamplingParams
from engine_core.sched.block_pool import BlockPool
from engine_core.sched.kv_cache_manager import KVCacheManager, hash_block_tokens
from engine_core.sched.request import Request

pytestmark = pytest.mark.unit

BS = 4


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=8))


def admit(kv: KVCacheManager, req: Request) -> int:
    """Admit the whole prompt in one chunk the way the scheduler does; returns the hit tokens."""
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits)
    req.num_computed_tokens = req.num_tokens
    return num_hit


# ---- BlockPool -------------------------------------------------------------------------------------

def test_new_blocks_pop_in_lru_order_and_free_appends_to_tail():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert (a.block_id, b.block_id) == (0, 1) and a.ref_cnt == b.ref_cnt == 1
    assert pool.num_free_blocks == 2 and pool.usage == 0.5
    pool.free_blocks([b, a])  # tail first, as a request frees
    assert [blk.block_id for blk in pool.get_new_blocks(4)] == [2, 3, 1, 0]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_evicting_a_cached_block_forgets_its_hash():
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    assert pool.cache_full_block(blk, 123)
    pool.free_blocks([blk])
    assert pool.get_cached_block(123) is blk  # freed, still hittable
    pool.get_new_blocks(1)  # takes block 1 (older in the queue); block 0 survives
    assert pool.get_cached_block(123) is blk
    (again,) = pool.get_new_blocks(1)
    assert again is blk and blk.block_hash is None and pool.get_cached_block(123) is None


def test_touch_takes_a_free_block_out_of_the_queue():
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_block(blk, 7)
    pool.free_blocks([blk])
    assert pool.num_free_blocks == 2
    pool.touch([blk])
    assert blk.ref_cnt == 1 and pool.num_free_blocks == 1
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free_blocks([blk, blk])
    assert blk.ref_cnt == 0 and pool.num_free_blocks == 2
    with pytest.raises(RuntimeError):
        pool.free_blocks([blk])


def test_cache_full_block_keeps_the_existing_mapping():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    assert pool.cache_full_block(a, 5)
    assert not pool.cache_full_block(b, 5)
    assert pool.get_cached_block(5) is a and b.block_hash is None


def test_reset_prefix_cache_only_when_nothing_is_in_use():
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_block(blk, 9)
    assert not pool.reset_prefix_cache()
    pool.free_blocks([blk])
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(9) is None and blk.block_hash is None


# ---- hashing ---------------------------------------------------------------------------------------

def test_hash_chains_over_the_parent():
    h1 = hash_block_tokens(None, [1, 2, 3, 4])
    assert h1 == hash_block_tokens(None, [1, 2, 3, 4])
    assert h1 != hash_block_tokens(None, [1, 2, 3, 5])
    assert hash_block_tokens(h1, [5, 6, 7, 8]) != hash_block_tokens(None, [5, 6, 7, 8])
    assert hash_block_tokens(h1, [5, 6, 7, 8]) != hash_block_tokens(h1 + 1, [5, 6, 7, 8])
    assert hash_block_tokens(None, [0]) != hash_block_tokens(0, [])


def test_request_block_hashes_chain_over_full_blocks_only():
    kv = KVCacheManager(8, BS)
    req = make_request("a", list(range(10)))
    kv.get_computed_blocks(req)
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    assert req.block_hashes == [h0, hash_block_tokens(h0, [4, 5, 6, 7])]


def test_keyed_by_prompt_rows_a_prompt_that_repeats_an_answer_hits_only_the_prompt_blocks():
    """Where prompt tokens have their own arithmetic (amx_quant.c), a block holding an answer's tokens is keyed by
    how many of its tokens were prompt tokens: a later prompt repeating that answer computes those tokens itself,
    while blocks of prompt tokens only are shared as ever (and keyed as ever)."""
    for keyed, hit_tokens in ((False, 12), (True, 8)):
        kv = KVCacheManager(10, BS, key_prompt_rows=keyed)
        a = make_request("a", list(range(10)))  # prompt [0-3] [4-7] [8, 9 + its first two answer tokens]
        admit(kv, a)
        for token in (50, 51, 52, 53):
            a.append_output_token(token)
        assert kv.allocate_slots(a, 4)
        a.num_computed_tokens = a.num_tokens
        kv.free(a)  # its full blocks (2 of prompt tokens, then 8 9 50 51, then 52 53 ...) stay cached
        assert a.block_hashes[:2] == [hash_block_tokens(None, [0, 1, 2, 3]),
                                      hash_block_tokens(a.block_hashes[0], [4, 5, 6, 7])]
        b = make_request("b", list(range(10)) + [50, 51, 52, 53, 77])  # the same tokens, all of them prompt now
        assert admit(kv, b) == hit_tokens


# ---- KVCacheManager ----------------------------------------------------------------------------------

def test_prefix_hit_shares_blocks_with_reference_counts():
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(10)))  # blocks [0-3] [4-7] [8,9]
    assert admit(kv, a) == 0
    assert len(a.block_ids) == 3 and kv.num_free_blocks == 7
    b = make_request("b", list(range(8)) + [99, 98, 97])
    assert admit(kv, b) == 8
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    pool = kv.block_pool
    assert [pool.blocks[i].ref_cnt for i in b.block_ids] == [2, 2, 1]
    assert kv.prefix_cache_queries == 21 and kv.prefix_cache_hits == 8
    kv.free(a)
    assert [pool.blocks[i].ref_cnt for i in b.block_ids] == [1, 1, 1] and a.block_ids == []
    kv.free(b)
    assert kv.num_free_blocks == 10 and kv.usage == 0.0


def test_hit_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    b = make_request("b", list(range(8)))  # identical: 2 full blocks cached, but only 1 may be a hit
    assert admit(kv, b) == 4
    c = make_request("c", list(range(9)))
    assert admit(kv, c) == 8


def test_freed_blocks_stay_hittable_until_evicted_tail_first():
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(12)))  # 3 full blocks
    admit(kv, a)
    a_blocks = list(a.block_ids)
    kv.free(a)
    assert kv.num_free_blocks == 4
    # one new block is needed: the never-used block 3 goes first, then a's tail, then its prefix
    x = make_request("x", [50, 51])
    admit(kv, x)
    b = make_request("b", list(range(12)) + [1])
    assert kv.get_computed_blocks(b)[1] == 12
    kv.free(x)
    # the free queue is now [a2, a1, a0, x]: two new blocks evict a's tail block, then its middle one
    y = make_request("y", [60, 61, 62, 63, 64, 65, 66])
    admit(kv, y)
    assert set(y.block_ids) == {a_blocks[2], a_blocks[1]}
    hits, num_hit = kv.get_computed_blocks(make_request("c", list(range(12)) + [1]))
    assert num_hit == 4 and hits[0].block_id == a_blocks[0]


def test_allocate_fails_without_changing_anything():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    b = make_request("b", list(range(8)) + list(range(100, 108)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    free_before = kv.num_free_blocks
    assert not kv.allocate_slots(b, 8, hits)  # needs 2 fresh blocks, 1 is free
    assert b.block_ids == [] and kv.num_free_blocks == free_before
    assert [blk.ref_cnt for blk in hits] == [1, 1]


def test_hits_in_the_free_queue_count_against_free_blocks():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    kv.free(a)  # both blocks cached and free; 3 free in all
    b = make_request("b", list(range(8)) + list(range(100, 109)))  # 2 hits + 3 fresh blocks: 5 > 3
    hits, _ = kv.get_computed_blocks(b)
    assert not kv.allocate_slots(b, 9, hits)
    assert kv.allocate_slots(b, 4, hits)  # a chunk: 2 hits + 1 fresh fits
    assert kv.num_free_blocks == 0 and len(b.block_ids) == 3


def test_decode_blocks_are_cached_when_they_fill():
    kv = KVCacheManager(8, BS)
    a = make_request("a", [1, 2, 3])
    admit(kv, a)
    assert kv.block_pool.cached_block_hash_to_block == {}
    a.append_output_token(4)  # the step's sampled token
    assert kv.allocate_slots(a, 1)  # computes token 4: block 0 becomes full
    a.num_computed_tokens += 1
    h0 = hash_block_tokens(None, [1, 2, 3, 4])
    assert kv.block_pool.get_cached_block(h0).block_id == a.block_ids[0]
    a.append_output_token(5)
    assert kv.allocate_slots(a, 1) and len(a.block_ids) == 2


def test_caching_off_never_hits_or_hashes():
    kv = KVCacheManager(8, BS, enable_caching=False)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    assert kv.block_pool.cached_block_hash_to_block == {}
    b = make_request("b", list(range(9)))
    assert kv.get_computed_blocks(b) == ([], 0)
    assert kv.prefix_cache_queries == 0


def test_reset_prefix_cache():
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    assert not kv.reset_prefix_cache()
    kv.free(a)
    assert kv.reset_prefix_cache()
    assert kv.get_computed_blocks(make_request("b", list(range(9))))[1] == 0


# ---- property: random admissions, growth and frees keep the pool consistent ---------------------------

def check_pool(kv: KVCacheManager, live: list[Request]) -> None:
    pool = kv.block_pool
    holders = {}
    for r in live:
        for i in r.block_ids:
            holders[i] = holders.get(i, 0) + 1
    for blk in pool.blocks:
        assert blk.ref_cnt == holders.get(blk.block_id, 0) >= 0
        assert (blk.ref_cnt == 0) == (blk.block_id in pool.free_queue)
    for h, blk in pool.cached_block_hash_to_block.items():
        assert blk.block_hash == h
    for r in live:
        # every shared block is a full, hashed block whose content matches the request's prefix
        for j, i in enumerate(r.block_ids):
            if pool.blocks[i].ref_cnt > 1:
                assert pool.blocks[i].block_hash == r.block_hashes[j]


ops = st.lists(st.tuples(st.sampled_from(["add", "grow", "free"]), st.integers(0, 10 ** 6)), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, num_blocks=st.integers(1, 12), caching=st.booleans())
def test_random_operations_keep_the_pool_consistent(ops, num_blocks, caching):
    kv = KVCacheManager(num_blocks, BS, caching)
    prefixes = [[7] * 9, list(range(6)), [3, 1, 4, 1, 5, 9, 2, 6]]
    live: list[Request] = []
    for n, (op, x) in enumerate(ops):
        if op == "add":
            tokens = prefixes[x % 3][: 1 + x % 9] + [x % 5] * (x % 4)
            req = make_request(str(n), tokens)
            hits, num_hit = kv.get_computed_blocks(req)
            assert num_hit < req.num_tokens and num_hit % BS == 0
            if kv.allocate_slots(req, req.num_tokens - num_hit, hits):
                req.num_computed_tokens = req.num_tokens
                live.append(req)
            else:
                assert req.block_ids == []
        elif op == "grow" and live:
            req = live[x % len(live)]
            req.append_output_token(x % 3)
            if kv.allocate_slots(req, 1):
                req.num_computed_tokens += 1
            else:
                req.all_token_ids.pop()
                req.output_token_ids.pop()
        elif op == "free" and live:
            kv.free(live.pop(x % len(live)))
        for r in live:
            assert len(r.block_ids) * BS >= r.num_computed_tokens
        check_pool(kv, live)
    for r in live:
        kv.free(r)
    assert kv.num_free_blocks == num_blocks
    check_pool(kv, [])


# ---- sliding windows --------------------------------------------------------------------------------

def test_blocks_out_of_the_window_go_back_to_the_pool_keeping_their_hashes():
    """Every layer slides with window 5: before a step from position c, blocks wholly before c - 4 are given back;
    their ids stay in the table, their hashes in the cache."""
    kv = KVCacheManager(8, BS, attention_reach=5)
    a = make_request("a", list(range(13)))  # blocks [0-3] [4-7] [8-11] [12]
    admit(kv, a)  # computed from 0: nothing out of the window yet
    assert a.num_dropped_blocks == 0 and kv.num_free_blocks == 4
    a.append_output_token(99)
    assert kv.allocate_slots(a, 1)  # the decode at 13 sees 9..13: blocks 0 and 1 go back
    assert a.num_dropped_blocks == 2 and len(a.block_ids) == 4 and kv.num_free_blocks == 6
    pool = kv.block_pool
    dropped = [pool.blocks[i] for i in a.block_ids[:2]]
    assert all(b.ref_cnt == 0 and b.block_hash is not None for b in dropped)
    # the same prompt again: hits on all three full blocks; the two before its window are noted, not held
    b = make_request("b", list(range(13)))
    assert admit(kv, b) == 12
    assert b.block_ids[:3] == a.block_ids[:3] and b.num_dropped_blocks == 2
    assert [pool.blocks[i].ref_cnt for i in b.block_ids] == [0, 0, 2, 1]
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 8 and a.num_dropped_blocks == b.num_dropped_blocks == 0


def test_without_a_reach_no_block_is_given_back():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(13)))
    admit(kv, a)
    a.append_output_token(99)
    assert kv.allocate_slots(a, 1) and a.num_dropped_blocks == 0 and kv.num_free_blocks == 4
