"""Scheduler: continuous batching, chunked prefill, preemption, aborts, stop checks, no deadlock.

A fake model stands in for the model runner. It writes each scheduled token into a simulated paged KV
cache (slot -> (position, token)) and, for every request whose chunk reached its last known token,
reads the whole context back through the request's block table and derives the next token from what
it read. A wrong block table, a stale or wrongly shared prefix block, or a bad recompute after a
preemption changes what it reads, so the outputs stop matching the reference generation.
"""

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire_messages import FinishReason, Logprobs
from common.sampling_params import SamplingParams
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request, RequestStatus
from engine_core.sched.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine_core.worker.step_input import build_step_input

pytestmark = pytest.mark.unit

EOS = 0
VOCAB = 24


def next_token(context) -> int:
    """The fake model: the next token is a hash of the (position, token) pairs it attends to."""
    return xxhash.xxh64_intdigest(repr(tuple(context)).encode()) % VOCAB


class FakeModel:
    def __init__(self, num_blocks: int, block_size: int, window: int | None = None):
        self.bs = block_size
        self.window = window  # every layer slides: a token sees the `window` positions up to its own
        self.slots: list[tuple[int, int] | None] = [None] * (num_blocks * block_size)

    def slot(self, req: Request, pos: int) -> int:
        assert pos // self.bs >= req.num_dropped_blocks, "read a block the request gave back"
        return req.block_ids[pos // self.bs] * self.bs + pos % self.bs

    def seen(self, end: int) -> range:
        return range(0 if self.window is None else max(0, end - self.window), end)

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        # like an attention layer: write every new token's K/V first, then read
        for s in out.scheduled:
            for p in range(s.num_computed_tokens_before, s.num_computed_tokens_before + s.num_new_tokens):
                self.slots[self.slot(s.request, p)] = (p, s.request.all_token_ids[p])
        sampled = {}
        for s in out.scheduled:
            end = s.num_computed_tokens_before + s.num_new_tokens
            if end == s.request.num_tokens:
                sampled[s.request.request_id] = [next_token(self.slots[self.slot(s.request, p)] for p in self.seen(end))]
        return sampled


def reference(prompt: list[int], params: SamplingParams, max_model_len: int,
              eos_ids=(EOS,), window: int | None = None) -> tuple[list[int], FinishReason]:
    """What a request generates when nothing goes wrong: no cache, no scheduler."""
    seq, out = list(prompt), []
    while True:
        t = next_token(list(enumerate(seq))[-window if window else 0:])
        seq.append(t)
        out.append(t)
        past_min = len(out) >= params.min_tokens
        if past_min and not params.ignore_eos and t in eos_ids:
            return out, FinishReason.STOP
        if past_min and t in params.stop_token_ids:
            return out, FinishReason.STOP
        if params.max_tokens is not None and len(out) >= params.max_tokens:
            return out, FinishReason.LENGTH
        if len(seq) >= max_model_len:
            return out, FinishReason.LENGTH


def make_scheduler(num_blocks=64, block_size=4, budget=64, max_num_seqs=8, max_model_len=64, caching=True,
                   window=None):
    kv = KVCacheManager(num_blocks, block_size, caching, attention_reach=window)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                             block_size=block_size, enable_prefix_caching=caching)
    return Scheduler(config, kv), FakeModel(num_blocks, block_size, window)


def make_request(rid, prompt, max_tokens=8, **kw) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw), eos_token_ids=[EOS])


def check_invariants(sched: Scheduler, out: SchedulerOutput) -> None:
    cfg, kv = sched.config, sched.kv
    # the step's prompt rows: exactly the rows at positions before their request's first output token
    runs = build_step_input(out, kv.block_size).step.prompt_runs
    flags = [p < s.request.num_prompt_tokens for s in out.scheduled
             for p in range(s.num_computed_tokens_before, s.num_computed_tokens_before + s.num_new_tokens)]
    assert runs == [x for a, b in zip(runs[::2], runs[1::2]) for x in (a, b) if a < b]  # ordered, none empty
    assert all(b < c for b, c in zip(runs[1::2], runs[2::2]))  # runs never touch: merged
    assert [any(a <= r < b for a, b in zip(runs[::2], runs[1::2])) for r in range(len(flags))] == flags
    assert out.total_num_scheduled_tokens == sum(s.num_new_tokens for s in out.scheduled)
    assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
    assert len(sched.running) <= cfg.max_num_seqs
    assert all(s.num_new_tokens >= 1 for s in out.scheduled)
    assert all(s.num_new_tokens == 1 for s in out.scheduled[:out.num_decodes])
    assert all(s.num_new_tokens > 1 for s in out.scheduled[out.num_decodes:])
    ids = [s.request.request_id for s in out.scheduled]
    assert len(ids) == len(set(ids)) and not set(ids) & set(out.preempted_ids)
    for s in out.scheduled:
        assert s.request in sched.running
        assert len(s.request.block_ids) * cfg.block_size >= s.num_computed_tokens_before + s.num_new_tokens
        assert s.num_computed_tokens_before + s.num_new_tokens <= s.request.num_tokens
    check_blocks(sched)


def check_blocks(sched: Scheduler) -> None:
    """Each block's ref_cnt is the number of running requests that hold it; waiting ones hold none."""
    pool = sched.kv.block_pool
    holders: dict[int, int] = {}
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert len(r.block_ids) * sched.config.block_size >= r.num_computed_tokens
        for i in r.block_ids[r.num_dropped_blocks:]:  # the blocks before these went back to the pool
            holders[i] = holders.get(i, 0) + 1
    for r in sched.waiting:
        assert r.block_ids == [] and r.num_computed_tokens == 0 and r.num_dropped_blocks == 0
    for blk in pool.blocks:
        assert blk.ref_cnt == holders.get(blk.block_id, 0) >= 0
        assert (blk.ref_cnt == 0) == (blk.block_id in pool.free_queue)


def step(sched: Scheduler, model: FakeModel, outputs: dict | None = None):
    out = sched.schedule()
    check_invariants(sched, out)
    results = sched.update_from_output(out, model.execute(out))
    check_blocks(sched)
    if outputs is not None:
        for o in results:
            tokens, _ = outputs.get(o.request_id, ([], None))
            outputs[o.request_id] = (tokens + o.new_token_ids, o.finish_reason)
    return out, results


def run_all(sched, model, outputs: dict | None = None, max_steps=10_000) -> dict:
    outputs = {} if outputs is None else outputs
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outputs
        step(sched, model, outputs)
    raise AssertionError("scheduler did not finish")


# ---- unit tests ------------------------------------------------------------------------------------

def test_single_request_matches_reference():
    sched, model = make_scheduler()
    prompt = [5, 6, 7, 8, 9]
    sched.add_request(make_request("a", prompt, max_tokens=6, ignore_eos=True))
    outputs = run_all(sched, model)
    assert outputs["a"] == (reference(prompt, SamplingParams(max_tokens=6, ignore_eos=True), 64)[0],
                            FinishReason.LENGTH)
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def test_chunked_prefill_spans_steps():
    sched, model = make_scheduler(budget=4)
    sched.add_request(make_request("a", list(range(1, 11)), ignore_eos=True))
    chunks = []
    for _ in range(3):
        out, results = step(sched, model)
        chunks.append((out.scheduled[0].num_computed_tokens_before, out.scheduled[0].num_new_tokens))
        assert (results == []) == (len(chunks) < 3)
    assert chunks == [(0, 4), (4, 4), (8, 2)]
    out, results = step(sched, model)
    assert out.num_decodes == 1 and out.scheduled[0].num_new_tokens == 1 and len(results) == 1


def test_mixed_batch_puts_decodes_first_and_obeys_the_budget():
    sched, model = make_scheduler(budget=6)
    sched.add_request(make_request("a", [1, 2, 3], ignore_eos=True))
    step(sched, model)  # a prefilled, 1 token sampled
    sched.add_request(make_request("b", list(range(1, 21)), ignore_eos=True))
    out, _ = step(sched, model)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 5)]
    assert out.num_decodes == 1 and out.total_num_scheduled_tokens == 6
    # b is still prefilling: it continues as a running request, after a's decode
    sched.add_request(make_request("c", [1, 2], ignore_eos=True))
    out, _ = step(sched, model)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 5)]
    assert out.num_decodes == 1


def test_decodes_are_listed_before_prefills_even_when_admitted_later():
    sched, model = make_scheduler(budget=20)
    sched.add_request(make_request("long", list(range(1, 16)), ignore_eos=True))
    sched.add_request(make_request("short", [1, 2], ignore_eos=True))
    step(sched, model)
    sched.add_request(make_request("new", list(range(1, 8)), ignore_eos=True))
    out, _ = step(sched, model)
    assert [s.request.request_id for s in out.scheduled] == ["long", "short", "new"]
    assert out.num_decodes == 2


def test_max_num_seqs_limits_admission():
    sched, model = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        sched.add_request(make_request(rid, [1, 2, 3], ignore_eos=True))
    out, _ = step(sched, model)
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"]
    assert sched.get_stats().gauges.num_waiting == 1 and sched.get_stats().gauges.num_running == 2


def test_preemption_takes_the_newest_and_recompute_gives_the_same_outputs():
    params = dict(max_tokens=4, ignore_eos=True)
    prompts = {"a": [1, 2, 3, 4], "b": [5, 6, 7]}
    # 4 blocks of 2 tokens: both prompts fit (2 blocks each); a's first decode needs a 5th block
    sched, model = make_scheduler(num_blocks=4, block_size=2, max_num_seqs=2, caching=False)
    for rid, p in prompts.items():
        sched.add_request(make_request(rid, p, **params))
    sched.add_request(make_request("c", [9], **params))  # waits: max_num_seqs is 2
    outputs: dict = {}
    step(sched, model, outputs)
    out, _ = step(sched, model, outputs)
    assert out.preempted_ids == ["b"] and [s.request.request_id for s in out.scheduled] == ["a"]
    assert [r.request_id for r in sched.waiting] == ["b", "c"]  # back at the front of the queue
    b = sched.waiting[0]
    assert (b.request_id, b.status, b.num_computed_tokens, b.num_preemptions) == ("b", RequestStatus.PREEMPTED, 0, 1)
    assert b.block_ids == [] and sched.get_stats().totals.num_preemptions == 1
    run_all(sched, model, outputs)
    # b's first token came before the preemption, the rest after recomputing prompt + that token
    for rid, p in (prompts | {"c": [9]}).items():
        assert outputs[rid] == (reference(p, SamplingParams(**params), 64)[0], FinishReason.LENGTH)
    assert sched.kv.num_free_blocks == 4


def test_a_request_that_is_itself_the_newest_preempts_itself():
    sched, model = make_scheduler(num_blocks=5, block_size=2, caching=False)
    for rid in "ab":
        sched.add_request(make_request(rid, [1, 2, 3, 4], max_tokens=4, ignore_eos=True))
    step(sched, model)
    out, _ = step(sched, model)  # a takes the last free block; b finds none and is the newest
    assert out.preempted_ids == ["b"] and [s.request.request_id for s in out.scheduled] == ["a"]
    outputs = run_all(sched, model)
    assert outputs["b"][1] == FinishReason.LENGTH


def test_running_request_that_outgrows_the_whole_pool_errors_instead_of_spinning():
    sched, model = make_scheduler(num_blocks=2, block_size=2, budget=1)
    sched.add_request(make_request("a", [1, 2, 3], max_tokens=10, ignore_eos=True))
    outputs = run_all(sched, model, max_steps=50)
    tokens, reason = outputs["a"]
    assert reason == FinishReason.ERROR and len(tokens) == 2  # 4 tokens fit, the 5th does not
    assert sched.kv.num_free_blocks == 2


def test_prompt_larger_than_the_pool_errors():
    sched, model = make_scheduler(num_blocks=2, block_size=2, budget=8)
    sched.add_request(make_request("big", [1, 2, 3, 4, 5], ignore_eos=True))
    sched.add_request(make_request("ok", [1, 2], max_tokens=2, ignore_eos=True))
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["ok"]
    results = sched.update_from_output(out, model.execute(out))
    err = next(o for o in results if o.request_id == "big")
    assert err.finish_reason == FinishReason.ERROR and "KV cache blocks" in err.error


def test_invalid_prompts_finish_with_an_error_output():
    sched, model = make_scheduler(max_model_len=8)
    sched.add_request(make_request("empty", []))
    sched.add_request(make_request("long", list(range(8))))
    assert sched.has_unfinished_requests() and sched.get_num_unfinished_requests() == 0
    out, results = step(sched, model)
    assert {o.request_id: o.finish_reason for o in results} == {"empty": FinishReason.ERROR,
                                                                "long": FinishReason.ERROR}
    assert not sched.has_unfinished_requests()


def test_abort_frees_blocks_and_reports():
    sched, model = make_scheduler(num_blocks=8)
    sched.add_request(make_request("a", list(range(1, 10)), ignore_eos=True))
    sched.add_request(make_request("b", list(range(1, 10)), ignore_eos=True))
    step(sched, model)
    assert sched.kv.num_free_blocks < 8
    results = sched.abort_requests(["a", "nope", "b", "a"])
    assert [(o.request_id, o.finish_reason, o.new_token_ids) for o in results] == [
        ("a", FinishReason.ABORT, []), ("b", FinishReason.ABORT, [])]
    assert sched.kv.num_free_blocks == 8 and not sched.has_unfinished_requests()
    assert sched.schedule().finished_ids == ["a", "b"]
    assert sched.abort_requests(["a"]) == []
    assert sched.get_stats().totals.num_aborted == 2  # unknown and finished ids count nothing


def test_abort_between_schedule_and_update_is_skipped():
    sched, model = make_scheduler()
    sched.add_request(make_request("a", [1, 2, 3], ignore_eos=True))
    sched.add_request(make_request("b", [4, 5, 6], ignore_eos=True))
    out = sched.schedule()
    sampled = model.execute(out)
    sched.abort_requests(["a"])
    results = sched.update_from_output(out, sampled)
    assert [o.request_id for o in results] == ["b"]
    check_blocks(sched)


def test_abort_a_waiting_request():
    sched, model = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", [1, 2], ignore_eos=True))
    sched.add_request(make_request("b", [1, 2], ignore_eos=True))
    step(sched, model)
    assert [o.finish_reason for o in sched.abort_requests(["b"])] == [FinishReason.ABORT]
    assert len(sched.waiting) == 0 and len(sched.running) == 1


def test_stop_conditions():
    prompt = [3, 1, 4]
    first = reference(prompt, SamplingParams(max_tokens=1), 64)[0][0]
    cases = [
        (dict(max_tokens=5), [first], dict(eos_token_ids=[first]), FinishReason.STOP, None),
        (dict(max_tokens=5, ignore_eos=True), None, dict(eos_token_ids=[first]), None, None),
        (dict(max_tokens=5, min_tokens=2), None, dict(eos_token_ids=[first]), None, None),
        (dict(max_tokens=5, stop_token_ids=[first]), [first], {}, FinishReason.STOP, first),
        (dict(max_tokens=1), [first], {}, FinishReason.LENGTH, None),
    ]
    for params, tokens, extra, reason, stop_reason in cases:
        sched, model = make_scheduler()
        kw = {"eos_token_ids": []} | extra
        sched.add_request(Request("r", prompt, SamplingParams(**params), **kw))
        _, results = step(sched, model)
        assert results[0].new_token_ids == [first]
        if reason is None:
            assert results[0].finish_reason is None
        else:
            assert (results[0].finish_reason, results[0].stop_reason) == (reason, stop_reason)


def test_max_model_len_ends_with_length():
    sched, model = make_scheduler(max_model_len=6)
    sched.add_request(make_request("a", [1, 2, 3], max_tokens=None, ignore_eos=True))
    tokens, reason = run_all(sched, model)["a"]
    assert len(tokens) == 3 and reason == FinishReason.LENGTH


def test_prefix_hits_are_reported_and_reused():
    sched, model = make_scheduler(num_blocks=16, block_size=4)
    shared = list(range(1, 13))
    sched.add_request(make_request("a", shared + [20], max_tokens=2, ignore_eos=True))
    run_all(sched, model)
    sched.add_request(make_request("b", shared + [21, 22], max_tokens=2, ignore_eos=True))
    out, results = step(sched, model)
    assert (out.scheduled[0].num_computed_tokens_before, out.scheduled[0].num_new_tokens) == (12, 2)
    assert results[0].num_cached_tokens == 12
    stats = sched.get_stats()
    assert (stats.totals.prefix_cache_queries, stats.totals.prefix_cache_hits) == (13 + 14, 12)
    step_counts = sched.step_counts()
    assert step_counts.num_prompt_tokens == 2 and step_counts.num_generation_tokens == 1
    assert stats.gauges.num_total_blocks == 16 and stats.gauges.num_running == 1


def test_stats_count_prompt_and_generation_tokens_per_step():
    sched, model = make_scheduler(budget=5)
    sched.add_request(make_request("a", [1, 2, 3], ignore_eos=True))
    sched.add_request(make_request("b", list(range(1, 9)), ignore_eos=True))
    step(sched, model)  # a: 3 prompt tokens (sampled), b: 2
    stats = sched.get_stats()
    step_counts = sched.step_counts()
    assert (step_counts.num_prompt_tokens, step_counts.num_generation_tokens) == (5, 1)
    gauges = stats.gauges
    assert 0 < gauges.kv_cache_usage <= 1 and gauges.num_free_blocks + 2 == gauges.num_total_blocks


def test_same_outputs_with_or_without_preemption_and_caching():
    prompts = {f"r{i}": [1 + i % 3] * 6 + [i] * (i % 5) + [7] for i in range(8)}

    def run(**kw):
        sched, model = make_scheduler(**kw)
        for rid, p in prompts.items():
            sched.add_request(make_request(rid, p, max_tokens=12, ignore_eos=True))
        return run_all(sched, model), sched.get_stats().totals.num_preemptions

    roomy, n0 = run(num_blocks=128, caching=False)
    tight, n1 = run(num_blocks=9, block_size=4, budget=7, caching=True)
    assert n0 == 0 and n1 > 0
    assert roomy == tight


# ---- property: random workloads -------------------------------------------------------------------

PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15], [9] * 12]


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_model_len = draw(st.integers(4, 24))
    # often just enough blocks for one request at max_model_len: requests compete and get preempted
    fits_one = -(-max_model_len // block_size)
    cfg = dict(
        block_size=block_size,
        num_blocks=draw(st.one_of(st.integers(1, 16), st.integers(fits_one, fits_one + 4))),
        budget=draw(st.integers(1, 12)),
        max_num_seqs=draw(st.integers(1, 6)),
        max_model_len=max_model_len,
        caching=draw(st.booleans()),
        window=draw(st.sampled_from([None, None, 1, 3, 6])),  # every layer slides: blocks go back as requests grow
    )
    n = draw(st.integers(2, 8))
    reqs = []
    for i in range(n):
        prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
        prompt = prefix[:draw(st.integers(1, len(prefix)))] + draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))
        prompt = prompt[:cfg["max_model_len"] - 1]
        params = SamplingParams(max_tokens=draw(st.integers(1, 16)), min_tokens=draw(st.integers(0, 2)),
                                ignore_eos=draw(st.booleans()),
                                stop_token_ids=draw(st.lists(st.integers(1, VOCAB - 1), max_size=1)))
        params.min_tokens = min(params.min_tokens, params.max_tokens)
        arrival = draw(st.integers(0, 6))
        abort_at = draw(st.one_of(st.none(), st.integers(0, 30)))
        reqs.append((f"r{i}", prompt, params, arrival, abort_at))
    return cfg, reqs


@st.composite
def crowded_workloads(draw):
    """Everyone at once, long generations, a pool that holds one full-length request and a little more:
    preemption on nearly every example."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_model_len = draw(st.integers(8, 24))
    fits_one = -(-max_model_len // block_size)
    cfg = dict(block_size=block_size, num_blocks=draw(st.integers(fits_one, fits_one + 3)),
               budget=draw(st.integers(1, 16)), max_num_seqs=draw(st.integers(2, 6)),
               max_model_len=max_model_len, caching=draw(st.booleans()),
               window=draw(st.sampled_from([None, 3, 6])))
    reqs = []
    for i in range(draw(st.integers(2, 6))):
        prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
        prompt = (prefix[:draw(st.integers(1, len(prefix)))] + [i + 1])[:max_model_len - 1]
        reqs.append((f"r{i}", prompt, SamplingParams(max_tokens=max_model_len, ignore_eos=True), 0, None))
    return cfg, reqs


def drive(cfg: dict, reqs: list) -> dict:
    """Run a workload of (id, prompt, params, arrival step, abort step or None) to the end, checking the
    invariants every step; then check that every block came back and every output is the reference's."""
    sched, model = make_scheduler(**cfg)
    bs, num_blocks, max_model_len = cfg["block_size"], cfg["num_blocks"], cfg["max_model_len"]
    outputs: dict = {}
    requests: dict[str, Request] = {}
    aborted = set()
    last_arrival = max(r[3] for r in reqs)
    # the oldest running request is never preempted and advances every step, so each request,
    # in FCFS order, is done within max_model_len + 1 steps of becoming the oldest
    bound = last_arrival + 1 + len(reqs) * (max_model_len + 2)
    for t in range(bound):
        for rid, prompt, params, arrival, abort_at in reqs:
            if arrival == t:
                requests[rid] = Request(rid, prompt, params, eos_token_ids=[EOS])
                sched.add_request(requests[rid])
            if abort_at == t and rid in requests:
                for o in sched.abort_requests([rid]):
                    aborted.add(rid)
                    outputs[rid] = (outputs.get(rid, ([], None))[0], o.finish_reason)
        if t >= last_arrival and not sched.has_unfinished_requests():
            break
        if sched.has_unfinished_requests():
            step(sched, model, outputs)
    else:
        raise AssertionError(f"not finished in {bound} steps")

    assert sched.kv.num_free_blocks == num_blocks
    assert not sched.running and not sched.waiting
    for rid, prompt, params, _, _ in reqs:
        tokens, reason = outputs[rid]
        req = requests[rid]
        assert req.is_finished and req.output_token_ids == tokens
        expected, expected_reason = reference(prompt, params, max_model_len, window=cfg.get("window"))
        if rid in aborted:
            assert reason == FinishReason.ABORT and tokens == expected[:len(tokens)]
        elif reason == FinishReason.ERROR:
            # only a request that can never fit the whole pool may fail
            assert -(-req.num_tokens // bs) > num_blocks
            assert tokens == expected[:len(tokens)]
        else:
            assert (tokens, reason) == (expected, expected_reason)
    return sched.get_stats()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_finish_free_everything_and_match_the_reference(workload):
    drive(*workload)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_workloads())
def test_crowded_workloads_preempt_and_still_match_the_reference(workload):
    drive(*workload)


def scored_step(sched: Scheduler, model: FakeModel):
    """A step whose scored rows get fake prompt logprobs: the target token, and minus the row's position."""
    out = sched.schedule()
    planned = build_step_input(out, sched.kv.block_size)
    step_in, at, scored = planned.step, 0, {}
    for req, count in planned.scored:
        rows = step_in.scored_rows[at:at + count]
        scored[req.request_id] = [Logprobs(token_id=step_in.scored_targets[at + i], logprob=-step_in.positions[r],
                                           rank=1) for i, r in enumerate(rows)]
        at += count
    return planned, sched.update_from_output(out, model.execute(out), None, scored)


def test_prompt_logprobs_gather_over_chunks_and_a_preemption_and_go_out_once():
    sched, model = make_scheduler(budget=16)
    prompt = [(7 * i) % (VOCAB - 1) + 1 for i in range(40)]
    sched.add_request(make_request("warm", prompt, max_tokens=1))  # its blocks now cached: the scored one must not hit
    run_all(sched, model)
    req = make_request("a", prompt, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
    sched.add_request(req)
    planned, results = scored_step(sched, model)
    assert [(r.request_id, n) for r, n in planned.scored] == [("a", 16)] and results == []
    sched.running.remove(req)
    sched._preempt(req)  # mid-prefill: its first chunk is computed again
    outputs = []
    while not outputs:
        planned, outputs = scored_step(sched, model)
    (first,) = outputs
    assert first.num_cached_tokens == 0
    assert [(lp.token_id, lp.logprob) for lp in first.prompt_logprobs] == [(prompt[p + 1], -p) for p in range(39)]
    sched.running.remove(req)
    sched._preempt(req)  # with an output token: the recompute scores nothing and sends nothing again
    planned, outputs = scored_step(sched, model)
    assert planned.scored == [] and all(not o.prompt_logprobs for o in outputs)
    run_all(sched, model)
    check_blocks(sched)


# ---- sliding windows: blocks out of every window go back to the pool ------------------------------------

def test_a_long_generation_gives_back_the_blocks_that_left_the_window():
    """Window 8, blocks of 4: a 60-token sequence holds at most 4 blocks (its window, the block being written and
    one more) in a pool of 6, where it would need 15; its tokens are the windowed reference's."""
    window, prompt = 8, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    sched, model = make_scheduler(num_blocks=6, block_size=4, budget=5, max_model_len=64, window=window)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    sched.add_request(Request("long", prompt, params, eos_token_ids=[EOS]))
    outputs, most_held = {}, 0
    while sched.has_unfinished_requests():
        step(sched, model, outputs)
        most_held = max(most_held, sched.kv.num_blocks - sched.kv.num_free_blocks)
    assert outputs["long"] == reference(prompt, params, 64, window=window)
    assert most_held <= 4 and sched.get_stats().totals.num_preemptions == 0
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def test_windowed_prefix_hits_and_preemption_give_the_reference_tokens():
    """Shared prefixes (hits on blocks already out of the window are noted, not held), a pool so small that
    requests are preempted and recomputed: every request's tokens are the windowed reference's, no block leaks."""
    window = 6
    prompts = {f"r{i}": PREFIXES[i % 3] + [i + 1] * (i % 4 + 1) for i in range(8)}
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    results = []
    for num_blocks, budget in ((64, 64), (9, 7)):
        sched, model = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget, window=window)
        for rid, p in prompts.items():
            sched.add_request(Request(rid, p, params, eos_token_ids=[EOS]))
        outputs = run_all(sched, model)
        assert {rid: out for rid, out in outputs.items()} == {
            rid: reference(p, params, 64, window=window) for rid, p in prompts.items()}
        assert sched.kv.num_free_blocks == sched.kv.num_blocks
        results.append((sched.get_stats().totals.num_preemptions, sched.kv.prefix_cache_hits))
    (roomy_preemptions, roomy_hits), (tight_preemptions, _) = results
    assert roomy_preemptions == 0 and tight_preemptions > 0 and roomy_hits > 0
