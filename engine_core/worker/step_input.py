"""One step's model input as plain lists: built once by the core, sent as-is to TP workers."""

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from common.lora import LoRARequest
from common.wire_messages import Logprobs

from engine_core.sched.request import Request

if TYPE_CHECKING:
    from engine_core.sched.scheduler import SchedulerOutput


class StepInput(msgspec.Struct, array_like=True):
    input_ids: list[int]  # the new tokens of every scheduled sequence, one after another
    positions: list[int]
    slot_mapping: list[int]  # KV cache slot of each new token
    query_start_loc: list[int]  # [num_seqs + 1]
    seq_lens: list[int]  # cached tokens per sequence after this step
    block_tables: list[list[int]]
    num_decodes: int  # leading sequences with exactly one new token
    sample_rows: list[int]  # rows of the flat batch whose logits are sampled
    # prompt logprobs: rows whose next token is a known prompt token, that token, and the most top ids any
    # of those rows' requests asks for
    scored_rows: list[int] = []
    scored_targets: list[int] = []
    scored_top_n: int = 0
    # [src, dst] KV cache blocks to copy in every layer before the forward (beam search's copies on write)
    block_copies: list[list[int]] = []
    # LoRA: the adapters of every running request (each rank keeps them resident, reading their files itself),
    # and per sequence the index of its adapter among them (-1: the base model)
    lora_requests: list[LoRARequest] = []
    seq_loras: list[int] = []
    # the rows that are prompt tokens (positions before their request's first output token), as flat pairs
    # [first row, end row) of runs: a kernel with an arithmetic of its own for prompt rows gives it these
    # (amx_quant.c), so a token's arithmetic depends on its request alone
    prompt_runs: list[int] = []


class StepBuilder:
    """Lays sequences one after another into a StepInput. Callers add one-token sequences (decodes)
    first: the leading run of them is what the attention backends batch as decodes."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.input_ids, self.positions, self.slots = [], [], []
        self.query_start_loc, self.seq_lens, self.tables, self.sample_rows = [0], [], [], []
        self.scored_rows, self.scored_targets, self.scored_top_n = [], [], 0
        self.lora_requests: list[LoRARequest] = []
        self.seq_loras: list[int] = []
        self.prompt_runs: list[int] = []

    def add(self, block_ids: list[int], token_ids: list[int], start: int, sample: bool,
            scored_targets: list[int] = (), top_n: int = 0, lora: int = -1, prompt_len: int = 0) -> None:
        """token_ids at positions start.. of the sequence whose blocks are block_ids; sample: its last row's
        logits are wanted; scored_targets: the tokens that follow its first rows, whose logprobs (and top_n
        more) are wanted; prompt_len: its request's prompt tokens (the rows before that position are prompt rows)."""
        bs, end = self.block_size, start + len(token_ids)
        first_row = self.query_start_loc[-1]
        self._add_prompt_rows(first_row, min(max(prompt_len - start, 0), len(token_ids)))
        self.scored_rows.extend(range(first_row, first_row + len(scored_targets)))
        self.scored_targets.extend(scored_targets)
        if scored_targets:
            self.scored_top_n = max(self.scored_top_n, top_n)
        self.input_ids.extend(token_ids)
        self.positions.extend(range(start, end))
        self.slots.extend(block_ids[p // bs] * bs + p % bs for p in range(start, end))
        self.query_start_loc.append(self.query_start_loc[-1] + len(token_ids))
        self.seq_lens.append(end)
        self.tables.append(block_ids)
        self.seq_loras.append(lora)
        if sample:
            self.sample_rows.append(self.query_start_loc[-1] - 1)

    def _add_prompt_rows(self, first_row: int, count: int) -> None:
        if not count:
            return
        if self.prompt_runs and self.prompt_runs[-1] == first_row:
            self.prompt_runs[-1] += count  # one run with the rows before it
        else:
            self.prompt_runs += [first_row, first_row + count]

    def build(self) -> StepInput:
        lengths = [b - a for a, b in zip(self.query_start_loc, self.query_start_loc[1:])]
        num_decodes = next((i for i, n in enumerate(lengths) if n != 1), len(lengths))
        return StepInput(self.input_ids, self.positions, self.slots, self.query_start_loc, self.seq_lens,
                         self.tables, num_decodes, self.sample_rows, self.scored_rows, self.scored_targets,
                         self.scored_top_n, lora_requests=self.lora_requests,
                         seq_loras=self.seq_loras if any(i >= 0 for i in self.seq_loras) else [],
                         prompt_runs=self.prompt_runs)


class PlannedStep(NamedTuple):
    step: StepInput
    sampled: list[Request]  # the requests sampled this step, in sample_rows order
    drafts: list[list[int]]  # the proposed tokens each sampled request verifies
    scored: list[tuple[Request, int]]  # requests with prompt logprobs this step: how many of scored_rows each
    # embedding requests this step: (request, position of its chunk's first token, first row, rows)
    pooled: list[tuple[Request, int, int, int]] = []


class StepResult(NamedTuple):
    """What rank 0 returns for one step, by request id."""
    sampled: dict[str, list[int]]  # new tokens
    logprobs: dict[str, list[Logprobs]]  # theirs, where asked
    prompt_logprobs: dict[str, list[Logprobs]]  # of the prompt tokens after this step's chunk rows, where asked
    embeddings: dict[str, bytes] | None = None  # embedding requests whose prompt this step completed: their vectors


def build_step_input(out: "SchedulerOutput", block_size: int) -> PlannedStep:
    """The flat batch for `out`, and who its sampled and scored rows belong to.

    A request that asks for prompt logprobs has the rows of its prompt chunk scored, each against the prompt
    token that follows it, until it has output tokens (a recompute after preemption scores nothing again).

    A request with k proposals enters as k + 1 one-token sequences on its block table: its last known
    token, then each proposal, the j-th seeing the cache up to its own position (every layer writes the
    step's K/V before it attends). Every row is then computed exactly as the plain decode of that token
    would be, by the same decode kernels (CUDA graphs included), so verified tokens equal decoding's."""
    builder = StepBuilder(block_size)
    builder.lora_requests = list(out.active_loras)
    lora_index = {lora.key: i for i, lora in enumerate(builder.lora_requests)}
    sampled, drafts, scored, pooled = [], [], [], []
    for s in out.scheduled:
        req, start = s.request, s.num_computed_tokens_before
        lora = lora_index[req.lora_request.key] if req.lora_request is not None else -1
        known_end = start + s.num_new_tokens - len(s.spec_token_ids)
        if req.is_pooling:  # its rows' hidden states are pooled; no logits, nothing sampled
            pooled.append((req, start, builder.query_start_loc[-1], known_end - start))
            builder.add(req.block_ids, req.all_token_ids[start:known_end], start, False, lora=lora,
                        prompt_len=req.num_prompt_tokens)
            continue
        sample = known_end == req.num_tokens  # the chunk reached the last known token: sample the next
        if s.spec_token_ids:
            for j, token in enumerate([req.all_token_ids[start]] + s.spec_token_ids):
                builder.add(req.block_ids, [token], start + j, sample, lora=lora, prompt_len=req.num_prompt_tokens)
        else:
            targets = prompt_targets(req, start, known_end)
            builder.add(req.block_ids, req.all_token_ids[start:known_end], start, sample, targets,
                        req.sampling_params.prompt_logprobs or 0, lora, req.num_prompt_tokens)
            if targets:
                scored.append((req, len(targets)))
        if sample:
            sampled.append(req)
            drafts.append(s.spec_token_ids)
    step = builder.build()
    step.block_copies = [[src, dst] for src, dst in out.block_copies]
    return PlannedStep(step, sampled, drafts, scored, pooled)


def prompt_targets(req: Request, start: int, end: int) -> list[int]:
    """The prompt tokens that follow positions start..end-1 of a request that asks for prompt logprobs and has
    none of them reported yet (the last prompt position is followed by an output token, not scored)."""
    if not req.scores_prompt:
        return []
    return req.prompt_token_ids[start + 1:min(end, req.num_prompt_tokens - 1) + 1]
