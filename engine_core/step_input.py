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


def build_step_input(out: "SchedulerOutput", block_size: int) -> tuple[StepInput, list[Request]]:
    """The flat batch for `out`, and the requests sampled this step (in sample_rows order)."""
    input_ids, positions, slots = [], [], []
    query_start_loc, seq_lens, tables, sample_rows, sampled = [0], [], [], [], []
    num_decodes, leading = 0, True
    for s in out.scheduled:
        req, start = s.request, s.num_computed_tokens_before
        end = start + s.num_new_tokens
        input_ids.extend(req.all_token_ids[start:end])
        positions.extend(range(start, end))
        blocks = req.block_ids
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(start, end))
        query_start_loc.append(query_start_loc[-1] + s.num_new_tokens)
        seq_lens.append(end)
        tables.append(blocks)
        leading = leading and s.num_new_tokens == 1
        num_decodes += leading
        if end == req.num_tokens:  # the chunk reached the last known token: sample the next
            sample_rows.append(query_start_loc[-1] - 1)
            sampled.append(req)
    step = StepInput(input_ids, positions, slots, query_start_loc, seq_lens, tables, num_decodes, sample_rows)
    return step, sampled
