"""The pooler on its own (chunks give the whole prompt's vector bit for bit; a chunk at position 0 starts afresh;
truncation then normalisation), the pooler config's parsing, and the request checks of a pooling engine."""

import struct

import pytest
import torch
from msgspec.structs import replace

from common.errors import InvalidParameter
from common.limits import RequestLimits
from common.pooling_params import PoolingParams, parse_pooler_config
from common.wire_messages import EngineCoreRequest
from common.sampling_params import SamplingParams
from common.validation import check_request
from engine_core.pooling.pooler import Pooler

pytestmark = pytest.mark.unit

ROWS = torch.randn(45, 8, generator=torch.Generator().manual_seed(1))


def vector(data: bytes) -> torch.Tensor:
    return torch.tensor(struct.unpack(f"<{len(data) // 4}f", data))


def run(pooling_type: str, chunks: list[int], params=PoolingParams(normalize=False)) -> bytes:
    pooler = Pooler(parse_pooler_config({"pooling_type": pooling_type}))
    start, out = 0, None
    for size in chunks:
        assert out is None  # nothing before the prompt's last chunk
        out = pooler.add_chunk("r", params, start, len(ROWS), ROWS[start:start + size])
        start += size
    assert pooler.partial == {}
    return out


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_chunks_give_the_whole_prompts_vector_bit_for_bit(pooling_type):
    whole = run(pooling_type, [45])
    assert run(pooling_type, [16, 16, 13]) == whole == run(pooling_type, [1, 7, 30, 7])
    expected = {"LAST": ROWS[-1], "MEAN": ROWS.double().mean(0).float(), "CLS": ROWS[0]}[pooling_type]
    assert torch.allclose(vector(whole), expected, atol=1e-6)


def test_a_chunk_at_position_0_starts_afresh():
    pooler = Pooler(parse_pooler_config({"pooling_type": "MEAN"}))
    params = PoolingParams(normalize=False)
    assert pooler.add_chunk("r", params, 0, 45, ROWS[:16]) is None
    assert pooler.add_chunk("r", params, 0, 45, ROWS[:20]) is None  # preempted and recomputed from the front
    assert pooler.add_chunk("r", params, 20, 45, ROWS[20:]) == run("MEAN", [45])
    pooler.add_chunk("gone", params, 0, 45, ROWS[:16])
    pooler.forget("gone")
    assert pooler.partial == {}


def test_truncation_then_normalisation():
    full = vector(run("LAST", [45]))
    short = vector(run("LAST", [45], PoolingParams(dimensions=3)))
    assert torch.allclose(short, torch.nn.functional.normalize(full[:3], dim=0), atol=1e-6)
    assert vector(run("LAST", [45], PoolingParams())).norm().item() == pytest.approx(1.0, abs=1e-6)


def test_pooler_config_parsing():
    assert parse_pooler_config('{"pooling_type": "MEAN", "normalize": false}').normalize is False
    assert parse_pooler_config(None) is None
    for bad, message in [('{"pooling_type": "MAX"}', "pooling_type must be one of LAST, MEAN, CLS"),
                         ('{"pooling": "LAST"}', "pooler_config: Object contains unknown field `pooling`"),
                         ("[1]", "must be a JSON object"), ("{", "not valid JSON")]:
        with pytest.raises(ValueError, match=message):
            parse_pooler_config(bad)


def request(pooling: PoolingParams | None, **kw) -> EngineCoreRequest:
    return EngineCoreRequest(request_id="r", prompt_token_ids=[5] * 8, sampling_params=SamplingParams(**kw),
                             pooling_params=pooling)


POOLING = RequestLimits(vocab_size=100, max_model_len=8, runner="pooling", embedding_size=64)


def test_request_checks_of_a_pooling_engine():
    check_request(request(PoolingParams()), POOLING)  # a prompt may fill max_model_len
    cases = [
        (request(None), POOLING, "model", "served for embeddings"),
        (request(PoolingParams()), RequestLimits(vocab_size=100, max_model_len=16), "model", "not served for embeddings"),
        (request(PoolingParams(), prompt_logprobs=1), POOLING, "pooling_params", "samples nothing"),
        (request(PoolingParams(dimensions=8)), POOLING, "dimensions", "does not support Matryoshka"),
        (request(PoolingParams(dimensions=8)), replace(POOLING, matryoshka=True, matryoshka_dimensions=(16, 32)),
         "dimensions", "one of the model's matryoshka_dimensions [16, 32]"),
        (request(PoolingParams(dimensions=65)), replace(POOLING, matryoshka=True), "dimensions", "from 1 to 64"),
    ]
    for req, limits, param, message in cases:
        with pytest.raises(InvalidParameter, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
            check_request(req, limits)
        assert e.value.param == param
    too_long = EngineCoreRequest(request_id="r", prompt_token_ids=[5] * 9, sampling_params=SamplingParams(),
                                 pooling_params=PoolingParams())
    with pytest.raises(InvalidParameter, match="prompt has 9 tokens, more than max_model_len 8"):
        check_request(too_long, POOLING)
