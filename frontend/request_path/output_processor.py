"""Turns the core's per-step token batches into RequestOutputs.

Per sequence: incremental detokenization, stop strings (which the core cannot see, so the
frontend asks it to abort), logprobs in vLLM's shape. A request with n > 1 is n core requests
(its ProcessedRequest's samples) gathered back under one request. The state of each request lives in
its TrackedRequest (frontend/request_path/request_tracker.py).
"""

import time

from common.sampling_params import RequestOutputKind
from common.wire_messages import EngineCoreOutputs, EngineCoreRequest, FinishReason, Logprobs
from frontend.request_path.detokenizer import IncrementalDetokenizer
from frontend.request_path.outputs import (CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, Logprob,
                                           RequestOutput)
from frontend.request_path.processor import ProcessedRequest
from frontend.request_path.request_tracker import RequestTracker, SequenceState, TrackedRequest


class OutputProcessor:
    """Keeps no request state of its own: it fills in the records of `tracker` (its own when none is given)."""

    def __init__(self, tokenizer, tracker: RequestTracker | None = None, tracing=None, model_name: str = ""):
        self.tokenizer = tokenizer
        self.tracker = tracker if tracker is not None else RequestTracker()
        self.tracing = tracing  # a RequestTracing (frontend/request_path/request_tracing.py) when tracing is on
        self.model_name = model_name

    def add_request(self, request: ProcessedRequest, stream=None) -> list[EngineCoreRequest]:
        """Tracks a request (`stream`: where AsyncLLM reads its outputs); returns its core requests (one per
        sample), to send to a core. A request id in use is an InvalidParameter."""
        params = request.params
        sequences = {}
        if request.pooling_params is not None:  # no text to detokenize
            sequences = {core.request_id: SequenceState(i, None) for i, core in enumerate(request.core_requests)}
        for i, core_request in enumerate(request.core_requests if not sequences else ()):
            detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.stop,
                                           params.include_stop_str_in_output, params.skip_special_tokens,
                                           min_tokens=params.min_tokens)
            sequences[core_request.request_id] = SequenceState(
                i, detok, logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if params.logprobs is not None else None)
        record = self.tracker.add(TrackedRequest(request.request_id, request.prompt, request.prompt_token_ids, params,
                                                 sequences, stream, pooling=request.pooling_params is not None))
        if self.tracing is not None:
            self.tracing.start(request, record, self.model_name)
        return request.core_requests

    def abort_request(self, request_id: str) -> list[str]:
        """Forgets a request; returns its unfinished core request ids (to abort in the core)."""
        record = self.tracker.remove(request_id)
        return record.unfinished_core_requests() if record is not None else []

    def process_outputs(self, outputs: EngineCoreOutputs) -> tuple[list[tuple[TrackedRequest, RequestOutput]], list[str]]:
        """(RequestOutputs to deliver, with their request's record; core request ids to abort). A request whose
        last sample finished leaves the tracker."""
        now = time.time()
        updated: dict[str, TrackedRequest] = {}
        to_abort = []
        for out in outputs.outputs:
            record = self.tracker.owner_of(out.request_id)
            if record is None:
                continue  # aborted or finished already
            seq = record.sequences[out.request_id]
            if seq.finished:
                continue
            if out.time_in_queue is not None and record.time_in_queue is None:
                record.time_in_queue = out.time_in_queue
            if record.pooling:
                if out.finish_reason is not None:
                    seq.finish_reason, seq.failure = FinishReason(out.finish_reason), out.failure
                    record.embedding, record.num_cached_tokens = out.embedding, out.num_cached_tokens
                    record.last_token_time = now
                    updated[record.request_id] = record
                continue
            if out.new_token_ids:
                record.first_token_time = record.first_token_time or now
                record.last_token_time = now
                record.num_cached_tokens = max(record.num_cached_tokens, out.num_cached_tokens)
            if out.beams:
                record.beams = out.beams
                record.last_token_time = now
                record.num_cached_tokens = max(record.num_cached_tokens, out.num_cached_tokens)
            seq.token_ids.extend(out.new_token_ids)
            self._add_logprobs(seq, out.new_logprobs)
            # sample 0 scores the prompt for all n (processor.py), so its first output carries them
            if (record.params.prompt_logprobs is not None and record.prompt_logprobs is None and seq.index == 0
                    and out.new_token_ids):
                record.prompt_logprobs = [None] + [self._entry(lp) for lp in out.prompt_logprobs]
            stop_str = seq.detokenizer.update(out.new_token_ids)
            if stop_str is not None:
                seq.finish_reason, seq.stop_string = FinishReason.STOP, stop_str
                if out.finish_reason is None:
                    to_abort.append(out.request_id)
            elif out.finish_reason is not None:
                seq.finish_reason = FinishReason(out.finish_reason)
                seq.stop_token_id, seq.failure = out.stop_reason, out.failure
            updated[record.request_id] = record
        results = []
        for record in updated.values():
            ro = self._make_output(record)
            if ro is not None:
                results.append((record, ro))
            if record.finished:
                self.tracker.remove(record.request_id)
        return results, to_abort

    def _beam_output(self, record: TrackedRequest) -> RequestOutput:
        """A finished beam search: one completion per beam, best score first, all at once."""
        completions = []
        for i, beam in enumerate(record.beams):
            detok = IncrementalDetokenizer(self.tokenizer, record.prompt_token_ids, [], False,
                                           record.params.skip_special_tokens)
            detok.update(beam.token_ids)
            completions.append(CompletionOutput(i, detok.text, list(beam.token_ids), beam.cum_logprob,
                                                finish_reason=str(FinishReason(beam.finish_reason)), score=beam.score))
        metrics = {"arrival_time": record.arrival_time, "first_token_time": record.last_token_time,
                   "last_token_time": record.last_token_time}
        return RequestOutput(record.request_id, record.prompt, record.prompt_token_ids, completions, True,
                             record.num_cached_tokens, metrics)

    def _add_logprobs(self, seq: SequenceState, lps: list[Logprobs]) -> None:
        if seq.logprobs is None:
            return
        for lp in lps:
            seq.logprobs.append(self._entry(lp))
            seq.cumulative_logprob += lp.logprob

    def _entry(self, lp: Logprobs) -> dict[int, Logprob]:
        """One position's logprobs in vLLM's shape: the token's, then the top ids' (ranked), decoded."""
        entry = {lp.token_id: Logprob(lp.logprob, lp.rank, self.tokenizer.decode([lp.token_id]))}
        for tid, val in zip(lp.top_token_ids, lp.top_logprobs):
            if tid not in entry:
                entry[tid] = Logprob(val, None, self.tokenizer.decode([tid]))
        for rank, tid in enumerate(lp.top_token_ids, start=1):
            entry[tid].rank = rank if tid != lp.token_id else lp.rank
        return entry

    def _embedding_output(self, record: TrackedRequest) -> EmbeddingRequestOutput:
        """A finished embedding request: its vector, or (error) why there is none."""
        (seq,) = record.sequences.values()
        error = None
        if seq.finish_reason != FinishReason.STOP:
            error = seq.failure.message if seq.failure is not None else f"the request ended: {seq.finish_reason}"
        return EmbeddingRequestOutput(record.request_id, EmbeddingOutput(record.embedding), record.prompt_token_ids,
                                      True, record.num_cached_tokens, error)

    def _make_output(self, record: TrackedRequest) -> RequestOutput | EmbeddingRequestOutput | None:
        if record.pooling:
            return self._embedding_output(record) if record.finished else None
        kind = record.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not record.finished:
            return None
        if record.beams is not None:
            return self._beam_output(record)
        completions = []
        for seq in sorted(record.sequences.values(), key=lambda s: s.index):
            done = seq.finished
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
                                                None if seq.finish_reason is None else str(seq.finish_reason),
                                                seq.stop_reason, seq.error_param))
        if not completions:
            return None
        metrics = {"arrival_time": record.arrival_time, "first_token_time": record.first_token_time,
                   "last_token_time": record.last_token_time}
        return RequestOutput(record.request_id, record.prompt, record.prompt_token_ids, completions,
                             record.finished, record.num_cached_tokens, metrics, record.prompt_logprobs)
