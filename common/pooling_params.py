"""Embeddings (`--runner pooling`): how the engine pools a prompt's final hidden states, and what one request asks.

vLLM's names: `--pooler-config '{"pooling_type": "LAST", "normalize": true}'` for the engine, PoolingParams
(`dimensions`, `normalize`) per request. LAST pools the prompt's last position (decoder embedding models such as
Qwen3-Embedding), MEAN averages every position, CLS takes the first.
"""


import msgspec

from common.json_config import read_json_config

RUNNERS = ("generate", "pooling")
POOLING_TYPES = ("LAST", "MEAN", "CLS")


class PoolerConfig(msgspec.Struct, omit_defaults=True, kw_only=True, forbid_unknown_fields=True):
    """How a pooling engine turns a prompt's final (normed) hidden states into one vector."""
    pooling_type: str = "LAST"
    normalize: bool = True  # L2-normalise the pooled vector (a request may say otherwise)

    def validate(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooler_config.pooling_type must be one of {', '.join(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")


class PoolingParams(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True, forbid_unknown_fields=True):
    """What one embedding request asks: its vector's first `dimensions` values (Matryoshka models only; then
    renormalised), and whether to L2-normalise (None: the engine's pooler_config)."""
    dimensions: int | None = None
    normalize: bool | None = None


def parse_pooler_config(value) -> PoolerConfig | None:
    """A PoolerConfig from what a user gave (common/json_config.py). Raises ValueError naming the bad key."""
    config = read_json_config(value, PoolerConfig, "pooler_config")
    if config is not None:
        config.validate()
    return config
