"""One step's model input as plain lists: built once by the core, sent as-is to TP workers."""

from typing import TYPE_CHECKING

import msgspec

from engine_core.request import Request

if TYPE_CHECKING:
    from engine_core.scheduler import SchedulerOutput


class StepInput(msgspec.Struct, array_like=True):
    input_ids: list[int]  # the new tokens of every scheduled sequence, one after another
    positions: list[int]
    slot_mapping: list[int]  # KV cache slot of each new token
    query_start_loc: list[int]  # [num_seqs + 1]
    seq_lens: list[int]  # cached tokens per sequence after this step
    block_tables: list[list[int]]
    num_decodes: int  # leading sequences with exactly one new token
    sample_rows: list[int]  # rows of the flat batch whose logits are sampled


def build_step_input(out: "SchedulerOutput", block_size: int) -> tuple[StepInput, list[Request], list[list[int]]]:
    """The flat batch for `out`; the requests sampled this step (in sample_rows order) and the proposed
    tokens each one verifies.

    A request with k proposals enters as k + 1 one-token sequences on its block table: its last known
    token, then each proposal, the j-th seeing the cache up to its own position (every layer writes the
    step's K/V before it attends). Every row is then computed exactly as the plain decode of that token
    would be, by the same decode kernels (CUDA graphs included), so verified tokens equal decoding's."""
    input_ids, positions, slots = [], [], []
    query_start_loc, seq_lens, tables, sample_rows, sampled, drafts = [0], [], [], [], [], []
    num_decodes, leading = 0, True

    def sequence(req: Request, token_ids: list[int], start: int) -> None:
        end = start + len(token_ids)
        input_ids.extend(token_ids)
        positions.extend(range(start, end))
        blocks = req.block_ids
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(start, end))
        query_start_loc.append(query_start_loc[-1] + len(token_ids))
        seq_lens.append(end)
        tables.append(blocks)

    for s in out.scheduled:
        req, start = s.request, s.num_computed_tokens_before
        known_end = start + s.num_new_tokens - len(s.spec_token_ids)
        if s.spec_token_ids:
            for j, token in enumerate([req.all_token_ids[start]] + s.spec_token_ids):
                sequence(req, [token], start + j)
        else:
            sequence(req, req.all_token_ids[start:known_end], start)
        leading = leading and s.is_decode
        num_decodes += leading * (1 + len(s.spec_token_ids))
        if known_end == req.num_tokens:  # the chunk reached the last known token: sample the next
            sample_rows.extend(range(query_start_loc[-1] - 1 - len(s.spec_token_ids), query_start_loc[-1]))
            sampled.append(req)
            drafts.append(s.spec_token_ids)
    step = StepInput(input_ids, positions, slots, query_start_loc, seq_lens, tables, num_decodes, sample_rows)
    return step, sampled, drafts
