"""Proposals from a draft model: a small model with the target's vocabulary decodes them greedily.

The draft model has its own KV cache tensors with the target's block count, addressed through the
same block tables: the scheduler's blocks hold both models' keys and values, and the slots it
reserves for a request's proposals are where the draft writes them. Each step, before the target
runs, the draft model
1. catches up: one forward over each request's tokens that its cache lacks (the whole prompt the first
   time; after that the token sampled last step and any kept proposal it had not seen), then
2. decodes k - 1 more tokens, one step each, all requests together.
Its cache is only ever a guess's input: a stale or shared entry changes proposals, never the output,
which verification decides.
"""

import torch

from engine_core.engine_config import EngineConfig
from engine_core.sched.request import Request
from engine_core.worker.step_input import StepBuilder


class DraftModel:
    def __init__(self, config: EngineConfig):
        """`config` is the target's; its draft_model names the draft's folder (resolve_engine_config checked
        that it shares the target's vocabulary)."""
        from engine_core.worker.model_runner import ModelRunner

        self.runner = ModelRunner(config.for_draft_model(), role="draft model")
        self.block_size = config.block_size
        # per request: (its preemption count, first position drafted last step, the tokens drafted there);
        # the draft cache holds the true tokens before that position, and the drafted ones after it as
        # far as they turned out right
        self.state: dict[str, tuple[int, int, list[int]]] = {}

    def kv_bytes_per_block(self) -> int:
        return self.runner.kv_bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def forget(self, request_id: str) -> None:
        self.state.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, scheduled) -> None:
        """Fill the proposal slots the scheduler reserved (spec_token_ids, placeholders until now)."""
        wanted = [s for s in scheduled if s.spec_token_ids]
        if not wanted:
            return
        reqs = [s.request for s in wanted]
        # 1. catch up on the tokens the draft cache lacks; the last row gives the first proposal
        chunks = [(r, self._valid_prefix(r)) for r in reqs]
        proposals = [[t] for t in self._argmax_step([(r, r.all_token_ids[start:], start) for r, start in chunks])]
        # 2. one more token per step for the requests that want more
        for j in range(1, max(len(s.spec_token_ids) for s in wanted)):
            rows = [i for i, s in enumerate(wanted) if len(s.spec_token_ids) > j]
            step = [(reqs[i], proposals[i][-1:], reqs[i].num_tokens - 1 + j) for i in rows]
            for i, token in zip(rows, self._argmax_step(step)):
                proposals[i].append(token)
        for s, drafted in zip(wanted, proposals):
            s.spec_token_ids[:] = drafted
            self.state[s.request.request_id] = (s.request.num_preemptions, s.request.num_tokens, drafted)

    def _valid_prefix(self, request: Request) -> int:
        """How many of the request's first tokens the draft cache holds correctly."""
        state = self.state.get(request.request_id)
        if state is None or state[0] != request.num_preemptions:  # new, or its blocks were given up
            return 0
        _, start, drafted = state
        tokens = request.all_token_ids
        kept = 0
        # the draft wrote drafted[j] at position start + j for all but its last proposal
        while kept < len(drafted) - 1 and start + kept < len(tokens) - 1 and tokens[start + kept] == drafted[kept]:
            kept += 1
        return min(start + kept, request.num_tokens - 1)

    def _argmax_step(self, seqs: list[tuple[Request, list[int], int]]) -> list[int]:
        """One forward of the draft model over (request, tokens, first position) sequences: the argmax
        after each sequence's last token, in the order given."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][1]) != 1)  # one-token sequences first
        builder = StepBuilder(self.block_size)
        for i in order:
            request, tokens, start = seqs[i]
            builder.add(request.block_ids, tokens, start, sample=True)
        step = builder.build()
        tokens = self.runner.forward(step).argmax(dim=-1).tolist()
        result = [0] * len(seqs)
        for n, i in enumerate(order):
            result[i] = tokens[n]
        return result
