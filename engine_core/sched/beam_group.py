"""The live beams of one beam-search request, as sequences that share KV blocks.

The request itself (the root) prefills its prompt like any request. Its last prompt row's top logprobs start the
search: beam 0 takes over the root's blocks, and from then on every live beam is a Request of its own (never in
the scheduler's `requests` or `running`: the root stands for the group there) that computes one token per step.

After each step, `advance` forks and drops beams as beam_search.BeamSearch decides:
- a beam with no surviving candidate gives its block references back;
- a beam whose candidates survive is taken over by its best one (it appends the token, nothing is copied);
- every further candidate of that beam is a new beam: it copies the parent's block table, taking a reference on
  each full block (shared, read only), and gets the parent's last, partial block as a copy on write: `cow_src`
  names that block, which the scheduler copies into a fresh block of the child's before the next forward (the
  parent, which keeps the original, writes into it only in that same forward, after the copy).
So a beam's last partial block is always its own, and only full blocks are ever shared.
"""

import itertools

from common.beam_search_params import BeamSearchParams
from common.wire_messages import BeamHypothesis
from common.sampling_params import SamplingParams
from engine_core.sched.beam_search import BeamSearch, Candidate
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request, RequestStatus

BEAM_ID_SEPARATOR = "\x00beam"  # beam ids are the root's id, this, and a counter: unique within the step's batch


class BeamGroup:
    def __init__(self, root: Request, params: BeamSearchParams, vocab_size: int | None = None):
        self.root = root
        self.params = params
        self.vocab_size = vocab_size
        self.search = self._new_search()
        # every beam row asks the sampler for its top num_candidates logprobs (raw log-softmax, float32); the
        # sampled token itself (greedy) is not used
        root.sampling_params = SamplingParams(temperature=0.0, max_tokens=params.max_tokens,
                                              logprobs=self.search.num_candidates, ignore_eos=True)
        root.group = self
        self.beams: list[Request] = []  # live beams, best first; empty until the prompt is prefilled
        self._ids = itertools.count()

    def _new_search(self) -> BeamSearch:
        p = self.params
        return BeamSearch(p.beam_width, p.max_tokens, p.length_penalty, self.root.eos_token_ids, p.ignore_eos,
                          self.vocab_size)

    @property
    def width(self) -> int:
        return self.params.beam_width

    @property
    def decoding(self) -> bool:
        return bool(self.beams)

    def _new_beam(self, tokens: list[int], num_computed: int) -> Request:
        root = self.root
        beam = Request(f"{root.request_id}{BEAM_ID_SEPARATOR}{next(self._ids)}", root.prompt_token_ids,
                       root.sampling_params, (), root.arrival_time, root.cache_salt, root.lora_request)
        beam.eos_token_ids = root.eos_token_ids
        beam.all_token_ids = tokens
        beam.output_token_ids = tokens[root.num_prompt_tokens:]
        beam.num_computed_tokens = num_computed
        beam.status = RequestStatus.RUNNING
        beam.group = self
        beam.cum_logprob = 0.0
        return beam

    def start(self, kv: KVCacheManager) -> Request:
        """The root's prompt is computed: beam 0 takes over its blocks (the root keeps none)."""
        root = self.root
        beam = self._new_beam(list(root.all_token_ids), root.num_computed_tokens)
        beam.block_ids, root.block_ids = root.block_ids, []
        beam.block_hashes = list(root.block_hashes)
        beam.num_dropped_blocks, root.num_dropped_blocks = root.num_dropped_blocks, 0
        self.beams = [beam]
        return beam

    def advance(self, kv: KVCacheManager, top: list[tuple[list[int], list[float]]]) -> bool:
        """One step's top logprobs of each live beam (in self.beams order): fork, drop and extend the beams.
        True when the search is done (every beam's blocks are given back then)."""
        survivors = self.search.step([(b.output_token_ids, b.cum_logprob) for b in self.beams], top)
        by_parent: dict[int, list[Candidate]] = {}
        for c in survivors:
            by_parent.setdefault(c.parent, []).append(c)
        new_beam = {}
        # forks first: a child copies its parent's tokens and table before the parent takes its own next token
        for parent_index, children in by_parent.items():
            parent = self.beams[parent_index]
            for c in children[1:]:
                child = self._new_beam(parent.all_token_ids + [c.token_id], parent.num_tokens)
                child.cow_src = kv.fork(parent, child)
                child.cum_logprob = c.cum_logprob
                new_beam[id(c)] = child
        for parent_index, parent in enumerate(self.beams):
            children = by_parent.get(parent_index)
            if not children:
                kv.free(parent)
                continue
            parent.append_output_token(children[0].token_id)
            parent.cum_logprob = children[0].cum_logprob
            new_beam[id(children[0])] = parent
        self.beams = [new_beam[id(c)] for c in survivors]
        return self.search.done

    def release(self, kv: KVCacheManager) -> None:
        """Give back every block the group holds (its beams' and the root's)."""
        for beam in self.beams:
            kv.free(beam)
        self.beams = []
        kv.free(self.root)

    def restart(self, kv: KVCacheManager) -> None:
        """Preempted: give every block back and start the search again from the prompt (the same request gives
        the same beams again: nothing in it depends on the batch)."""
        self.release(kv)
        self.search = self._new_search()

    def hypotheses(self) -> list[BeamHypothesis]:
        return [BeamHypothesis(h.token_ids, h.cum_logprob, h.score, h.finish_reason) for h in self.search.finished]
