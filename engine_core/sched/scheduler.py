"""Continuous batching: which requests run this step, and how many tokens each computes.

One token budget per step (max_num_batched_tokens) is shared by decodes and prefill chunks. Running
requests go first, oldest first; then waiting requests are admitted FCFS. A prompt longer than the
budget is prefilled in chunks over several steps. When KV blocks run out, the newest running request
is preempted: its blocks are freed and it recomputes everything later, from the front of the queue.
With speculative decoding, a decoding request also computes the tokens a proposer guessed after its
last one (spec_token_ids); their slots come from free blocks only, and update_from_output keeps the
ones verification kept and gives back the blocks of the rest.

Beam search (sched/beam_group.py): a beam-search request is one entry in `running` (its root request) that
prefills its prompt like any other, then runs its live beams as one-token sequences, all of them in the same step
or none (a step whose remaining budget is short of its beams skips it). It takes beam_width seats of max_num_seqs.
A beam forked after a step gets a copy of its parent's last partial block before the next forward: the step's
SchedulerOutput names those (src, dst) copies. Preemption frees every block of the group and restarts its search
from the prompt (the simplest correct rule: the same request gives the same beams again, since nothing depends on
the batch); abort frees every beam's blocks. Beams get no proposals (speculative decoding goes on for the other requests;
a draft model only reads the block tables of requests with proposals).

Why this never spins forever:
- blocks are held only by running requests, and a victim is always the newest running request, so the
  oldest running request is never preempted by another; it gets tokens every step (the budget is at
  least 1 and it is served first), so it finishes in a bounded number of steps;
- proposed tokens never preempt: without free blocks for them, the request decodes one token;
- a request that cannot get its blocks while nothing else holds any (it is alone in `running`, or
  nothing runs and it heads the queue) needs more blocks than the whole pool has, now or later, since
  its tokens only grow: it finishes with FinishReason.ERROR instead of being retried;
- a request whose grammar still compiles holds no blocks and steps aside, keeping its place in the queue;
  compiles end (llguidance bounds a grammar's work), and a step with nothing else to run waits on them
  (EngineCore.step) rather than spin.
"""

import concurrent.futures
from collections import deque
from dataclasses import dataclass, field

from common.wire_messages import (ConstraintFailed, EngineCoreOutput, EngineFailed, FinishReason, Logprobs,
                                  SchedulerGauges, SchedulerStats, SchedulerTotals, StepCounts)
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.sched.request import Request, RequestStatus
from engine_core.sched.speculator import Speculator


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_loras: int | None = None  # LoRA adapters the running requests may use at once; None: LoRA is off


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed this step
    num_computed_tokens_before: int  # tokens already in the KV cache (prefix hits included)
    # proposed tokens computed after the request's last known one (counted in num_new_tokens), to verify
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def is_decode(self) -> bool:
        # one known token to compute (and any proposals after it): each of its rows attends as a decode
        return self.num_new_tokens - len(self.spec_token_ids) == 1


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # decodes first, then prefill chunks
    num_decodes: int = 0  # the leading entries of `scheduled` that are decodes (one known token + proposals)
    total_num_scheduled_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # finished since the last step; drop their state
    # (src, dst) KV blocks to copy, in every layer, before this step's forward: beams' copies on write
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # the LoRA adapters of every running request (at most max_loras): the model runner keeps them resident
    active_loras: list = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 proposer: Speculator | None = None):
        if config.block_size != kv_cache_manager.block_size:
            raise ValueError(f"scheduler block_size {config.block_size} differs from the KV cache "
                             f"manager's {kv_cache_manager.block_size}")
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be at least 1")
        self.config = config
        self.kv = kv_cache_manager
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest admission first
        self.finished_ids: list[str] = []  # for the next SchedulerOutput
        # outputs made outside a step (errors at admission, the core's abort notices): they go out with the
        # next update_from_output, the one list of them in the core
        self.pending_outputs: list[EngineCoreOutput] = []
        self.proposer = proposer  # speculative decoding (engine_core/spec_decode/proposer.py), or None
        # speculative decoding, cumulative: steps that verified proposals, proposed and kept tokens, and
        # how often the j-th proposal of a step was kept
        self.spec_num_drafts = self.spec_num_draft_tokens = self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_position = [0] * (proposer.num_speculative_tokens if proposer else 0)
        self.num_preemptions = 0
        self.num_aborted = 0
        self.step_prompt_tokens = 0
        self.step_generation_tokens = 0

    # ---- requests in and out ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.num_tokens == 0:
            self._finish_with_error(request, "prompt is empty")
            return
        if request.is_pooling and request.num_tokens > self.config.max_model_len:
            self._finish_with_error(request, f"prompt has {request.num_tokens} tokens, more than max_model_len "
                                             f"{self.config.max_model_len}")
            return
        if not request.is_pooling and request.num_tokens >= self.config.max_model_len:
            self._finish_with_error(request, f"prompt has {request.num_tokens} tokens, which leaves no room to "
                                             f"generate within max_model_len {self.config.max_model_len}")
            return
        if request.group is not None:
            error = self._beam_search_error(request.group.width)
            if error is not None:
                self._finish_with_error(request, error)
                return
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_requests(self, request_ids) -> list[EngineCoreOutput]:
        """Finish the given requests (unknown or finished ids are ignored) and free their blocks."""
        aborted = [self.requests[rid] for rid in dict.fromkeys(request_ids) if rid in self.requests]
        if not aborted:
            return []
        gone = {id(r) for r in aborted}
        self.running = [r for r in self.running if id(r) not in gone]
        self.waiting = deque(r for r in self.waiting if id(r) not in gone)
        self.num_aborted += len(aborted)
        outputs = []
        for request in aborted:
            self._finish(request, FinishReason.ABORT)
            outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                            finish_reason=FinishReason.ABORT,
                                            num_cached_tokens=max(0, request.num_cached_tokens)))
        return outputs

    def _beam_search_error(self, width: int) -> str | None:
        if width > min(self.config.max_num_seqs, self.config.max_num_batched_tokens):
            return (f"beam_width {width} is more than a step can run (max_num_seqs {self.config.max_num_seqs}, "
                    f"max_num_batched_tokens {self.config.max_num_batched_tokens})")
        return None

    def wait_for_grammars(self, timeout: float) -> None:
        """Block until a waiting request's grammar is compiled (or the timeout): what a step that had
        nothing else to run does, rather than spin."""
        futures = [r.grammar.compiled for r in self.waiting if r.grammar is not None and not r.grammar.ready()]
        if futures:
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def report_with_next_update(self, outputs: list[EngineCoreOutput]) -> None:
        """Outputs made outside a step (the core's abort notices) to send with the next update_from_output."""
        self.pending_outputs.extend(outputs)

    def has_unfinished_requests(self) -> bool:
        # pending outputs count: the core must step once more to deliver them
        return bool(self.requests) or bool(self.pending_outputs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def _finish(self, request: Request, reason: FinishReason, stop_reason: int | None = None) -> None:
        """Mark finished and free its blocks; the caller takes it out of running/waiting."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        if request.group is not None:
            request.group.release(self.kv)
        self.kv.free(request)
        self.requests.pop(request.request_id, None)
        self.finished_ids.append(request.request_id)

    def _finish_with_error(self, request: Request, error: str) -> None:
        self._finish(request, FinishReason.ERROR)
        self.pending_outputs.append(EngineCoreOutput(
            request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
            num_cached_tokens=max(0, request.num_cached_tokens), failure=EngineFailed(error)))

    def _preempt(self, request: Request) -> None:
        """Free its blocks and send it to the front of the queue to recompute everything it had."""
        if request.group is not None:
            request.group.restart(self.kv)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _no_room_error(self, request: Request) -> str:
        needed = -(-request.num_tokens // self.kv.block_size)
        return (f"request needs {needed} KV cache blocks for its {request.num_tokens} tokens, but the whole "
                f"cache has {self.kv.num_blocks}: raise the KV cache size or lower max_model_len")

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted_ids: list[str]) -> bool:
        """Slots for num_new more tokens of a running request, preempting the newest running requests
        until they fit. False when the request itself left `running` instead (preempted, or failed
        because it would not fit even alone)."""
        while not self.kv.allocate_slots(request, num_new):
            if len(self.running) == 1:  # it holds every block in use and still does not fit
                self.running.pop()
                self._finish_with_error(request, self._no_room_error(request))
                return False
            victim = self.running.pop()  # never one already scheduled this step: those are older
            self._preempt(victim)
            preempted_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _reserve_beams(self, root: Request, preempted_ids: list[str]) -> bool:
        """A slot for the next token of each live beam of the group (and the fresh blocks its copies on write go
        to), all or none, preempting the newest running requests until they fit. False when the group itself
        left `running` instead."""
        bs, beams = self.kv.block_size, root.group.beams
        needed = sum(max(0, -(-(b.num_computed_tokens + 1) // bs) - len(b.block_ids)) for b in beams)
        while needed > self.kv.num_free_blocks:
            if len(self.running) == 1:
                self.running.pop()
                self._finish_with_error(root, f"the beams need {needed} more KV cache blocks, but only "
                                              f"{self.kv.num_free_blocks} of {self.kv.num_blocks} are free with "
                                              f"nothing else running: raise the KV cache size")
                return False
            victim = self.running.pop()
            self._preempt(victim)
            preempted_ids.append(victim.request_id)
            if victim is root:
                return False
        for beam in beams:
            if not self.kv.allocate_slots(beam, 1):
                raise RuntimeError(f"beam {beam.request_id!r} got no slot although enough blocks were free")
        return True

    def _proposals(self, request: Request, room: int) -> list[int]:
        """Proposed next tokens for a decoding request: no more than the budget's room, and none that
        could take it past max_tokens or max_model_len (the step also adds one token of its own)."""
        limit = min(self.proposer.num_speculative_tokens, room, self.config.max_model_len - request.num_tokens - 1)
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            limit = min(limit, max_tokens - request.num_output_tokens - 1)
        return self.proposer.propose(request, limit) if limit > 0 else []

    # ---- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted_ids: list[str] = []

        # 1. running requests, oldest first: decodes (with proposals to verify), and prefills that continue
        speculate = self.proposer is not None and (
            self.proposer.disable_by_batch_size is None or len(self.running) <= self.proposer.disable_by_batch_size)
        i = 0
        block_copies: list[tuple[int, int]] = []
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.group is not None and request.group.decoding:
                beams = request.group.beams
                if len(beams) > budget:
                    i += 1  # all its beams or none: it waits for a step with room
                    continue
                if not self._reserve_beams(request, preempted_ids):
                    continue
                for beam in beams:
                    if beam.cow_src is not None:
                        block_copies.append((beam.cow_src, beam.block_ids[-1]))
                        beam.cow_src = None
                    scheduled.append(ScheduledRequest(beam, 1, beam.num_computed_tokens))
                budget -= len(beams)
                i += 1
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            decoding = request.num_tokens - request.num_computed_tokens == 1
            drafts = self._proposals(request, budget - 1) if speculate and decoding and request.group is None else []
            # proposals take free blocks only: they never cost another request its blocks
            if not (drafts and self.kv.allocate_slots(request, 1 + len(drafts))):
                drafts = []
                if not self._allocate_or_preempt(request, num_new, preempted_ids):
                    continue  # it left `running` (preempted or failed): the next one is at index i now
            scheduled.append(ScheduledRequest(request, num_new + len(drafts), request.num_computed_tokens, drafts))
            budget -= num_new + len(drafts)
            i += 1

        # 2. waiting requests, FCFS; none after a preemption, since blocks are already short. A request
        # whose grammar still compiles steps aside for this step and keeps its place in the queue; so does one
        # whose LoRA adapter would make the running requests use more than max_loras adapters
        compiling = []
        loras = self._running_loras()
        seats_in_use = sum(r.group.width if r.group is not None else 1 for r in self.running)  # beams count each
        while self.waiting and budget > 0 and not preempted_ids:
            request = self.waiting[0]
            seats = request.group.width if request.group is not None else 1
            if seats_in_use + seats > self.config.max_num_seqs:
                break
            lora = request.lora_request
            if lora is not None and lora.key not in loras and len(loras) >= (self.config.max_loras or 0):
                compiling.append(self.waiting.popleft())
                continue
            if request.grammar is not None:
                if not request.grammar.ready():
                    compiling.append(self.waiting.popleft())
                    continue
                error = request.grammar.start()
                if error is not None:
                    self.waiting.popleft()
                    self._finish_with_error(request, error)
                    continue
            hits, num_hit_tokens = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit_tokens, budget)
            if not self.kv.allocate_slots(request, num_new, hits):
                if not self.running:  # the whole pool is free and it still does not fit
                    self.waiting.popleft()
                    self._finish_with_error(request, self._no_room_error(request))
                    continue
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            seats_in_use += seats
            if lora is not None:
                loras.setdefault(lora.key, lora)
            scheduled.append(ScheduledRequest(request, num_new, num_hit_tokens))
            budget -= num_new

        self.waiting.extendleft(reversed(compiling))

        decodes = [s for s in scheduled if s.is_decode]
        prefills = [s for s in scheduled if not s.is_decode]
        finished_ids, self.finished_ids = self.finished_ids, []
        return SchedulerOutput(
            scheduled=decodes + prefills,
            num_decodes=len(decodes),
            total_num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            preempted_ids=preempted_ids,
            finished_ids=finished_ids,
            block_copies=block_copies,
            active_loras=list(loras.values()),  # the running requests' adapters, those admitted just now included
        )

    def _running_loras(self) -> dict:
        """The adapters of the running requests, by key, in order of first use."""
        loras = {}
        for request in self.running:
            if request.lora_request is not None:
                loras.setdefault(request.lora_request.key, request.lora_request)
        return loras

    def update_from_output(self, scheduler_output: SchedulerOutput, sampled: dict[str, list[int]],
                           logprobs: dict[str, list[Logprobs]] | None = None,
                           prompt_logprobs: dict[str, list[Logprobs]] | None = None,
                           embeddings: dict[str, bytes] | None = None) -> list[EngineCoreOutput]:
        """Advance each scheduled request by its chunk; append the token sampled for every request whose
        chunk reached its last known token, and finish the ones that hit a stop condition. Prompt logprobs
        gather chunk by chunk and go out with the first token. An embedding request finishes (STOP) with the
        chunk that completes its prompt, answering its pooled vector (`embeddings`)."""
        outputs: list[EngineCoreOutput] = []
        finished: set[int] = set()
        self.step_prompt_tokens = self.step_generation_tokens = 0
        beam_tops: dict[int, tuple[Request, dict[str, Logprobs]]] = {}  # id(root) -> the root, its beams' top logprobs
        for s in scheduler_output.scheduled:
            request = s.request
            if request.is_beam:
                root = request.owner
                if self.requests.get(root.request_id) is root and request in root.group.beams:
                    request.num_computed_tokens += 1
                    top = (logprobs or {}).get(request.request_id)
                    beam_tops.setdefault(id(root), (root, {}))[1].update({request.request_id: top[0]} if top else {})
                continue
            if self.requests.get(request.request_id) is not request or request.status != RequestStatus.RUNNING:
                continue  # aborted (or finished) since schedule()
            before = request.num_computed_tokens
            if prompt_logprobs and request.request_id in prompt_logprobs:
                del request.prompt_logprobs[before:]  # a chunk computed again (after a preemption) replaces its own
                request.prompt_logprobs += prompt_logprobs[request.request_id]
            num_drafts = len(s.spec_token_ids)
            request.num_computed_tokens = before + s.num_new_tokens - num_drafts  # kept proposals add below
            self.step_prompt_tokens += max(0, min(request.num_computed_tokens, request.num_prompt_tokens) - before)
            if request.num_computed_tokens < request.num_tokens:
                continue  # mid-prefill: nothing was sampled
            if request.is_pooling:
                outputs.append(self._finish_pooling(request, (embeddings or {}).get(request.request_id)))
                finished.add(id(request))
                continue
            if request.group is not None:  # the prompt is computed: its last row starts the beam search
                beam = request.group.start(self.kv)
                top = (logprobs or {}).get(request.request_id)
                beam_tops[id(request)] = (request, {beam.request_id: top[0]} if top else {})
                continue
            tokens = sampled.get(request.request_id)
            if not tokens or len(tokens) > num_drafts + 1:
                self.running.remove(request)
                self._finish(request, FinishReason.ERROR)
                finished.add(id(request))
                outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                finish_reason=FinishReason.ERROR,
                                                failure=EngineFailed(f"the model runner returned {len(tokens or ())} "
                                                                     f"tokens for this request, which had {num_drafts} "
                                                                     "proposed")))
                continue
            if num_drafts:
                self._count_kept(num_drafts, len(tokens) - 1)
                request.num_computed_tokens += len(tokens) - 1  # the kept proposals' K/V are valid
            new_tokens, reason, stop_reason = [], None, None
            failure = None
            for token in tokens:  # a stop condition among the kept proposals drops the rest
                request.append_output_token(token)
                new_tokens.append(token)
                reason, stop_reason = self._check_stop(request, token)
                if request.grammar is not None and reason is None:
                    error = request.grammar.accept(token)
                    if error is not None:
                        reason = FinishReason.ERROR
                        failure = ConstraintFailed(request.grammar.field, error)
                    elif request.grammar.terminated:  # complete: only EOS could follow
                        reason = FinishReason.STOP
                if reason is not None:
                    break
            self.step_generation_tokens += len(new_tokens)
            if reason is not None:
                self._finish(request, reason, stop_reason)
                finished.add(id(request))
            elif num_drafts:
                self.kv.keep_verified(request, before)
            scored, request.prompt_logprobs = request.prompt_logprobs, []
            outputs.append(EngineCoreOutput(
                request_id=request.request_id, new_token_ids=new_tokens,
                new_logprobs=(logprobs or {}).get(request.request_id, [])[:len(new_tokens)],
                finish_reason=reason, stop_reason=stop_reason,
                num_cached_tokens=max(0, request.num_cached_tokens), failure=failure, prompt_logprobs=scored))
        for root, tops in beam_tops.values():
            output = self._advance_beams(root, tops)
            if output is not None:
                outputs.append(output)
                finished.add(id(root))
        if finished:
            self.running = [r for r in self.running if id(r) not in finished]
        outputs, self.pending_outputs = self.pending_outputs + outputs, []
        return outputs

    def _finish_pooling(self, request: Request, embedding: bytes | None) -> EngineCoreOutput:
        """An embedding request whose prompt is computed: done, with its vector (its blocks stay in the prefix cache
        as any finished request's do)."""
        if embedding is None:
            self._finish(request, FinishReason.ERROR)
            return EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                                    num_cached_tokens=max(0, request.num_cached_tokens),
                                    failure=EngineFailed("the model runner returned no embedding for this request"))
        self._finish(request, FinishReason.STOP)
        return EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.STOP,
                                num_cached_tokens=max(0, request.num_cached_tokens), embedding=embedding)

    def _advance_beams(self, root: Request, tops: dict[str, Logprobs]) -> EngineCoreOutput | None:
        """After a step of the group's beams: fork and drop them; its one output when the search is done."""
        group = root.group
        missing = [b.request_id for b in group.beams if b.request_id not in tops]
        if missing:
            self._finish(root, FinishReason.ERROR)
            return EngineCoreOutput(request_id=root.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                                    num_cached_tokens=max(0, root.num_cached_tokens),
                                    failure=EngineFailed(f"the model runner returned no logprobs for {len(missing)} "
                                                         f"of the {len(group.beams)} beams of this request"))
        self.step_generation_tokens += len(group.beams)
        done = group.advance(self.kv, [(tops[b.request_id].top_token_ids, tops[b.request_id].top_logprobs)
                                       for b in group.beams])
        if not done:
            return None
        beams = group.hypotheses()
        reason = beams[0].finish_reason if beams else FinishReason.LENGTH
        self._finish(root, reason)
        return EngineCoreOutput(request_id=root.request_id, new_token_ids=[], finish_reason=reason,
                                num_cached_tokens=max(0, root.num_cached_tokens), beams=beams)

    def _count_kept(self, num_drafts: int, num_kept: int) -> None:
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += num_drafts
        self.spec_num_accepted_tokens += num_kept
        for j in range(num_kept):
            self.spec_accepted_per_position[j] += 1

    def fail_requests(self, requests: list[Request], error: str,
                      computed_before: dict[str, int] | None = None) -> list[EngineCoreOutput]:
        """Finish the given requests with an ERROR output each (the ones that already finished get one
        too: a step that failed midway may have lost their last output). computed_before[id] is how many
        of its tokens were computed before the failed step: the blocks past it were registered in the
        prefix cache for K/V the step never wrote, so they leave the cache instead of being reused."""
        outputs = []
        requests = list({id(r.owner): r.owner for r in requests}.values())  # a beam fails its whole search
        failed = {id(r) for r in requests}
        self.running = [r for r in self.running if id(r) not in failed]
        self.waiting = deque(r for r in self.waiting if id(r) not in failed)
        for request in requests:
            if self.requests.get(request.request_id) is request:
                for seq in [request] + (request.group.beams if request.group is not None else []):
                    before = (computed_before or {}).get(seq.request_id)
                    if before is not None:
                        self.kv.uncache_from(seq, before)
                self._finish(request, FinishReason.ERROR)
            outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                            finish_reason=FinishReason.ERROR,
                                            num_cached_tokens=max(0, request.num_cached_tokens),
                                            failure=EngineFailed(error)))
        return outputs

    def _check_stop(self, request: Request, token: int) -> tuple[FinishReason | None, int | None]:
        params = request.sampling_params
        past_min = request.num_output_tokens >= params.min_tokens
        if past_min and not params.ignore_eos and token in request.eos_token_ids:
            return FinishReason.STOP, None
        if past_min and token in request.stop_token_ids:
            return FinishReason.STOP, token
        if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH, None
        if request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    # ---- stats ----------------------------------------------------------------------------------

    def get_stats(self) -> SchedulerStats:
        """Gauges and totals (no step counts: see step_counts)."""
        gauges = SchedulerGauges(num_running=len(self.running), num_waiting=len(self.waiting),
                                 num_free_blocks=self.kv.num_free_blocks, num_total_blocks=self.kv.num_blocks,
                                 kv_cache_usage=self.kv.usage)
        totals = SchedulerTotals(prefix_cache_queries=self.kv.prefix_cache_queries,
                                 prefix_cache_hits=self.kv.prefix_cache_hits, num_preemptions=self.num_preemptions,
                                 spec_num_drafts=self.spec_num_drafts, spec_num_draft_tokens=self.spec_num_draft_tokens,
                                 spec_num_accepted_tokens=self.spec_num_accepted_tokens,
                                 spec_accepted_per_position=list(self.spec_accepted_per_position),
                                 num_aborted=self.num_aborted)
        return SchedulerStats(gauges=gauges, totals=totals)

    def step_counts(self) -> StepCounts:
        """What the latest schedule/update computed."""
        return StepCounts(num_prompt_tokens=self.step_prompt_tokens, num_generation_tokens=self.step_generation_tokens)
