"""Beam groups in the scheduler and the KV cache manager, with a fake model and no torch.

The fake model keeps a paged KV cache of (position, token) per slot. Before each step it runs the step's block
copies, then writes every scheduled token and reads each sampled row's whole context back through its block table:
a wrong fork, a shared block written by another beam or a missing copy on write reads a wrong context, which the
test asserts against the beam's own tokens. Its top logprobs are a hash of that context, so they are random per
beam but the same for the same sequence, whatever the batch. Under random widths, budgets, pool sizes (so groups
are preempted and restarted) and aborts: every block is free at the end, no reference count goes below zero
(the pool raises), beams share full blocks while they run, and each search that finishes gives the beams it
gives alone.
"""

import random

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.beam_search_params import BeamSearchParams
from common.wire_messages import FinishReason, Logprobs
from common.sampling_params import SamplingParams
from engine_core.sched.beam_group import BeamGroup
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request
from engine_core.sched.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

pytestmark = pytest.mark.unit

EOS = 0
VOCAB = 40
BLOCK_SIZE = 4
MAX_MODEL_LEN = 48


class FakeModel:
    def __init__(self, num_blocks: int):
        self.slots: list[tuple[int, int] | None] = [None] * (num_blocks * BLOCK_SIZE)

    def slot(self, req: Request, pos: int) -> int:
        return req.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, list[int]], dict[str, list[Logprobs]]]:
        for src, dst in out.block_copies:
            self.slots[dst * BLOCK_SIZE:(dst + 1) * BLOCK_SIZE] = self.slots[src * BLOCK_SIZE:(src + 1) * BLOCK_SIZE]
        for s in out.scheduled:
            for p in range(s.num_computed_tokens_before, s.num_computed_tokens_before + s.num_new_tokens):
                self.slots[self.slot(s.request, p)] = (p, s.request.all_token_ids[p])
        sampled, logprobs = {}, {}
        for s in out.scheduled:
            req = s.request
            end = s.num_computed_tokens_before + s.num_new_tokens
            if end != req.num_tokens:
                continue
            context = [self.slots[self.slot(req, p)] for p in range(end)]
            assert context == list(enumerate(req.all_token_ids)), f"{req.request_id} read another sequence's K/V"
            rng = random.Random(xxhash.xxh64_intdigest(repr(context).encode()))
            k = req.sampling_params.logprobs or 1
            ids = rng.sample(range(VOCAB), k)
            values = sorted((-rng.uniform(0.0, 4.0) for _ in ids), reverse=True)
            sampled[req.request_id] = [ids[0]]
            logprobs[req.request_id] = [Logprobs(ids[0], values[0], 1, ids, values)]
        return sampled, logprobs


def beam_request(rid: str, prompt: list[int], params: BeamSearchParams) -> Request:
    request = Request(rid, prompt, SamplingParams(max_tokens=params.max_tokens), eos_token_ids=[EOS])
    BeamGroup(request, params, VOCAB)
    return request


def run(requests: list[Request], num_blocks: int, budget: int, aborts: dict[int, int] | None = None,
        plain: list[Request] = ()) -> tuple[dict, int, KVCacheManager, Scheduler]:
    """Steps until every request is done; returns ({request id: its beams (or None when aborted or failed)},
    the largest reference count seen, the KV cache manager, the scheduler). aborts: step -> index of the request to
    abort then."""
    kv = KVCacheManager(num_blocks, BLOCK_SIZE)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE), kv)
    model = FakeModel(num_blocks)
    for r in list(requests) + list(plain):
        scheduler.add_request(r)
    results, most_shared = {}, 0
    for step in range(2000):
        if not scheduler.has_unfinished_requests():
            break
        if aborts and step in aborts:
            scheduler.abort_requests([requests[aborts[step] % len(requests)].request_id])
        out = scheduler.schedule()
        most_shared = max([most_shared] + [b.ref_cnt for b in kv.block_pool.blocks])
        sampled, logprobs = model.execute(out)
        for o in scheduler.update_from_output(out, sampled, logprobs):
            if o.finish_reason is not None:
                results[o.request_id] = [(b.token_ids, b.score) for b in o.beams] or None
    else:
        raise AssertionError("the requests never finished")
    return results, most_shared, kv, scheduler


@st.composite
def searches(draw):
    n = draw(st.integers(1, 3))
    return [(f"r{i}", draw(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=9)),
             BeamSearchParams(beam_width=draw(st.integers(1, 4)), max_tokens=draw(st.integers(1, 14)),
                              length_penalty=draw(st.sampled_from([0.5, 1.0, 2.0])), ignore_eos=draw(st.booleans())))
            for i in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases=searches(), num_blocks=st.integers(6, 40), budget=st.integers(4, 24),
       aborts=st.dictionaries(st.integers(0, 30), st.integers(0, 2), max_size=2), with_plain=st.booleans())
def test_beam_groups_free_every_block_and_give_their_beams_alone(cases, num_blocks, budget, aborts, with_plain):
    alone = {rid: run([beam_request(rid, p, params)], 64, 64)[0][rid] for rid, p, params in cases}
    plain = [Request("plain", [3, 4, 5, 6, 7], SamplingParams(max_tokens=12, ignore_eos=True))] if with_plain else []
    results, _, kv, scheduler = run([beam_request(rid, p, params) for rid, p, params in cases], num_blocks, budget,
                                    aborts, plain)
    assert kv.num_free_blocks == kv.num_blocks
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    for rid, beams in results.items():
        if beams is not None and rid in alone:  # not aborted, not failed
            assert beams == alone[rid], rid


def test_forks_share_full_blocks_and_copy_partial_ones():
    params = BeamSearchParams(beam_width=4, max_tokens=12, ignore_eos=True)
    results, most_shared, kv, scheduler = run([beam_request("r", [5, 6, 7, 8, 9, 10], params)], 40, 32)
    assert most_shared > 1  # the prompt's full block is held by several beams at once
    assert len(results["r"]) == 4 and all(len(tokens) == 12 for tokens, _ in results["r"])
    assert kv.num_free_blocks == kv.num_blocks


def test_preempted_group_restarts_and_gives_the_same_beams():
    params = BeamSearchParams(beam_width=3, max_tokens=10, ignore_eos=True)
    alone = {rid: run([beam_request(rid, prompt, params)], 64, 64)[0][rid] for rid, prompt in (("a", [1, 2, 3]),
                                                                                              ("b", [4, 5, 6]))}
    # two groups in a pool that cannot hold both at full length: the newer one is preempted and restarts
    results, _, kv, scheduler = run([beam_request("a", [1, 2, 3], params), beam_request("b", [4, 5, 6], params)],
                                    9, 32)
    assert scheduler.num_preemptions > 0
    assert results == alone
    assert kv.num_free_blocks == kv.num_blocks


def test_too_wide_a_search_fails_with_a_reason():
    request = beam_request("w", [1, 2], BeamSearchParams(beam_width=8, max_tokens=4))
    kv = KVCacheManager(16, BLOCK_SIZE)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE), kv)
    scheduler.add_request(request)
    (out,) = scheduler.update_from_output(scheduler.schedule(), {})
    assert out.finish_reason == FinishReason.ERROR and "beam_width 8" in out.error
    assert kv.num_free_blocks == kv.num_blocks
