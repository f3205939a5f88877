"""Typed contracts on the wire (common/wire_messages.py): a utility call names a UtilityMethod, a failure is one
tagged struct per meaning, a finish reason one FinishReason; anything else is a decode error, which the
receiver logs and drops. The frontend's outputs keep vLLM's shape, each meaning mapped from its own type."""

import msgspec
import pytest

from common import wire_messages as P
from common.sampling_params import SamplingParams
from frontend.request_path.output_processor import OutputProcessor
from frontend.request_path.processor import Processor
from frontend.request_path.tokenizer import tokenizer_from_files
from tests.support.fake_core import ready_for

pytestmark = pytest.mark.unit


def test_a_utility_call_names_a_known_method_or_is_a_decode_error():
    decoder = msgspec.msgpack.Decoder(P.UtilityCall)
    call = decoder.decode(msgspec.msgpack.encode(P.UtilityCall(7, P.UtilityMethod.GET_STATS)))
    assert call.method is P.UtilityMethod.GET_STATS
    with pytest.raises(P.MALFORMED):
        decoder.decode(msgspec.msgpack.encode([7, "drop_all_tables"]))


def test_each_failure_is_its_own_tagged_struct_and_an_unknown_one_is_a_decode_error():
    decoder = msgspec.msgpack.Decoder(P.EngineCoreOutput)
    failures = [P.RequestRejected("top_k must be ..."), P.ConstraintFailed("structured_outputs.regex", "refused"),
                P.EngineFailed("IndexError"), P.CoreShutDown("the engine core shut down")]
    for failure in failures:
        out = P.EngineCoreOutput(request_id="r", new_token_ids=[], finish_reason=P.FinishReason.ERROR, failure=failure)
        back = decoder.decode(msgspec.msgpack.encode(out))
        assert back.failure == failure and back.error == failure.message
        assert back.error_param == (failure.field if isinstance(failure, P.ConstraintFailed) else None)
    bad = msgspec.msgpack.encode(["r", [], [], 3, None, 0, ["mystery", "x"]])
    with pytest.raises(P.MALFORMED):
        decoder.decode(bad)
    with pytest.raises(P.MALFORMED):  # a finish reason that is none of FinishReason's
        decoder.decode(msgspec.msgpack.encode(["r", [], [], 9]))


@pytest.fixture(scope="module")
def processor(default_model_dir):
    ready = ready_for(default_model_dir)
    return Processor.for_model(tokenizer_from_files(ready.tokenizer_files), ready)


def _finish(processor, params, **out):
    outputs = OutputProcessor(processor.tokenizer)
    outputs.add_request(processor.process("r", "Hi", params))
    batch = P.EngineCoreOutputs(outputs=[P.EngineCoreOutput(request_id="r", **out)])
    (record, ro), = outputs.process_outputs(batch)[0]
    return ro.outputs[0]


def test_the_frontend_keeps_a_stop_token_a_stop_string_and_a_failure_apart(processor):
    token = _finish(processor, SamplingParams(), new_token_ids=[5], finish_reason=P.FinishReason.STOP, stop_reason=5)
    assert (token.finish_reason, token.stop_reason, token.error_param) == ("stop", 5, None)
    text = processor.tokenizer.decode([processor.tokenizer.encode(" world")[0]])
    string = _finish(processor, SamplingParams(stop=[text.strip()]), new_token_ids=processor.tokenizer.encode(" world"))
    assert (string.finish_reason, string.stop_reason) == ("stop", text.strip())
    failed = _finish(processor, SamplingParams(), new_token_ids=[], finish_reason=P.FinishReason.ERROR,
                     failure=P.ConstraintFailed("structured_outputs.regex", "structured_outputs.regex refused"))
    assert (failed.finish_reason, failed.stop_reason, failed.error_param) == \
        ("error", "structured_outputs.regex refused", "structured_outputs.regex")
    engine = _finish(processor, SamplingParams(), new_token_ids=[], finish_reason=P.FinishReason.ERROR,
                     failure=P.EngineFailed("boom"))
    assert (engine.finish_reason, engine.stop_reason, engine.error_param) == ("error", "boom", None)
