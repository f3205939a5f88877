"""Real models of the bench catalogue, from the cache that `nvllm bench models fetch` fills (skips where absent)."""

import pytest

NEAR_TIE = 0.5  # logprob gap where kept and dequantized may pick differently (8-bit activation rounding)


def cached_real_model(name: str) -> str:
    """The path of the catalogue's model `name` in the cache; skips, saying how to fetch it, where it is not."""
    from benchmarks.models.fetch import default_dest, is_cached, model_path
    from benchmarks.models.catalogue import find

    model = find(name)
    path = model_path(model, default_dest())
    if not is_cached(model, default_dest()):
        pytest.skip(f"{name} is not cached at {path}: `nvllm bench models fetch {name}` fetches it "
                    f"({model.size // 1_000_000} MB)")
    return path
