"""Speculative decoding, unit by unit: the n-gram proposer, the settings, the verification's statistics,
the scheduler's KV blocks for proposals, the metrics and the log line."""

import argparse
import logging

import msgspec
import numpy as np
import pytest
import torch
from scipy import stats

from common.config import EngineArgs
from common.wire_messages import SchedulerStats, SchedulerTotals
from common.sampling_params import SamplingParams
from common.speculative import SpeculativeConfig, parse_speculative_config
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request
from engine_core.sample.sampler import Sampler
from engine_core.sched.scheduler import Scheduler, SchedulerConfig
from engine_core.sample import rejection
from engine_core.spec_decode.ngram import NgramProposer
from engine_core.spec_decode.proposer import NgramSpeculator
from tests.support.sampling_reference import target_distribution

pytestmark = pytest.mark.unit

# ---- n-gram proposals ---------------------------------------------------------------------------------

def test_ngram_takes_the_latest_match_of_the_longest_suffix():
    p = NgramProposer(min_n=1, max_n=3)
    #          0  1  2  3  4  5  6  7  8  9 10
    tokens = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    # the last 3 (2, 6, 7) never occurred before; the last 2 (6, 7) did at 1 and 5: the latest wins
    assert p.propose(tokens, 3) == [9, 2, 6]
    assert p.propose(tokens, 1) == [9]
    assert p.propose(tokens + [8], 4) == [1, 6, 7, 9]  # (6, 7, 8) occurred at 1
    assert NgramProposer(1, 1).propose([1, 2, 3, 4], 2) == []  # nothing recurs
    assert p.propose([4, 4, 4, 4], 2) == [4]  # the match must leave a token after it: overlap allowed
    assert p.propose(tokens, 0) == []


def test_ngram_is_not_fooled_by_matches_across_token_boundaries():
    # as little-endian 4-byte words, a then b hold the bytes of 0x200 (00 02 00 00) straddling them
    a, b, suffix = 0x00123456, 0x07000002, 0x200
    assert NgramProposer(1, 1).propose([suffix, 9, a, b, 5, suffix], 2) == [9, a]
    assert NgramProposer(1, 1).propose([a, b, 5, suffix], 2) == []


def test_ngram_min_n_is_respected():
    assert NgramProposer(2, 3).propose([1, 2, 9, 3, 2], 2) == []  # only a 1-token suffix recurs
    assert NgramProposer(1, 3).propose([1, 2, 9, 3, 2], 2) == [9, 3]


# ---- settings ---------------------------------------------------------------------------------------

def test_speculative_config_forms_and_errors():
    c = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 4, 5, 1)
    assert parse_speculative_config({"model": "/m", "num_speculative_tokens": 2}).method == "draft_model"
    assert EngineArgs(speculative_config={"num_speculative_tokens": 3}).speculative_config.method == "ngram"
    bad = [
        ('{"num_speculative_tokens": 0}', "speculative_config.num_speculative_tokens must be from 1 to 16"),
        ('{"num_speculative_tokens": 2, "method": "eagle9"}', "speculative_config.method must be one of"),
        ('{"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}',
         "speculative_config.prompt_lookup_max must be at least prompt_lookup_min"),
        ('{"num_speculative_tokens": 2, "method": "draft_model"}', "speculative_config.model must name"),
        ('{"num_speculative_tokens": 2, "lookahead": 2}', "unknown field `lookahead`"),
        ('{"num_speculative_tokens": "4"}', "num_speculative_tokens"),
        ("{not json", "speculative_config is not valid JSON"),
        ("[4]", "speculative_config must be a JSON object"),
    ]
    for text, message in bad:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            EngineArgs(speculative_config=text).validate()


def test_cli_flag_rejects_a_bad_config_with_the_field_named():
    from common.cli.engine_args import add_engine_args, engine_args_from
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_args(parser)
    ns = parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert engine_args_from(ns).speculative_config.num_speculative_tokens == 4
    with pytest.raises(argparse.ArgumentError, match="num_speculative_tokens must be from 1 to 16"):
        parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 99}'])


# ---- verification keeps the target distribution ------------------------------------------------------

def _peaked_logits(vocab: int, rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 2.0


# Each case: the request's parameters and history, and `wrong`, what a mistaken sampler would do instead
# (other parameters, the prompt left out of the repetition penalty, row 1 not counting the proposal), which
# the same counts must reject: the test is shown to tell the distributions apart. Row 0 of the seed-1
# logits is mostly negative with its top token 9 positive; the histories put tokens of both signs in the
# prompt and in the output, some repeated, some in both. "same_rows" gives row 1 row 0's logits, so that the
# first proposal (row 0's second likeliest) is likely there too and its penalty shows.
_PENALTIES = dict(repetition_penalty=1.6, frequency_penalty=0.4, presence_penalty=0.3)
_VERIFY_CASES = {
    "temperature": dict(params=SamplingParams(temperature=1.0), wrong=dict(temperature=0.8)),
    "top-k-top-p": dict(params=SamplingParams(temperature=0.7, top_k=6, top_p=0.9), wrong=dict(top_p=1.0)),
    "min-p": dict(params=SamplingParams(temperature=1.0, min_p=0.1), wrong=dict(min_p=0.0)),
    "penalties": dict(params=SamplingParams(**_PENALTIES), prompt=[9, 4, 4, 0], output=[11, 11, 5, 4, 11],
                      wrong=dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)),
    "penalties-prompt": dict(params=SamplingParams(**_PENALTIES), prompt=[9, 4, 4, 0], output=[11, 11, 5, 4, 11],
                             wrong=dict(prompt=[])),
    "penalties-proposal": dict(params=SamplingParams(**_PENALTIES), prompt=[9, 0], output=[11, 11, 5],
                               same_rows=True, wrong=dict(proposal_unseen=True)),
    "everything": dict(params=SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.05, **_PENALTIES),
                       prompt=[9, 4, 0], output=[11, 5, 11], wrong=dict(min_p=0.0, frequency_penalty=0.0)),
}


@pytest.mark.parametrize("case", list(_VERIFY_CASES))
def test_rejection_sampling_keeps_the_target_distribution(case):
    """Many requests verify the same 2 proposals against the same logits: the first emitted token must be
    distributed as p_0 and the second, given that the first was the proposal, as p_1 (chi-square), where
    row 1 counts the first proposal as generated (penalties see it)."""
    case = {"prompt": [1, 2, 3], "output": [], "same_rows": False, **_VERIFY_CASES[case]}
    params, prompt, output, wrong = case["params"], case["prompt"], case["output"], dict(case["wrong"])
    vocab, num = 12, 30000
    logits = _peaked_logits(vocab, 3, seed=1)
    if case["same_rows"]:
        logits[1] = logits[0]
    rows = logits.numpy()
    p0 = target_distribution(rows[0], params, prompt, output)
    drafts = [int(np.argsort(-p0)[1])]  # a likely but not the likeliest first
    p1 = target_distribution(rows[1], params, prompt, output + drafts)
    drafts.append(int(p1.argmax()))
    sampler = Sampler(torch.device("cpu"), seed=0)
    reqs = []
    for i in range(num):
        reqs.append(Request(f"r{i}", prompt, params))
        for t in output:
            reqs[-1].append_output_token(t)
    tokens, _ = rejection.verify(sampler, logits.repeat(num, 1), reqs, [drafts] * num)
    first = np.bincount([t[0] for t in tokens], minlength=vocab)
    assert _fit_pvalue(first, p0) > 1e-4
    seconds = [t[1] for t in tokens if t[0] == drafts[0]]
    assert len(seconds) > 2000
    seconds = np.bincount(seconds, minlength=vocab)
    assert _fit_pvalue(seconds, p1) > 1e-4
    kept = sum(len(t) - 1 for t in tokens) / num
    assert 0.1 < kept < 1.9  # both outcomes happened often: the test saw acceptance and rejection
    # the same counts reject the wrong expectation: the test has the power to see that mistake
    if wrong.pop("proposal_unseen", False):
        counts, right, mistaken = seconds, p1, target_distribution(rows[1], params, prompt, output)
    else:
        mistaken_prompt = wrong.pop("prompt", prompt)
        mistaken_params = msgspec.structs.replace(params, **wrong)
        counts, right, mistaken = first, p0, target_distribution(rows[0], mistaken_params, mistaken_prompt, output)
    assert not np.allclose(mistaken, right)
    assert _fit_pvalue(counts, mistaken) < 1e-6


def _fit_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of the counts against probs; 0 when a token of probability 0 was emitted."""
    support = probs > 0
    if counts[~support].sum():
        return 0.0
    return stats.chisquare(counts[support], probs[support] / probs[support].sum() * counts.sum()).pvalue


def test_greedy_verification_keeps_proposals_while_they_are_the_argmax():
    logits = _peaked_logits(50, 4, seed=3)
    best = logits.argmax(dim=-1).tolist()
    sampler = Sampler(torch.device("cpu"), seed=0)
    req = Request("g", [1], SamplingParams(temperature=0, logprobs=1))
    tokens, lps = rejection.verify(sampler, logits, [req], [[best[0], best[1], (best[2] + 1) % 50]])
    assert tokens == [[best[0], best[1], best[2]]]
    assert [lp.token_id for lp in lps[0]] == tokens[0]
    raw = torch.log_softmax(logits, dim=-1)
    assert [lp.logprob for lp in lps[0]] == pytest.approx([raw[j, best[j]].item() for j in range(3)])
    tokens, _ = rejection.verify(sampler, logits, [req], [best[:3]])
    assert tokens == [best]  # all kept: the bonus token comes from the last row


def test_seeded_verification_repeats_and_ignores_the_batch():
    logits = _peaked_logits(20, 3, seed=5)
    params = SamplingParams(temperature=1.0, seed=42)
    drafts = [int(logits[0].argmax()), int(logits[1].argmax())]
    alone = rejection.verify(Sampler(torch.device("cpu"), 0), logits, [Request("a", [1], params)], [drafts])[0]
    other = Request("o", [1], SamplingParams(temperature=1.0))
    batched = rejection.verify(Sampler(torch.device("cpu"), 9), torch.cat([logits, logits]),
                               [other, Request("a", [1], params)], [drafts, drafts])[0]
    assert batched[1] == alone[0]


# ---- the scheduler's blocks for proposals ------------------------------------------------------------

class _FixedSpeculator(NgramSpeculator):
    def __init__(self, k):
        super().__init__(SpeculativeConfig(method="ngram", num_speculative_tokens=k))


def test_proposal_blocks_are_allocated_then_rolled_back_and_kept_blocks_cached():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=60, block_size=4), kv, _FixedSpeculator(6))
    req = Request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], SamplingParams(temperature=0, max_tokens=30))
    sched.add_request(req)
    sched.update_from_output(sched.schedule(), {"a": [4]})  # prefill
    out = sched.schedule()  # a decode with proposals: what followed (1, 2, 3, 4) before
    (s,) = out.scheduled
    assert s.spec_token_ids == [5, 6, 7, 8, 9, 1] and s.num_new_tokens == 7 and out.num_decodes == 1
    assert len(req.block_ids) == 5  # 12 computed + 1 known + 6 proposed = 19 slots
    sched.update_from_output(out, {"a": [5, 6, 7, 0]})  # three kept, then the model says 0
    assert req.output_token_ids == [4, 5, 6, 7, 0] and req.num_computed_tokens == 16
    assert len(req.block_ids) == 4 and kv.num_free_blocks == 12  # the block of rejected proposals is back
    # the kept proposals completed block 3 (tokens 4, 5, 6, 7): it is in the prefix cache now
    assert kv.block_pool.blocks[req.block_ids[3]].block_hash is not None
    assert (sched.spec_num_drafts, sched.spec_num_draft_tokens, sched.spec_num_accepted_tokens) == (1, 6, 3)
    assert sched.spec_accepted_per_position == [1, 1, 1, 0, 0, 0]
    stats = sched.get_stats()
    assert (stats.totals.spec_num_draft_tokens, stats.totals.spec_accepted_per_position[:3]) == (6, [1, 1, 1])


def test_proposals_respect_max_tokens_budget_and_free_blocks_and_a_stop_among_them():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=4, max_model_len=16, block_size=4), kv, _FixedSpeculator(8))
    req = Request("a", [3, 4, 3], SamplingParams(temperature=0, max_tokens=4), eos_token_ids=[2])
    sched.add_request(req)
    sched.update_from_output(sched.schedule(), {"a": [4]})
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == [3, 4]  # max_tokens 4: one out, one more of its own -> 2 proposals
    sched.update_from_output(out, {"a": [3, 4, 3]})
    assert req.is_finished and req.finish_reason is not None and kv.num_free_blocks == 4
    # a stop token among the kept proposals ends it there
    req = Request("b", [2, 9, 2], SamplingParams(temperature=0, max_tokens=10), eos_token_ids=[2])
    sched.add_request(req)
    sched.update_from_output(sched.schedule(), {"b": [9]})
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == [2, 9]
    outputs = sched.update_from_output(out, {"b": [2, 9, 5]})
    assert outputs[0].new_token_ids == [2] and req.output_token_ids == [9, 2] and kv.num_free_blocks == 4
    # proposals never take blocks another request needs: with no free block, it decodes plainly
    kv = KVCacheManager(num_blocks=3, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_model_len=16, block_size=4), kv, _FixedSpeculator(4))
    sched.add_request(Request("c", [1, 2, 1, 2, 1, 2, 1], SamplingParams(temperature=0, max_tokens=5)))
    sched.add_request(Request("d", [5], SamplingParams(temperature=0, max_tokens=5)))
    sched.update_from_output(sched.schedule(), {"c": [2], "d": [6]})
    assert kv.num_free_blocks == 0
    out = sched.schedule()
    assert [s.spec_token_ids for s in out.scheduled] == [[], []] and not out.preempted_ids


def test_speculation_pauses_above_disable_by_batch_size():
    kv = KVCacheManager(num_blocks=32, block_size=4)
    spec = NgramSpeculator(SpeculativeConfig(num_speculative_tokens=2, disable_by_batch_size=1))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4), kv, spec)
    for rid in "ab":
        sched.add_request(Request(rid, [1, 2, 1, 2], SamplingParams(temperature=0, max_tokens=20)))
    sched.update_from_output(sched.schedule(), {"a": [1], "b": [1]})
    assert all(not s.spec_token_ids for s in sched.schedule().scheduled)


# ---- metrics and the log line -------------------------------------------------------------------------

def test_prometheus_counters_and_log_line(caplog):
    from prometheus_client import generate_latest

    from engine_core.proc.stats_log import ThroughputLog
    from frontend.endpoints.serving.metrics import Metrics
    stats = SchedulerStats(totals=SchedulerTotals(spec_num_drafts=10, spec_num_draft_tokens=40,
                                                  spec_num_accepted_tokens=30, spec_accepted_per_position=[10, 9, 7, 4]))
    metrics = Metrics()
    metrics.engine.stats = stats
    text = generate_latest(metrics.registry).decode()
    for line in ('nvllm:spec_decode_num_drafts_total 10.0', 'nvllm:spec_decode_num_draft_tokens_total 40.0',
                 'nvllm:spec_decode_num_accepted_tokens_total 30.0', 'nvllm:spec_decode_acceptance_rate 0.75',
                 'nvllm:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 4.0'):
        assert line in text
    now = [0.0]
    log = ThroughputLog(interval=10, clock=lambda: now[0])
    now[0] = 5.0
    log.record(SchedulerStats())
    now[0] = 11.0
    with caplog.at_level(logging.INFO, logger="nvllm"):
        log.record(stats)
    assert "speculative decoding: 75.0% of proposed tokens kept (30 of 40), 4.00 tokens per verifying step" in caplog.text
