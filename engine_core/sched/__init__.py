"""Continuous batching: which requests run in a step, and the KV blocks they hold.

- request.py: a request as the engine core tracks it.
- scheduler.py: the token budget, admission, preemption, and the outputs of a step.
- kv_cache_manager.py: per-request block tables, prefix caching on top of the block pool.
- block_pool.py: the fixed pool of KV cache blocks, their hashes and reference counts.
- speculator.py: what the scheduler asks of a speculative proposer (spec_decode/ answers it).
"""
