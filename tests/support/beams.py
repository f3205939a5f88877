"""Beam search as transformers' generate() runs it, and nvllm's beams held to it (tokens, scores within ATOL)."""

import pytest
import torch

ATOL = 1e-4


def transformers_beams(hf, prompt: list[int], width: int, length_penalty: float, max_tokens: int, eos: int):
    """[(generated tokens up to their EOS, score)] best first, as generate() returns them."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width,
                          length_penalty=length_penalty, max_new_tokens=max_tokens, do_sample=False,
                          early_stopping=False, output_scores=True, return_dict_in_generate=True,
                          eos_token_id=eos, pad_token_id=eos)
    beams = []
    for i in range(width):
        tokens = out.sequences[i, len(prompt):].tolist()
        if eos in tokens:
            tokens = tokens[:tokens.index(eos) + 1]
        score = out.sequences_scores[i].item() if width > 1 else None
        beams.append((tokens, score))
    return beams


def assert_same_beams(ours, theirs) -> None:
    assert [s.output_token_ids for s in ours.sequences] == [t for t, _ in theirs]
    for s, (_, score) in zip(ours.sequences, theirs):
        if score is not None:
            assert s.score == pytest.approx(score, abs=ATOL)
