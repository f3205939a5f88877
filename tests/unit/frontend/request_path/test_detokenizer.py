"""Incremental detokenization and stop strings on the real SmolLM2 tokenizer."""

import pytest
from transformers import PreTrainedTokenizerFast

from common.limits import RequestLimits
from common.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from common.sampling_params import RequestOutputKind, SamplingParams
from frontend.request_path.output_processor import OutputProcessor
from frontend.request_path.processor import Processor

pytestmark = pytest.mark.unit

TEXTS = ["Hello, world! Ça va? 日本語のテキスト 🙂🚀 naïve café — done.",
         "def f(x):\n    return x ** 2  # ✓",
         "Emoji run: 👩‍👩‍👧‍👦🏳️‍🌈 and Ελληνικά and العربية"]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return PreTrainedTokenizerFast.from_pretrained(default_model_dir)


def _stream(tokenizer, token_ids, params, prompt_ids=(1, 2, 3)):
    proc = OutputProcessor(tokenizer)
    processor = Processor(tokenizer, RequestLimits(vocab_size=len(tokenizer), max_model_len=4096), [])
    proc.add_request(processor.process("r", list(prompt_ids), params))
    pieces, final = [], None
    for i, tid in enumerate(token_ids):
        last = i == len(token_ids) - 1
        outs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="r", new_token_ids=[tid],
                                                           finish_reason=FinishReason.LENGTH if last else None)])
        results, to_abort = proc.process_outputs(outs)
        for _, ro in results:
            pieces.append(ro.outputs[0].text)
            final = ro
        if to_abort:
            return pieces, final, to_abort
    return pieces, final, []


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    pieces, final, _ = _stream(tokenizer, ids, SamplingParams(output_kind=RequestOutputKind.DELTA))
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # no half characters on the way


def test_stop_string_excluded_and_included(tokenizer):
    text = "The answer is 42. STOP here and more text"
    ids = tokenizer.encode(text)
    pieces, final, to_abort = _stream(tokenizer, ids, SamplingParams(stop=["STOP"], output_kind=RequestOutputKind.DELTA))
    assert "".join(pieces) == "The answer is 42. "
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "STOP"
    assert to_abort == ["r"]  # the core must be told to stop
    pieces, final, _ = _stream(tokenizer, ids, SamplingParams(stop=["STOP"], include_stop_str_in_output=True,
                                                              output_kind=RequestOutputKind.DELTA))
    assert "".join(pieces) == "The answer is 42. STOP"


def test_stop_strings_wait_for_min_tokens(tokenizer):
    """A stop string ends a sequence only where it ends in the min_tokens-th token's text or later, like EOS and
    stop token ids, which the sampler bans before min_tokens."""
    text = "Paris is big. Paris is old. Paris is far."
    ids = tokenizer.encode(text)
    first_end = len(tokenizer.encode("Paris"))  # tokens up to the end of the first "Paris"
    second = text.index("Paris", 1)
    second_end = len(tokenizer.encode(text[:second + 5]))
    for min_tokens, kept in [(0, ""), (first_end, ""), (first_end + 1, text[:second]), (second_end, text[:second]),
                             (second_end + 1, text[:text.index("Paris", second + 1)]), (len(ids), text)]:
        params = SamplingParams(stop=["Paris"], min_tokens=min_tokens, max_tokens=len(ids),
                                output_kind=RequestOutputKind.DELTA)
        pieces, final, _ = _stream(tokenizer, ids, params)
        assert "".join(pieces) == kept, min_tokens
        assert final.outputs[0].finish_reason == ("length" if kept == text else "stop"), min_tokens
    # tokens coming several at once (speculative decoding's accepted runs) change nothing
    proc = OutputProcessor(tokenizer)
    processor = Processor(tokenizer, RequestLimits(vocab_size=len(tokenizer), max_model_len=4096), [])
    proc.add_request(processor.process("r", [1, 2, 3], SamplingParams(stop=["Paris"], min_tokens=first_end + 1,
                                                                      output_kind=RequestOutputKind.FINAL_ONLY)))
    results, _ = proc.process_outputs(EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="r", new_token_ids=ids)]))
    assert results[0][1].outputs[0].text == text[:second]


def test_partial_stop_string_is_held_back_then_released(tokenizer):
    text = "abc ST and STO but never the word"
    ids = tokenizer.encode(text)
    pieces, final, _ = _stream(tokenizer, ids, SamplingParams(stop=["STOP"], output_kind=RequestOutputKind.DELTA))
    assert "".join(pieces) == text
    assert final.outputs[0].finish_reason == "length"


def test_cumulative_and_final_only(tokenizer):
    ids = tokenizer.encode(TEXTS[0])
    pieces, final, _ = _stream(tokenizer, ids, SamplingParams(output_kind=RequestOutputKind.CUMULATIVE))
    assert pieces[-1] == TEXTS[0] and all(TEXTS[0].startswith(p) for p in pieces)
    pieces, final, _ = _stream(tokenizer, ids, SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY))
    assert pieces == [TEXTS[0]]
