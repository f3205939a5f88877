"""The HF folder vLLM gets for a model nvllm serves: `python -m benchmarks.torch_side.dense_folder FOLDER` prints one
JSON line {"folder": ...}.

A folder nvllm imported from a GGUF file (<cache>/models/..., its blocks in weights.quantized) is not one vLLM
can read: its model.safetensors holds only the norms. For such a folder this writes, once, the GGUF file's
weights dequantized by transformers (`from_pretrained(..., gguf_file=...)`) and saved in bf16 beside it
(<folder>-bf16-hf), the weights vLLM's CPU build runs; any other folder is returned as it is.
"""

import json
import os
import sys


def dense_folder(folder: str) -> str:
    record = os.path.join(folder, ".nvllm-import.json")
    if not os.path.exists(record):
        return folder
    target = folder.rstrip("/") + "-bf16-hf"
    if os.path.exists(os.path.join(target, "config.json")):
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with open(record) as f:
        source = json.load(f)["source"]
    where, name = os.path.dirname(source), os.path.basename(source)
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.bfloat16)
    # a model loaded from GGUF refuses save_pretrained: the same weights in a plain model of the same config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantized.state_dict())
    partial = target + ".partial"
    model.save_pretrained(partial)
    AutoTokenizer.from_pretrained(where, gguf_file=name).save_pretrained(partial)
    os.replace(partial, target)
    return target


if __name__ == "__main__":
    print("RESULT " + json.dumps({"folder": dense_folder(sys.argv[1])}), flush=True)
