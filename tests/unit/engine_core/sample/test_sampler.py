"""The sampler's draws follow the distribution it was asked for (temperature, top-k, top-p, min-p), and its
penalties are vLLM's and OpenAI's formulas (checked against a numpy reference written here)."""

import msgspec
import numpy as np
import pytest
import torch

from common.sampling_params import SamplingParams
from engine_core.sched.request import Request
from engine_core.sample.sampler import Sampler
from tests.support.sampling_reference import penalized_logits

pytestmark = pytest.mark.unit

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
ROWS = 6000


def draw(**params) -> torch.Tensor:
    """Token frequencies over ROWS rows of LOGITS sampled in one batch (fixed sampler seed)."""
    reqs = [Request(f"r{i}", [1], SamplingParams(**params)) for i in range(ROWS)]
    tokens, _ = Sampler(torch.device("cpu"), seed=0)(LOGITS.repeat(ROWS, 1), reqs)
    return torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).float() / ROWS


def test_frequencies_follow_softmax_at_each_temperature():
    for temperature in (1.0, 0.5, 2.0):
        expected = torch.softmax(LOGITS / temperature, dim=-1)
        # 4.5 binomial standard deviations at the largest p: a fixed seed, so this never flakes
        assert (draw(temperature=temperature) - expected).abs().max() < 4.5 * (0.25 / ROWS) ** 0.5, temperature


def test_cut_tokens_are_never_drawn_and_the_rest_renormalize():
    probs = torch.softmax(LOGITS, dim=-1)
    kept = draw(temperature=1.0, top_k=3)
    assert kept[3:].sum() == 0
    assert (kept[:3] - probs[:3] / probs[:3].sum()).abs().max() < 0.03
    # top_p 0.6: tokens 0 and 1 reach it (0.40 + 0.24 of the mass); token 2 is cut
    assert draw(temperature=1.0, top_p=0.6)[2:].sum() == 0
    # min_p 0.3: tokens below 0.3 x the top probability are cut (exp(-1.5) < 0.3 < exp(-1))
    assert draw(temperature=1.0, min_p=0.3)[3:].sum() == 0


def test_min_p_probabilities_are_renormalized():
    """Speculative verification accepts a proposal with its probability, so the kept tokens' must sum to 1
    (min_p 0.3 keeps tokens 0-2, as above)."""
    probs = Sampler(torch.device("cpu"), seed=0).probabilities(LOGITS[None].clone(), [SamplingParams(min_p=0.3)])[0]
    kept = torch.softmax(LOGITS, dim=-1)[:3]
    torch.testing.assert_close(probs, torch.cat([kept / kept.sum(), torch.zeros(5)]))


def test_a_row_without_cuts_keeps_every_token_beside_a_row_with_top_p():
    """top_p 1 cuts nothing, whatever the other rows of the batch ask for (a float32 cumsum over a large
    vocabulary reaches 1 before its tail: a cut at >= 1 would drop tokens only when batched with top-p)."""
    logits = torch.randn(2, 50000, generator=torch.Generator().manual_seed(0)) * 3
    sampler = Sampler(torch.device("cpu"), seed=0)
    alone = sampler.probabilities(logits[1:].clone(), [SamplingParams()])
    batched = sampler.probabilities(logits.clone(), [SamplingParams(top_p=0.5), SamplingParams()])
    assert (batched[1] > 0).all() and torch.equal(batched[1], alone[0])


def test_seeded_rows_repeat_and_differ_by_seed():
    def tokens(seed):
        reqs = [Request("a", [1], SamplingParams(temperature=1.0, seed=seed))]
        sampler = Sampler(torch.device("cpu"), seed=0)
        return [sampler(LOGITS[None], reqs)[0][0] for _ in range(40)]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)


# ---- penalties, against the formulas ------------------------------------------------------------------

# float32 logits of both signs and a zero; the prompt and the output repeat tokens and share token 4
PEN_LOGITS = np.array([1.5, -0.75, 2.25, -2.0, 0.5, -1.25, 3.0, 0.0, -0.5, 1.0], dtype=np.float32)
PROMPT = [0, 1, 1, 7, 4]  # 0 positive, 1 negative (twice), 7 zero, 4 also in the output
OUTPUT = [2, 2, 3, 4, 4, 4, 8]  # 2 positive x2, 3 negative x1, 4 positive x3, 8 negative x1


def _request(i: int, params: SamplingParams) -> Request:
    r = Request(f"p{i}", PROMPT, params)
    for t in OUTPUT:
        r.append_output_token(t)
    return r


def test_penalties_by_hand():
    """The reference itself, on values worked out by hand (dyadic: exact in float32 too), and the sampler
    exactly equal to it. Tokens 0, 1 and 7 are in the prompt only: repetition penalty alone (a zero logit
    stays zero); 2, 3 and 8 in the output only and 4 in both: all three penalties."""
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    want = {0: 0.75, 1: -1.5, 7: 0.0, 4: 0.25 - 1.5 - 0.25, 2: 1.125 - 1.0 - 0.25, 3: -4.0 - 0.5 - 0.25,
            8: -1.0 - 0.5 - 0.25, 5: -1.25, 6: 3.0, 9: 1.0}
    ref = penalized_logits(PEN_LOGITS, params, PROMPT, OUTPUT)
    assert ref.tolist() == [want[t] for t in range(len(PEN_LOGITS))]
    logits = torch.from_numpy(PEN_LOGITS.copy())[None]
    got = Sampler(torch.device("cpu"), seed=0).apply_penalties(logits, [_request(0, params)])
    assert got[0].tolist() == ref.tolist()


PENALTY_CASES = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.7),  # below 1: seen tokens made likelier
    SamplingParams(frequency_penalty=0.6),
    SamplingParams(presence_penalty=0.9),
    SamplingParams(frequency_penalty=-0.4, presence_penalty=-1.1),  # negative: repetition encouraged
    SamplingParams(repetition_penalty=1.7, frequency_penalty=0.35, presence_penalty=1.2),
    SamplingParams(repetition_penalty=1.2, frequency_penalty=2.0, presence_penalty=-2.0, temperature=0.6),
]


def test_penalized_logits_and_probabilities_match_the_formulas():
    """Every case as one row of a single float32 batch (rows must not mix): the penalized logits, the
    probabilities drawn from (softmax at the row's temperature) and a greedy pick follow the reference."""
    sampler = Sampler(torch.device("cpu"), seed=0)
    reqs = [_request(i, params) for i, params in enumerate(PENALTY_CASES)]
    logits = torch.from_numpy(np.tile(PEN_LOGITS, (len(reqs), 1)))
    penalized = sampler.apply_penalties(logits.clone(), reqs)
    assert penalized.dtype == torch.float32
    probs = sampler.probabilities(penalized.clone(), PENALTY_CASES)
    for i, params in enumerate(PENALTY_CASES):
        ref = penalized_logits(PEN_LOGITS, params, PROMPT, OUTPUT)
        assert not np.array_equal(ref, PEN_LOGITS.astype(np.float64)), params  # the case changes something
        np.testing.assert_allclose(penalized[i].numpy(), ref, rtol=1e-6, atol=1e-6, err_msg=str(params))
        x = ref / params.temperature
        ref_probs = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        np.testing.assert_allclose(probs[i].numpy(), ref_probs, rtol=1e-5, atol=1e-7, err_msg=str(params))
    # greedy through the whole sampler: the argmax of the reference's penalized logits
    greedy = [msgspec.structs.replace(params, temperature=0.0) for params in PENALTY_CASES]
    tokens, _ = sampler(logits, [_request(i, params) for i, params in enumerate(greedy)])
    assert tokens == [int(penalized_logits(PEN_LOGITS, p, PROMPT, OUTPUT).argmax()) for p in greedy]



def test_row_argmax_picks_torchs_index_ties_and_nan_included():
    from engine_core.sample.row_argmax import row_argmax
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 49152, generator=gen)
    logits[1, 100] = logits[1, 40000] = 50.0  # equal maxima: the first
    logits[2, :] = 0.0  # all equal: index 0
    logits[3, 30000] = float("nan")  # NaN counts as the largest, as torch has it
    logits[4, 5] = float("inf")
    for rows in (logits, logits[:, ::2], logits.t().contiguous().t()):  # strided and column-major views too
        assert torch.equal(row_argmax(rows), rows.argmax(dim=-1))
    assert row_argmax(logits).dtype == torch.int64
    assert torch.equal(row_argmax(logits.bfloat16()), logits.bfloat16().argmax(dim=-1))
    assert row_argmax(logits).tolist()[1:4] == [100, 0, 30000]
