"""One record per request: the RequestTracker holds each request's samples, core, stream and output state,
and AsyncLLM, its router, the OutputProcessor and the offline LLM all read that one record (no process,
no socket: tests/support/fake_core.py stands in for the core)."""

import asyncio

import pytest

from common.errors import InvalidParameter
from common.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from common.sampling_params import RequestOutputKind, SamplingParams
from tests.support.fake_core import FakeCoreClient, ready_for
from frontend.async_engine.async_llm import AsyncLLM
from frontend.offline.llm import LLM
from frontend.request_path.request_tracker import RequestTracker, TrackedRequest

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ready(default_model_dir):
    return ready_for(default_model_dir)


def test_tracker_finds_a_request_by_its_id_and_by_each_samples_id():
    tracker = RequestTracker()
    record = tracker.add(TrackedRequest("r", sequences={"r-0": None, "r-1": None}))
    assert tracker.get("r") is record and tracker.owner_of("r-1") is record and "r" in tracker
    with pytest.raises(InvalidParameter):
        tracker.add(TrackedRequest("r-0"))  # a sample's id is taken too
    assert tracker.remove("r") is record and len(tracker) == 0 and tracker.owner_of("r-0") is None


def test_an_n2_request_is_one_record_with_both_samples_its_core_and_its_stream(ready):
    async def run():
        params = SamplingParams(n=2, max_tokens=3, output_kind=RequestOutputKind.DELTA)
        engine, client, task = await _placed(ready, "Hello", params)
        record = engine.requests.get("r")
        assert list(record.sequences) == ["r-0", "r-1"]
        assert record.core is engine.router.links[0] and record.stream is not None
        # every part reads the same record
        assert engine.output_processor.tracker is engine.requests is engine.router.requests
        assert engine.router.core_of("r") is record.core and engine.num_unfinished_requests == 1
        client.release()
        outs = await asyncio.wait_for(task, 5)
        assert outs[-1].finished and "r" not in engine.requests and len(engine.requests) == 0
        engine.shutdown()

    asyncio.run(run())


def test_an_aborted_request_leaves_the_tracker_and_its_core_hears_of_both_samples(ready):
    async def run():
        engine, client, task = await _placed(ready, "Hi", SamplingParams(n=2))
        await engine.abort("r")
        assert sorted(client.aborted) == ["r-0", "r-1"] and len(engine.requests) == 0
        task.cancel()
        engine.shutdown()

    asyncio.run(run())


def test_a_duplicate_request_id_is_refused_without_touching_the_request_that_has_it(ready):
    async def run():
        engine, client, first = await _placed(ready, "Hi", SamplingParams())
        with pytest.raises(InvalidParameter):
            await _drain(engine.stream(engine.process("r", "Hi", SamplingParams())))
        assert client.aborted == [] and engine.requests.get("r").core is engine.router.links[0]
        client.release()
        assert (await asyncio.wait_for(first, 5))[-1].finished
        engine.shutdown()

    asyncio.run(run())


async def _drain(stream):
    return [out async for out in stream]


async def _placed(ready, prompt: str, params: SamplingParams):
    """An AsyncLLM over a fake core that holds its outputs, and request "r" streaming into a task, once the core
    has every sample of it."""
    client = FakeCoreClient(ready, hold=True)
    engine = AsyncLLM([client])
    await engine.router.start(5)
    task = asyncio.create_task(_drain(engine.stream(engine.process("r", prompt, params))))
    while len(client.added) < params.n:
        await asyncio.sleep(0)
    return engine, client, task


class FakeSyncClient:
    """The offline LLM's core client, answering each core request with two tokens."""

    def __init__(self, ready, seen: list):
        self.model_info = ready
        self.pending, self.seen, self.aborted = [], seen, []

    def add_request(self, request):
        self.pending.append(request.request_id)

    def get_output(self):
        self.seen.append(set(self._llm.requests.get("0").sequences) if "0" in self._llm.requests else None)
        outs = [EngineCoreOutput(request_id=rid, new_token_ids=[100, 101], finish_reason=FinishReason.LENGTH)
                for rid in self.pending]
        self.pending = []
        return EngineCoreOutputs(outputs=outs)

    def abort_requests(self, ids):
        self.aborted.extend(ids)


def test_the_offline_llm_tracks_its_requests_in_the_same_tracker(ready):
    seen = []
    llm = LLM.__new__(LLM)
    llm.engine_args, llm.client = None, FakeSyncClient(ready, seen)
    llm.client._llm = llm
    llm._setup()
    out, = llm.generate("Hello", SamplingParams(n=2, max_tokens=2), use_tqdm=False)
    assert seen == [{"0-0", "0-1"}]  # while it ran: one record with both samples
    assert out.finished and [c.token_ids for c in out.outputs] == [[100, 101], [100, 101]]
    assert len(llm.requests) == 0 and llm.requests is llm.output_processor.tracker
