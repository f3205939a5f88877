"""The HF folder `nvllm bench cpu` hands vLLM: any folder other than a GGUF import is passed as it is (the import's
dequantized folder: tests/integration/benchmarks/test_bench_dense_folder.py)."""

import pytest

from benchmarks.torch_side.dense_folder import dense_folder

pytestmark = pytest.mark.unit


def test_an_hf_folder_is_passed_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert dense_folder(str(tmp_path)) == str(tmp_path)
