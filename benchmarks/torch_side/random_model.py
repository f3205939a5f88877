"""Random-weight models of a real model's shape, for benchmarks and GPU tests (`nvllm bench throughput
--random-model`): an HF folder in bfloat16, seed 0, with the default model's tokenizer (SmolLM2's: token ids
up to 49151), written once into <cache>/models/random-NAME and reused after."""

import json
import os
import shutil
import tempfile

import torch

from engine_core.weights.model_folder import TOKENIZER_FILES
from common.cache_dir import cache_dir
from common.random_models import RANDOM_MODELS
from engine_core.weights.model_resolver import resolve_model


def random_model_folder(name: str, root: str | None = None, **overrides) -> str:
    """An HF folder with a random-weight model of RANDOM_MODELS[name] (fields replaced by overrides),
    bfloat16, seed 0, and the default model's tokenizer. Written once (to a temporary folder that is
    then renamed), reused after."""
    fields = RANDOM_MODELS[name] | overrides
    suffix = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    folder = os.path.join(root or os.path.join(cache_dir(), "models"), f"random-{name}{suffix}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".random-{name}-", dir=os.path.dirname(folder))
    try:
        _write_random_model(tmp, fields)
        os.replace(tmp, folder)
    except OSError:
        if not os.path.exists(os.path.join(folder, "config.json")):  # not another process winning the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_random_model(folder: str, fields: dict) -> None:
    import transformers

    fields = dict(fields)
    config_class, model_class = getattr(transformers, fields.pop("config")), getattr(transformers, fields.pop("model"))
    config = config_class(bos_token_id=1, eos_token_id=2, **fields)
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer_dir = resolve_model(None)
    for file in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer_dir, file)):
            shutil.copy(os.path.join(tokenizer_dir, file), folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)
