"""What the engine needs to know about a model folder, read from its config.json.

Read as plain JSON (not through transformers' config classes) so field renames across
transformers versions, such as rope_theta moving into rope_parameters, are handled here once.
"""

import json
import os

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def read_hf_config(folder: str) -> dict:
    """config.json with the fields the engine reads normalised and defaulted (plain JSON values only;
    engine_config.ModelConfig holds it and makes the namespace the model classes take)."""
    with open(os.path.join(folder, "config.json")) as f:
        raw = json.load(f)
    if "text_config" in raw:  # multimodal wrappers: the language model's part
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
    rope = raw.get("rope_parameters") or {}
    raw.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if raw.get("rope_theta") is None:
        raw["rope_theta"] = rope.get("rope_theta", 10000.0)
    if "partial_rotary_factor" in rope:  # where the rope type is default, only here
        raw.setdefault("partial_rotary_factor", rope["partial_rotary_factor"])
    scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    raw["rope_scaling"] = scaling
    raw.setdefault("rms_norm_eps", 1e-6)
    raw.setdefault("max_position_embeddings", 2048)
    if "num_attention_heads" in raw:  # else not a decoder nvllm runs: families/catalog.py says so by name
        raw.setdefault("num_key_value_heads", raw["num_attention_heads"])
        if not raw.get("head_dim"):
            raw["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
    return raw


def eos_token_ids(folder: str, hf_config: dict) -> list[int]:
    """EOS ids from generation_config.json (what generate() stops on), else config.json."""
    ids = None
    path = os.path.join(folder, "generation_config.json")
    if os.path.exists(path):
        with open(path) as f:
            ids = json.load(f).get("eos_token_id")
    if ids is None:
        ids = hf_config.get("eos_token_id")
    if ids is None:
        return []
    return list(ids) if isinstance(ids, list) else [ids]


def read_tokenizer_files(folder: str) -> dict[str, str]:
    """The tokenizer files' text, sent to frontends so they need no copy of the model."""
    files = {}
    for name in TOKENIZER_FILES:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                files[name] = f.read()
    return files
