"""Unit tests of the frontend's request path with no process and no socket: Processor, OutputProcessor,
EngineRouter and AsyncLLM on fake core clients (tests/support/fake_core.py)."""

import asyncio

import msgspec
import pytest

from common.errors import InvalidParameter
from common.limits import RequestLimits
from common.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerGauges, SchedulerStats
from common.sampling_params import RequestOutputKind, SamplingParams
from tests.support.fake_core import FakeCoreClient, ready_for
from frontend.async_engine.async_llm import AsyncLLM
from frontend.core_link.core_client import EngineDeadError
from frontend.async_engine.engine_router import EngineRouter
from frontend.request_path.output_processor import OutputProcessor
from frontend.request_path.processor import Processor, model_fingerprint
from frontend.request_path.tokenizer import tokenizer_from_files

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ready(default_model_dir):
    return ready_for(default_model_dir)


@pytest.fixture(scope="module")
def processor(ready):
    return Processor.for_model(tokenizer_from_files(ready.tokenizer_files), ready)


# ---- Processor --------------------------------------------------------------------------------

def test_process_makes_one_request_with_a_core_request_per_sample(processor):
    request = processor.process("r", "Hello there", SamplingParams(n=3, seed=7, max_tokens=5), cache_salt="s")
    assert request.prompt == "Hello there" and request.prompt_token_ids == processor.tokenizer.encode("Hello there")
    assert [r.request_id for r in request.core_requests] == ["r-0", "r-1", "r-2"]
    assert [r.sampling_params.seed for r in request.core_requests] == [7, 8, 9]  # n samples, not n copies
    assert all(r.prompt_token_ids == request.prompt_token_ids and r.cache_salt == "s" for r in request.core_requests)
    one = processor.process("q", [5, 6, 7], SamplingParams(max_tokens=None))
    assert one.prompt is None and [r.request_id for r in one.core_requests] == ["q"]
    assert one.params.max_tokens == processor.max_model_len - 3  # as many as fit
    assert request.model_fingerprint == one.model_fingerprint == processor.fingerprint


@pytest.mark.parametrize("prompt, params, param", [
    ("", SamplingParams(), "prompt"),
    ([1, 49152], SamplingParams(), "prompt"),
    ("hi", SamplingParams(temperature=-1), "temperature"),
    ("hi", SamplingParams(n=10_000), "n"),
    ("hi", SamplingParams(max_tokens=10_000), "max_tokens"),
    ("hi", SamplingParams(stop_token_ids=[49152]), "stop_token_ids"),
    (3.5, SamplingParams(), "prompt"),
])
def test_a_bad_field_is_an_error_that_carries_it(processor, prompt, params, param):
    with pytest.raises(InvalidParameter) as info:
        processor.process("r", prompt, params)
    assert info.value.param == param and str(info.value).startswith(param)


def test_fingerprint_follows_model_limits_and_tokenizer(ready):
    assert model_fingerprint(ready) == model_fingerprint(msgspec.structs.replace(ready))
    assert model_fingerprint(ready) != model_fingerprint(msgspec.structs.replace(ready, max_model_len=128))
    assert model_fingerprint(ready) != model_fingerprint(msgspec.structs.replace(ready, model_name="other"))


# ---- OutputProcessor -----------------------------------------------------------------------------

def _batch(*outs) -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=rid, new_token_ids=[tid], finish_reason=done)
                                      for rid, tid, done in outs])


def test_samples_gather_under_their_request(processor):
    outputs = OutputProcessor(processor.tokenizer)
    request = processor.process("r", "Hi", SamplingParams(n=2, max_tokens=2, output_kind=RequestOutputKind.FINAL_ONLY))
    assert outputs.add_request(request) == request.core_requests
    results, _ = outputs.process_outputs(_batch(("r-0", 100, None), ("r-1", 200, None)))
    assert results == []  # FINAL_ONLY: nothing until both samples end
    results, _ = outputs.process_outputs(_batch(("r-0", 101, FinishReason.LENGTH), ("r-1", 201, FinishReason.LENGTH)))
    (_, final), = results
    assert final.finished and [c.token_ids for c in final.outputs] == [[100, 101], [200, 201]]
    assert len(outputs.tracker) == 0


def test_a_request_id_in_use_is_refused_and_abort_names_the_unfinished_samples(processor):
    outputs = OutputProcessor(processor.tokenizer)
    outputs.add_request(processor.process("r", "Hi", SamplingParams(n=2, max_tokens=2)))
    with pytest.raises(InvalidParameter) as info:
        outputs.add_request(processor.process("r", "Hi", SamplingParams()))
    assert info.value.param == "request_id"
    with pytest.raises(InvalidParameter):  # the id of another request's sample
        outputs.add_request(processor.process("r-1", "Hi", SamplingParams()))
    outputs.process_outputs(_batch(("r-0", 100, FinishReason.STOP)))
    assert outputs.abort_request("r") == ["r-1"]
    assert outputs.abort_request("r") == []


# ---- EngineRouter ------------------------------------------------------------------------------

class Listener:
    def __init__(self):
        self.ups, self.downs, self.batches = [], [], []

    def core_up(self, link):
        self.ups.append(link.index)

    def core_down(self, link, error, lost):
        self.downs.append((link.index, sorted(lost)))

    def core_outputs(self, link, outputs):
        self.batches.append((link.index, outputs))


def test_router_keeps_routes_and_hands_back_a_lost_cores_requests(ready):
    async def run():
        clients = [FakeCoreClient(ready, f"fake://{i}") for i in range(2)]
        listener = Listener()
        router = EngineRouter(clients, listener)
        await router.start(5)
        await asyncio.sleep(0)
        assert sorted(listener.ups) == [0, 1]
        fp = model_fingerprint(ready)
        first = router.submit("a", fp, 2)
        second = router.submit("b", fp, 1)
        assert first is not second  # the first took load (2 sent since stats): the other is lighter
        assert router.core_of("a") is first and first.sent_since_stats == 2
        assert router.submit("c", "another model", 1) is None
        assert router.finish("b") is second and router.core_of("b") is None
        router.submit("d", fp, 1, exclude=[second])
        clients[first.index].die()
        for _ in range(5):
            await asyncio.sleep(0)
        assert listener.downs == [(first.index, ["a", "d"])]
        assert router.routed_requests == set() and router.live(fp) == [second]
        stats = SchedulerStats(gauges=SchedulerGauges(num_running=5))
        clients[second.index]._outputs.put_nowait(EngineCoreOutputs(scheduler_stats=stats))
        await asyncio.sleep(0)
        assert second.stats == stats and second.sent_since_stats == 0
        router.shutdown()

    asyncio.run(run())


# ---- AsyncLLM ----------------------------------------------------------------------------------

async def _started(clients) -> AsyncLLM:
    engine = AsyncLLM(clients)
    await engine.router.start(5)
    return engine


async def _collect(engine, request):
    return [out async for out in engine.stream(request)]


def test_async_llm_streams_a_request_and_forgets_it(ready):
    async def run():
        client = FakeCoreClient(ready, tokens_per_request=3)
        engine = await _started([client])
        params = SamplingParams(n=2, max_tokens=5, output_kind=RequestOutputKind.DELTA)
        outs = await _collect(engine, engine.process("r", "Hello", params))
        assert outs[-1].finished
        tokens = {}
        for out in outs:
            for c in out.outputs:
                tokens.setdefault(c.index, []).extend(c.token_ids)
        assert tokens == {0: [100, 101, 102], 1: [100, 101, 102]}
        assert [r.request_id for r in client.added] == ["r-0", "r-1"]
        assert engine.num_unfinished_requests == 0
        engine.shutdown()

    asyncio.run(run())


async def _held_core_and_a_busier_one(ready):
    """Two cores: requests go to the first (the other reports 9 running), which holds them."""
    held = FakeCoreClient(ready, "fake://0", hold=True)
    other = FakeCoreClient(ready, "fake://1")
    other.stats = SchedulerStats(gauges=SchedulerGauges(num_running=9))
    engine = await _started([held, other])
    other._outputs.put_nowait(EngineCoreOutputs(scheduler_stats=other.stats))
    await asyncio.sleep(0)
    return engine, held, other


def test_a_request_moves_when_its_core_is_lost_before_any_output(ready):
    async def run():
        engine, held, other = await _held_core_and_a_busier_one(ready)
        task = asyncio.create_task(_collect(engine, engine.process("r", "Hello", SamplingParams(max_tokens=2))))
        while not held.added:
            await asyncio.sleep(0)
        held.die()
        outs = await asyncio.wait_for(task, 5)
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == [100, 101]
        assert [r.request_id for r in other.added] == ["r"]
        engine.shutdown()

    asyncio.run(run())


def test_a_request_that_produced_fails_with_its_core(ready):
    async def run():
        engine, held, other = await _held_core_and_a_busier_one(ready)
        stream = engine.stream(engine.process("r", "Hello", SamplingParams(max_tokens=3)))
        first = asyncio.create_task(stream.__anext__())
        while not held.added:
            await asyncio.sleep(0)
        held._outputs.put_nowait(_batch(("r", 100, None)))
        assert (await first).outputs[0].token_ids == [100]
        held.die()
        with pytest.raises(EngineDeadError):  # its client saw a token: it cannot start afresh elsewhere
            await stream.__anext__()
        assert other.added == []
        engine.shutdown()

    asyncio.run(run())


def test_cancelling_the_consumer_aborts_the_request_in_its_core(ready):
    async def run():
        client = FakeCoreClient(ready, hold=True)
        engine = await _started([client])
        task = asyncio.create_task(_collect(engine, engine.process("r", "Hello", SamplingParams(n=2, max_tokens=3))))
        while len(client.added) < 2:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert sorted(client.aborted) == ["r-0", "r-1"]
        assert engine.num_unfinished_requests == 0
        engine.shutdown()

    asyncio.run(run())


def test_a_request_checked_for_another_model_is_refused(ready):
    async def run():
        engine = await _started([FakeCoreClient(ready)])
        stale = Processor.for_model(engine.tokenizer, msgspec.structs.replace(ready, max_model_len=64))
        with pytest.raises(EngineDeadError, match="changed its model"):
            await _collect(engine, stale.process("r", "Hello", SamplingParams(max_tokens=2)))
        engine.shutdown()

    asyncio.run(run())


def test_a_dead_engine_refuses_new_requests(ready):
    async def run():
        client = FakeCoreClient(ready)
        engine = await _started([client])
        client.die("gone for good")
        for _ in range(5):
            await asyncio.sleep(0)
        with pytest.raises(EngineDeadError, match="gone for good"):
            engine.process("r", "Hello", SamplingParams())
        engine.shutdown()

    asyncio.run(run())


def test_limits_reach_the_processor(ready):
    limits = RequestLimits(max_n=2)
    engine_ready = msgspec.structs.replace(ready, limits=limits)
    processor = Processor.for_model(tokenizer_from_files(ready.tokenizer_files), engine_ready)
    with pytest.raises(InvalidParameter, match="--max-n"):
        processor.process("r", "Hello", SamplingParams(n=3))


def test_a_bug_mid_stream_is_an_error_event_logged_with_traceback_and_request_id(caplog):
    """A streamed response has sent its 200: the client gets an error event, the log gets the traceback."""
    import json
    import logging

    from frontend.endpoints.serving.engine_run import sse_events

    async def events():
        yield "data: {}\n\n"
        raise AttributeError("'ProcessedRequest' object has no attribute 'token_ids'")

    async def run():
        return [e async for e in sse_events(events(), "cmpl-abc123")]

    with caplog.at_level(logging.ERROR, logger="nvllm"):
        out = asyncio.run(run())
    assert out[-1] == "data: [DONE]\n\n"
    error = json.loads(out[1][len("data: "):])["error"]
    assert error["type"] == "server_error" and "AttributeError" in error["message"]
    record = next(r for r in caplog.records if "cmpl-abc123" in r.getMessage())
    assert record.exc_info is not None and record.exc_info[0] is AttributeError
