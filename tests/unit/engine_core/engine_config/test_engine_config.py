"""EngineConfig: EngineArgs resolved once, left as the user gave them, and sent to workers as msgpack."""

import re

import msgspec
import pytest

from common.config import EngineArgs
from engine_core.engine_config import EngineConfig, resolve_engine_config

pytestmark = pytest.mark.unit


def test_resolving_leaves_the_args_as_asked_and_fills_in_every_default(tiny_models):
    args = EngineArgs(model=tiny_models["llama"], device="cpu", kv_cache_memory="2MiB", usage="offline")
    before = msgspec.json.encode(args)
    config = resolve_engine_config(args)
    assert msgspec.json.encode(args) == before
    assert config.dtype in ("float32", "bfloat16") and config.device == "cpu"
    assert config.max_model_len == config.model.hf_config["max_position_embeddings"]
    assert config.max_num_batched_tokens == args.token_budget("cpu") and config.kv_cache_memory == 2 * 1024**2
    assert config.model.spec.hidden_size == config.model.hf_config["hidden_size"]
    assert config.parallel.is_single_process and config.draft_model is None


def test_the_config_survives_msgpack_and_a_local_model_path(tiny_models):
    config = resolve_engine_config(EngineArgs(model=tiny_models["llama"], device="cpu", max_model_len=64,
                                              speculative_config={"num_speculative_tokens": 2}))
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(config), type=EngineConfig)
    assert decoded == config
    moved = decoded.with_model_path("/elsewhere")
    assert moved.model.path == "/elsewhere" and moved.model.hf_config == config.model.hf_config


def test_max_model_len_beyond_the_model_is_refused(tiny_models):
    with pytest.raises(ValueError, match="max_model_len 1000000 exceeds the model's max_position_embeddings"):
        resolve_engine_config(EngineArgs(model=tiny_models["llama"], device="cpu", max_model_len=1_000_000))


def test_a_draft_model_gets_its_own_facts_and_the_targets_settings(tiny_models):
    args = EngineArgs(model=tiny_models["llama"], device="cpu", max_model_len=64,
                      speculative_config={"model": tiny_models["llama"], "num_speculative_tokens": 2})
    draft = resolve_engine_config(args).for_draft_model()
    assert draft.model.path == tiny_models["llama"] and draft.speculative_config is None
    assert draft.draft_model is None and draft.max_model_len == 64


@pytest.mark.parametrize("field, value, expected", [("batch_invariant", "False", "bool"), ("max_num_seqs", "8", "int"),
                                                    ("kv_cache_memory", 1.5, "int | str | null")])
def test_an_argument_of_the_wrong_type_is_refused_by_name_before_any_process_starts(field, value, expected):
    """LLM(batch_invariant="False") used to start the core, which died decoding its config."""
    from frontend.offline.llm import LLM
    with pytest.raises(ValueError, match=f"^{field}: Expected `{re.escape(expected)}`"):
        LLM(**{field: value})
