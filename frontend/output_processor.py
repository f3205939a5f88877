"""Turns the core's per-step token batches into RequestOutputs.

Per sequence: incremental detokenization, stop strings (which the core cannot see, so the
frontend asks it to abort), logprobs in vLLM's shape. A request with n > 1 is n core requests
(its ProcessedRequest's samples) gathered back under one parent.
"""

import time
from dataclasses import dataclass, field

from common.errors import InvalidParameter
from common.protocol import EngineCoreOutputs, EngineCoreRequest, FinishReason, Logprobs
from common.sampling_params import RequestOutputKind, SamplingParams
from frontend.detokenizer import IncrementalDetokenizer
from frontend.outputs import CompletionOutput, Logprob, RequestOutput
from frontend.processor import ProcessedRequest


@dataclass
class SequenceState:
    index: int
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error_param: str | None = None
    sent_tokens: int = 0  # for delta outputs
    sent_logprobs: int = 0
    final_sent: bool = False


@dataclass
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    children: dict[str, SequenceState]
    queue: object = None  # where AsyncLLM wants this request's outputs; None for the offline API
    num_cached_tokens: int = 0
    arrival_time: float = field(default_factory=time.time)
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children.values())


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.child_to_parent: dict[str, str] = {}

    def add_request(self, request: ProcessedRequest, queue=None) -> list[EngineCoreRequest]:
        """Registers a request; returns its core requests (one per sample), to send to a core."""
        request_id, params = request.request_id, request.params
        core_ids = [r.request_id for r in request.core_requests]
        taken = [rid for rid in [request_id, *core_ids] if rid in self.parents or rid in self.child_to_parent]
        if taken:
            raise InvalidParameter("request_id", f"request_id {taken[0]!r} is already in use")
        children = {}
        for i, cid in enumerate(core_ids):
            detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.stop,
                                           params.include_stop_str_in_output, params.skip_special_tokens,
                                           min_tokens=params.min_tokens)
            children[cid] = SequenceState(i, detok, logprobs=[] if params.logprobs is not None else None,
                                          cumulative_logprob=0.0 if params.logprobs is not None else None)
            self.child_to_parent[cid] = request_id
        self.parents[request_id] = ParentState(request_id, request.prompt, request.prompt_token_ids, params,
                                               children, queue)
        return request.core_requests

    def abort_request(self, request_id: str) -> list[str]:
        """Forgets a parent request; returns its unfinished core request ids (to abort in the core)."""
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return []
        for cid in parent.children:
            self.child_to_parent.pop(cid, None)
        return [cid for cid, c in parent.children.items() if c.finish_reason is None]

    def process_outputs(self, outputs: EngineCoreOutputs) -> tuple[list[tuple[ParentState, RequestOutput]], list[str]]:
        """(RequestOutputs to deliver, with their parent state; core request ids to abort)."""
        now = time.time()
        updated: dict[str, ParentState] = {}
        to_abort = []
        for out in outputs.outputs:
            pid = self.child_to_parent.get(out.request_id)
            if pid is None:
                continue  # aborted or finished already
            parent = self.parents[pid]
            seq = parent.children[out.request_id]
            if seq.finish_reason is not None:
                continue
            if out.new_token_ids:
                parent.first_token_time = parent.first_token_time or now
                parent.last_token_time = now
                parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            seq.token_ids.extend(out.new_token_ids)
            self._add_logprobs(seq, out.new_logprobs)
            stop_str = seq.detokenizer.update(out.new_token_ids)
            if stop_str is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop_str
                if out.finish_reason is None:
                    to_abort.append(out.request_id)
            elif out.finish_reason is not None:
                seq.finish_reason = str(FinishReason(out.finish_reason))
                seq.stop_reason = out.stop_reason
                if out.error:
                    seq.stop_reason, seq.error_param = out.error, out.error_param
            updated[pid] = parent
        results = []
        for pid, parent in updated.items():
            ro = self._make_output(parent)
            if ro is not None:
                results.append((parent, ro))
            if parent.finished:
                self.abort_request(pid)
        return results, to_abort

    def _add_logprobs(self, seq: SequenceState, lps: list[Logprobs]) -> None:
        if seq.logprobs is None:
            return
        for lp in lps:
            entry = {lp.token_id: Logprob(lp.logprob, lp.rank, self.tokenizer.decode([lp.token_id]))}
            for tid, val in zip(lp.top_token_ids, lp.top_logprobs):
                if tid not in entry:
                    entry[tid] = Logprob(val, None, self.tokenizer.decode([tid]))
            for rank, tid in enumerate(lp.top_token_ids, start=1):
                entry[tid].rank = rank if tid != lp.token_id else lp.rank
            seq.logprobs.append(entry)
            seq.cumulative_logprob += lp.logprob

    def _make_output(self, parent: ParentState) -> RequestOutput | None:
        kind = parent.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not parent.finished:
            return None
        completions = []
        for seq in sorted(parent.children.values(), key=lambda s: s.index):
            done = seq.finish_reason is not None
            if kind == RequestOutputKind.DELTA and seq.final_sent:
                continue
            seq.final_sent = done
            if kind == RequestOutputKind.DELTA:
                text = seq.detokenizer.new_text(done)
                token_ids = seq.token_ids[seq.sent_tokens:]
                logprobs = seq.logprobs[seq.sent_logprobs:] if seq.logprobs is not None else None
                seq.sent_tokens, seq.sent_logprobs = len(seq.token_ids), len(seq.logprobs or [])
                if not text and not token_ids and not done:
                    continue
            else:
                text = seq.detokenizer.text if done else seq.detokenizer.text[
                    : max(0, len(seq.detokenizer.text) - seq.detokenizer.hold_back)]
                token_ids, logprobs = list(seq.token_ids), seq.logprobs
            completions.append(CompletionOutput(seq.index, text, token_ids, seq.cumulative_logprob, logprobs,
                                                seq.finish_reason, seq.stop_reason, seq.error_param))
        if not completions:
            return None
        metrics = {"arrival_time": parent.arrival_time, "first_token_time": parent.first_token_time,
                   "last_token_time": parent.last_token_time}
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, completions,
                             parent.finished, parent.num_cached_tokens, metrics)
