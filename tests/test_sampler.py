"""The sampler's draws follow the distribution it was asked for (temperature, top-k, top-p, min-p)."""

import pytest
import torch

from common.sampling_params import SamplingParams
from engine_core.request import Request
from engine_core.sampler import Sampler

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


def test_seeded_rows_repeat_and_differ_by_seed():
    def tokens(seed):
        reqs = [Request("a", [1], SamplingParams(temperature=1.0, seed=seed))]
        sampler = Sampler(torch.device("cpu"), seed=0)
        return [sampler(LOGITS[None], reqs)[0][0] for _ in range(40)]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)
