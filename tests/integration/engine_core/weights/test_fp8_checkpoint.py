"""FP8 block-quantized checkpoints (quant_method "fp8", as Qwen3's FP8 releases): each weight is dequantized at
load with its block's scale, so the engine runs the checkpoint's weights (rounded once to float32) and gives the
greedy tokens transformers gives on those weights; other FP8 layouts are refused, named."""

import json
import os
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from common.sampling_params import SamplingParams
from engine_core.families.catalog import read_spec
from engine_core.families.spec import UnsupportedConfig
from frontend.offline.llm import LLM

pytestmark = pytest.mark.integration

BLOCK = [32, 48]  # neither divides the tiny model's 64 inputs: partial blocks too
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": BLOCK}
PROMPTS = [[1, 504, 3458, 282, 4649, 314, 253], [1, 4237, 2593]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w as e4m3 per block, and each block's dequantizing factor (its largest |w| / 448)."""
    rows, columns = BLOCK
    q, scale = torch.empty(w.shape, dtype=torch.float8_e4m3fn), torch.empty(-(-w.shape[0] // rows),
                                                                           -(-w.shape[1] // columns))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            part = w[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns]
            scale[i, j] = part.abs().max() / 448
            q[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns] = (part / scale[i, j]).to(torch.float8_e4m3fn)
    return q, scale


def _dequantized(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The checkpoint's weights, each q x its block's factor: exact in float64, then rounded once to float32."""
    rows, columns = BLOCK
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        for j in range(q.shape[1]):
            out[i, j] = q[i, j].double() * scale[i // rows, j // columns].double()
    return out.float()


@pytest.fixture(scope="module")
def checkpoints(tiny_models, tmp_path_factory):
    """(an FP8 checkpoint of the tiny Qwen3, the same weights dequantized as a float32 folder)"""
    source = tiny_models["qwen3"]
    root = tmp_path_factory.mktemp("fp8")
    fp8, dense = str(root / "fp8"), str(root / "dense")
    shutil.copytree(source, fp8)
    shutil.copytree(source, dense)
    quantized, plain = {}, {}
    for name, w in load_file(os.path.join(source, "model.safetensors")).items():
        if name.endswith("_proj.weight"):  # the layers' linears; embeddings, norms and the head stay float
            q, scale = _quantize(w.float())
            quantized[name], quantized[name + "_scale_inv"], plain[name] = q, scale, _dequantized(q, scale)
        else:
            quantized[name] = plain[name] = w
    save_file(quantized, os.path.join(fp8, "model.safetensors"), metadata={"format": "pt"})
    save_file(plain, os.path.join(dense, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(fp8, "config.json")) as f:
        config = json.load(f) | {"quantization_config": FP8}
    with open(os.path.join(fp8, "config.json"), "w") as f:
        json.dump(config, f)
    return fp8, dense


def _answers(path: str):
    llm = LLM(path, dtype="float32", kv_cache_memory="16MiB", max_model_len=256, multiprocess=False)
    try:
        outs = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        return [(o.token_ids, [lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)]) for o in outs]
    finally:
        llm.shutdown()


def test_an_fp8_checkpoint_runs_its_weights_dequantized(checkpoints, caplog):
    fp8, dense = checkpoints
    with caplog.at_level("INFO", logger="engine_core.weights.fp8_blocks"):
        got = _answers(fp8)
    assert got == _answers(dense)  # the same weights to the bit: the same tokens and logprobs
    assert "FP8 checkpoint: 14 weights" in caplog.text and "dequantized at load" in caplog.text
    model = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    for prompt, (tokens, _) in zip(PROMPTS, got):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
        assert tokens == expected[0, len(prompt):].tolist()


@pytest.mark.parametrize("changes, named", [({"activation_scheme": "static"}, "static"),
                                            ({"weight_block_size": None}, "weight_block_size"),
                                            ({"fmt": "e5m2"}, "e5m2")])
def test_other_fp8_layouts_are_refused_naming_what_differs(checkpoints, changes, named):
    with open(os.path.join(checkpoints[0], "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = FP8 | changes
    with pytest.raises(UnsupportedConfig, match=named):
        read_spec(config)
