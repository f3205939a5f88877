"""A model runner's logits against transformers' (float32) through every path of the paged KV cache: one step
run by hand (prefill, decode, chunks, prefix hits, mixed batches) on a (runner, transformers model) pair. Each
family's test module gives its `pair` fixture and calls the checks from its own tests of the same names."""

import torch

from common.config import EngineArgs
from engine_core.engine_config import resolve_engine_config
from engine_core.worker.model_runner import ModelRunner
from engine_core.worker.step_input import StepInput

BLOCK = 4
ATOL = 1e-4


def make_runner(path: str) -> ModelRunner:
    args = EngineArgs(model=path, dtype="float32", device="cpu", block_size=BLOCK, kv_cache_memory="16MiB")
    runner = ModelRunner(resolve_engine_config(args))
    runner.allocate_kv_cache(64)
    return runner


def run_step(runner: ModelRunner, seqs: list[tuple[list[int], int, list[int]]]) -> list[torch.Tensor]:
    """seqs: (all tokens so far, tokens already cached, block table). Computes the rest of each
    sequence in one step and returns every new row's logits, per sequence."""
    step = StepInput([], [], [], [0], [], [], 0, [])
    leading = True
    for tokens, cached, table in seqs:
        new = range(cached, len(tokens))
        step.input_ids += tokens[cached:]
        step.positions += list(new)
        step.slot_mapping += [table[p // BLOCK] * BLOCK + p % BLOCK for p in new]
        step.query_start_loc.append(step.query_start_loc[-1] + len(new))
        step.seq_lens.append(len(tokens))
        step.block_tables.append(table)
        leading = leading and len(new) == 1
        step.num_decodes += leading
    step.sample_rows = list(range(len(step.input_ids)))
    logits = runner.forward(step)
    return list(logits.split([b - a for a, b in zip(step.query_start_loc, step.query_start_loc[1:])]))


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]


TOKENS = [int(t) for t in torch.randint(3, 49152, (23,), generator=torch.Generator().manual_seed(1))]


def check_prefill(pair):
    runner, hf = pair
    (ours,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=ATOL, rtol=0)


def check_decode_after_prefill(pair):
    runner, hf = pair
    table = [11, 4, 20, 8, 13, 6]
    run_step(runner, [(TOKENS[:22], 0, table)])
    (ours,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(ours[0], hf_logits(hf, TOKENS)[22], atol=ATOL, rtol=0)


def check_chunked_prefill(pair):
    runner, hf = pair
    table = [30, 31, 17, 40, 2, 9]
    ref = hf_logits(hf, TOKENS)
    got = []
    for end in (7, 16, 23):
        (rows,) = run_step(runner, [(TOKENS[:end], end - (7 if end == 7 else (9 if end == 16 else 7)), table)])
        got.append(rows)
    torch.testing.assert_close(torch.cat(got), ref, atol=ATOL, rtol=0)


def check_prefix_hit_and_mixed_batch(pair):
    runner, hf = pair
    shared = TOKENS[:12]  # three full blocks
    a = shared + [7, 8, 9]
    b = shared + [100, 200, 300, 400, 500]
    run_step(runner, [(a[:-1], 0, [1, 2, 3, 4])])
    # one step: a decodes its last token while b prefills only past the shared prefix blocks
    rows_a, rows_b = run_step(runner, [(a, len(a) - 1, [1, 2, 3, 4]), (b, 12, [1, 2, 3, 50, 51])])
    torch.testing.assert_close(rows_a[0], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows_b, hf_logits(hf, b)[12:], atol=ATOL, rtol=0)
