"""Import a GGUF file once into an HF-style folder (config.json, tokenizer files and the weights), cached, so a
later start reads it directly. Supported GGUF architectures: llama (SmolLM2, Llama, Mistral-as-llama; with experts,
Mixtral), qwen2, qwen3, qwen2moe, qwen3moe and phi3 (Phi-3, Phi-4-mini: its fused attn_qkv and ffn_up (gate;up) are
split into the HF pieces, its rope_factors_long / rope_factors_short tensors become LongRoPE's rope_scaling)
gemma2 and gemma3 (Gemma 2, and Gemma 3's text model: weights/gguf_gemma.py).

Mixture-of-experts layers: llama.cpp stores each kind of expert weight as one 3-D tensor (blk.N.ffn_{gate,up,
down}_exps, [experts, rows, columns] in HF order); each expert's slice of it is imported as that expert's own
tensor (model.layers.N.mlp.experts.E.*), kept quantized like any other, so experts load as HF's per-expert names.

Weights: the tensors of the types the quantized kernels take (cpu_kernels/linear/gguf_types.py: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) are written as the file has them, blocks untouched (QUANTIZED_FILE, safetensors
format, {name: type} in its metadata); weights/quantized.py keeps them quantized in memory, and weights/loader.py dequantizes them
where a layer needs floats (`--quantization none`). Every other tensor (norms, biases, types no kernel takes) is
dequantized once and written to model.safetensors: float32, which keeps the import exact (every dequantized
value is exactly a float32, most are not a bfloat16), or bfloat16 where float32 would exceed FLOAT32_LIMIT_BYTES.
Both files are written one tensor at a time (weights/safetensors_stream.py): a multi-GB file imports holding one
tensor in memory, and what is not kept is logged by type with what it costs.

llama.cpp's converter permutes the rows of the llama q/k projections so that each head's rotary pairs
are interleaved (GPT-J style) instead of split in halves (NeoX style, what HF uses). For the llama
architecture we undo that here (whole rows of blocks move), so the weights equal what transformers loads from the
same GGUF. Qwen2/Qwen3 GGUFs are converted without the permutation and are copied as they are.
"""

import json
import logging
import math
import os
import shutil
import tempfile
import time

import numpy as np
import torch

from engine_core.families.catalog import FAMILIES, LLAMA, MISTRAL, family_for_gguf
from engine_core.families.family import Family
from engine_core.cpu_kernels.linear.gguf_types import GGUF_TYPES
from engine_core.families.gemma import GEMMA2_PATTERN, GEMMA3_PATTERN, LOCAL_THETA
from engine_core.weights.gguf_gemma import GEMMA_BLOCK_NAMES, NORM_SHIFT, gemma_fields
from engine_core.weights.gguf_keys import check_keys
from engine_core.weights.loader import QUANTIZED_FILE
from engine_core.weights.safetensors_stream import write_streamed

logger = logging.getLogger("nvllm")

MARKER_FILE = ".nvllm-import.json"  # written last: its presence means the folder is complete
IMPORT_FORMAT = 4  # bump when the layout of imported folders changes, so old imports are redone
KEPT_TYPES = {name.upper(): name for name in GGUF_TYPES}  # the types the quantized kernels take
FLOAT32_LIMIT_BYTES = 8 << 30
SHARD_BYTES = 4 << 30

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",  # phi3: q;k;v rows fused (split at import: _split)
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the MoE router
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",  # Qwen2-MoE's shared expert and its gate
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# 3-D tensors of every expert of a layer -> the projection each expert's slice is
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# tensors llama.cpp adds that HF checkpoints do not have
_SKIPPED = {"rope_freqs.weight"}
# phi3's LongRoPE factors: read into config.json's rope_scaling, not weights
_ROPE_FACTORS = {"rope_factors_long.weight": "long_factor", "rope_factors_short.weight": "short_factor"}


# architectures whose blocks name some tensors otherwise (Gemma's four norms a layer)
_ARCH_BLOCK_NAMES = {"gemma2": GEMMA_BLOCK_NAMES, "gemma3": GEMMA_BLOCK_NAMES}
# architectures whose converter adds a constant to every norm weight (*norm.weight): the import subtracts it
_NORM_SHIFTS = {"gemma2": NORM_SHIFT, "gemma3": NORM_SHIFT}


def hf_tensor_name(gguf_name: str, arch: str | None = None) -> str | None:
    """HF Llama/Qwen name of a GGUF tensor name ('blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight');
    `arch` (general.architecture) picks that architecture's own block names where it has them."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    names = _BLOCK_NAMES | _ARCH_BLOCK_NAMES.get(arch, {})
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    return None


def hf_expert_names(gguf_name: str, experts: int) -> list[str] | None:
    """The HF names of each expert's slice of a GGUF expert tensor ('blk.3.ffn_up_exps.weight' ->
    ['model.layers.3.mlp.experts.0.up_proj.weight', ...]); None for any other tensor."""
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _EXPERT_NAMES or parts[3] != "weight":
        return None
    return [f"model.layers.{parts[1]}.mlp.experts.{e}.{_EXPERT_NAMES[parts[2]]}.weight" for e in range(experts)]


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's permute(): rows of each head go from interleaved rotary pairs back to halves.

    llama.cpp stores W.reshape(n, 2, d/2, ...).swapaxes(1, 2); this is its inverse."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Metadata:
    """Typed access to a GGUFReader's key/value fields."""

    def __init__(self, reader):
        self.fields = reader.fields

    def get(self, key, default=None):
        field = self.fields.get(key)
        if field is None:
            return default
        if hasattr(field, "contents"):
            return field.contents()
        # older gguf: decode by hand
        values = [field.parts[i] for i in field.data]
        out = [bytes(v).decode("utf-8") if v.dtype == np.uint8 else v.tolist()[0] for v in values]
        return out[0] if len(out) == 1 else out


def _build_config(meta: _Metadata, arch: str, family: Family, tensor_names: set[str], vocab_rows: int,
                  dtype: torch.dtype) -> dict:
    def key(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    # llama.cpp's converter writes Mistral checkpoints as "llama" with no window key (and llama.cpp's llama graph
    # reads none): such a file imports as Llama, every layer attending to all keys, as llama.cpp runs it. A llama
    # file that does name a window is Mistral's (or, with experts, Mixtral's) every-layer window, as a phi3 file's is
    # Phi-3's; another family's would need to say which layers slide, which no key here does
    own = family.name in ("gemma2", "gemma3")  # their windows and rotary bases are their own (gemma_fields)
    window = None if own else key("attention.sliding_window")
    if window:
        if family is LLAMA:
            family = MISTRAL
        elif family.windows != "every_layer":
            raise ValueError(f"the GGUF names {arch}.attention.sliding_window = {window}, which nvllm reads for "
                             "families whose every layer slides (llama: Mistral, Mixtral; phi3) only")

    hidden = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    n_kv = key("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):  # per-layer counts: all equal for the supported architectures
        n_kv = max(n_kv)
    partial = "partial_rotary_factor" in family.reads  # phi3: rope.dimension_count is the rotated dims only
    head_dim = key("attention.key_length") or (None if partial else key("rope.dimension_count")) or hidden // n_heads
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (len(tokens) if tokens else vocab_rows)
    config = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length") or key("expert_feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(n_kv),
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    # the bias fields the family's config has (families/catalog.py), from the tensors the file holds
    if "attention_bias" in family.reads:
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    if "mlp_bias" in family.reads:
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    config |= _moe_config(meta, arch, family, tensor_names)
    if window:
        config["sliding_window"] = int(window)
    rope_scaling = _rope_scaling(meta, arch)
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    if partial:
        config.update(_phi3_fields(meta, arch, int(head_dim)))
    if own:
        config = gemma_fields(arch, config, key)
    for name in ("bos", "eos", "padding"):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config["pad_token_id" if name == "padding" else f"{name}_token_id"] = int(token_id)
    return config


def _moe_config(meta: _Metadata, arch: str, family: Family, tensor_names: set[str]) -> dict:
    """The MoE fields of the family's config.json (families/moe_fields.py), from llama.cpp's expert keys."""
    if family.moe is None:
        return {}
    layers = int(meta.get(f"{arch}.block_count"))
    config = {"num_experts_per_tok": int(meta.get(f"{arch}.expert_used_count"))}
    experts = int(meta.get(f"{arch}.expert_count"))
    if family.moe == "mixtral":
        return config | {"num_local_experts": experts}
    # llama.cpp's graphs renormalise Qwen3-MoE's top-k weights and never Qwen2-MoE's (expert_weights_norm is not
    # read for either: gguf_keys.py)
    config |= {"num_experts": experts, "norm_topk_prob": family.name == "qwen3_moe",
               "moe_intermediate_size": int(meta.get(f"{arch}.expert_feed_forward_length")),
               # a layer without a router keeps a dense MLP (llama.cpp's own files have none)
               "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensor_names]}
    if "shared_expert_intermediate_size" in family.reads:
        config["shared_expert_intermediate_size"] = int(meta.get(f"{arch}.expert_shared_feed_forward_length", 0))
    return config


def _rope_scaling(meta: _Metadata, arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind is None and meta.get(f"{arch}.rope.scale_linear") is not None:  # older GGUFs
        kind, factor = "linear", meta.get(f"{arch}.rope.scale_linear")
    if kind in (None, "none") or not factor:
        return None
    scaling = {"rope_type": kind, "factor": float(factor)}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original:
        scaling["original_max_position_embeddings"] = int(original)
    if kind == "yarn":  # llama.cpp's YaRN ramp bounds, where the file names them (transformers' defaults if not)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            value = meta.get(f"{arch}.rope.scaling.{gguf_key}")
            if value:
                scaling[hf_key] = float(value)
    return scaling


def _phi3_fields(meta: _Metadata, arch: str, head_dim: int) -> dict:
    """Phi-3's own config fields from llama.cpp's phi3 metadata (its converter's keys): the rotated share of
    each head, the original context, the window (0: none, Phi-4-mini). Its LongRoPE factors are tensors
    (_longrope_scaling)."""
    rotary = meta.get(f"{arch}.rope.dimension_count") or head_dim
    fields = {"partial_rotary_factor": int(rotary) / head_dim}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original:
        fields["original_max_position_embeddings"] = int(original)
    window = meta.get(f"{arch}.attention.sliding_window")
    fields["sliding_window"] = int(window) if window else None
    return fields


def _longrope_scaling(meta: _Metadata, arch: str, factors: dict[str, list[float]]) -> dict:
    """phi3's rope_factors_long / rope_factors_short tensors as rope_scaling, with the file's attention factor."""
    scaling = {"rope_type": "longrope", **factors}
    attention = meta.get(f"{arch}.rope.scaling.attn_factor")
    if attention is not None:
        scaling["attention_factor"] = float(attention)
    return scaling


def _facts(meta: _Metadata, arch: str, config: dict) -> dict:
    """The values gguf_keys.check_keys holds the file's other keys to: what this import runs."""
    head_dim = config["head_dim"]
    return {"hidden": config["hidden_size"], "head_dim": head_dim,
            # Phi-3 rotates the leading rope.dimension_count dims of each head (its config's partial_rotary_factor)
            "rotary_dim": meta.get(f"{arch}.rope.dimension_count") if arch == "phi3" else head_dim,
            "window_pattern": {"gemma2": GEMMA2_PATTERN, "gemma3": GEMMA3_PATTERN}.get(arch),
            "local_theta": LOCAL_THETA if arch == "gemma3" else config.get("rope_theta"),
            "final_softcap": config.get("final_logit_softcapping") or 0.0}


def _eos_ids(meta: _Metadata) -> list[int]:
    ids = []
    for name in ("eos", "eot", "eom"):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))
    return ids


def _write_tokenizer(gguf_path: str, out_dir: str, file_template: str | None, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template), chat_template.jinja,
    special_tokens_map.json, built by transformers from the GGUF's tokenizer metadata."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as e:
        raise ValueError(f"could not build a tokenizer from the metadata of {gguf_path}: {type(e).__name__}: {e}") from e
    tokenizer.save_pretrained(out_dir)
    template = file_template or getattr(tokenizer, "chat_template", None)

    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        tok_config = json.load(f)
    for noise in ("is_local", "local_files_only", "_commit_hash", "name_or_path"):
        tok_config.pop(noise, None)
    if tok_config.get("tokenizer_class") == "TokenizersBackend":  # transformers 5's name; 4.x knows this one
        tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # transformers saves a huge model_max_length meaning "unknown"; the GGUF knows the context length
    tok_config["model_max_length"] = max_length
    if template:
        # transformers 5 keeps the template in chat_template.jinja; older readers look in tokenizer_config.json
        tok_config["chat_template"] = template
        with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)

    special = {}
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            special[attr] = str(value)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)


_FLOAT_TYPES = {"F32", "F16", "BF16"}


class _Tensor:
    """One GGUF tensor's way into the import: its HF name, and whether it stays quantized (its blocks, as they
    are, go to QUANTIZED_FILE) or is written as floats."""

    def __init__(self, tensor, name: str, heads: int | None, path: str, expert: int | None = None,
                 shape: tuple[int, ...] | None = None, rows: tuple[int, int] | None = None, shift: float = 0.0):
        """expert: this is that expert's slice of a 3-D expert tensor; shape: the HF shape where it differs from
        the file's (Qwen2-MoE's shared expert gate, a vector in the file, a [1, hidden] matrix in HF); rows:
        (first, count), where this is those rows of a fused GGUF tensor (phi3's attn_qkv, ffn_up); shift: what the
        converter added to every value (Gemma's norms: 1), subtracted from the values."""
        self.tensor, self.name, self.heads, self._path, self.expert, self.rows = tensor, name, heads, path, expert, rows
        self.shift = shift
        self.type = tensor.tensor_type.name
        self.kept = self.type in KEPT_TYPES and not shift  # a shifted tensor is written as its values
        self.shape = tuple(int(d) for d in reversed(tensor.shape))  # the HF shape of its values
        self.block_shape = tuple(int(d) for d in tensor.data.shape)  # the reader's view of its bytes
        self._read_bytes = int(tensor.n_bytes)  # what _read reads: the whole tensor, or one expert's slice
        if expert is not None:
            self.shape, self.block_shape = self.shape[1:], self.block_shape[1:]
            self._read_bytes //= int(tensor.data.shape[0])
        self._read_shape = self.block_shape
        self.nbytes = self._read_bytes  # this piece's bytes in the file
        if shape is not None:
            self.shape = shape
        if rows is not None:
            self.nbytes = self._read_bytes * rows[1] // self.block_shape[0]
            self.shape, self.block_shape = (rows[1], *self.shape[1:]), (rows[1], *self.block_shape[1:])

    def blocks(self) -> torch.Tensor:
        """The quantized rows uint8 [rows, row bytes], un-permuted where llama.cpp permuted them."""
        rows = self._mine(self._read())
        return torch.from_numpy(unpermute_qk(rows, self.heads) if self.heads else rows)

    def values(self) -> torch.Tensor:
        """The dequantized values float32, in the HF shape, un-permuted."""
        from gguf.quants import dequantize

        w = self._mine(np.array(dequantize(self._read(), self.tensor.tensor_type), dtype=np.float32, copy=False))
        w = np.ascontiguousarray(unpermute_qk(w, self.heads) if self.heads else w)
        if self.shift:
            w = w - np.float32(self.shift)
        return torch.from_numpy(w.reshape(self.shape))

    def _mine(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.rows is None else np.ascontiguousarray(rows[self.rows[0]:self.rows[0] + self.rows[1]])

    def _read(self) -> np.ndarray:
        """The tensor's data as the reader's view has it (dtype, shape), read from the file into memory of its
        own: not through the reader's memory map, whose pages would stay resident (a 4 GB file, 4 GB)."""
        view = self.tensor.data
        data = bytearray(self._read_bytes)
        with open(self._path, "rb") as f:
            f.seek(int(self.tensor.data_offset) + (self.expert or 0) * self._read_bytes)
            if f.readinto(data) != len(data):
                raise ValueError(f"{self._path} is truncated: tensor {self.tensor.name!r} is cut short")
        return np.frombuffer(data, dtype=view.dtype).reshape(self._read_shape)

def _split(tensor, name: str, config: dict, path: str) -> list[_Tensor] | None:
    """A fused GGUF tensor (llama.cpp's phi3: attn_qkv holds q;k;v rows, ffn_up gate;up) as the HF pieces the
    model loads (q_proj, k_proj, v_proj; gate_proj, up_proj), each its rows of the file's: whole rows, so kept
    blocks stay blocks. None for a tensor that is not fused."""
    head_rows = config["head_dim"]
    if name.endswith(".qkv_proj.weight"):
        sizes = [("q_proj", config["num_attention_heads"] * head_rows),
                 ("k_proj", config["num_key_value_heads"] * head_rows),
                 ("v_proj", config["num_key_value_heads"] * head_rows)]
        stem = name.removesuffix("qkv_proj.weight")
    elif name.endswith(".mlp.up_proj.weight") and int(tensor.shape[-1]) == 2 * config["intermediate_size"]:
        sizes = [("gate_proj", config["intermediate_size"]), ("up_proj", config["intermediate_size"])]
        stem = name.removesuffix("up_proj.weight")
    else:
        return None
    pieces, first = [], 0
    for piece, count in sizes:
        pieces.append(_Tensor(tensor, f"{stem}{piece}.weight", None, path, rows=(first, count)))
        first += count
    return pieces


def _rope_factors(reader) -> dict[str, list[float]]:
    return {_ROPE_FACTORS[t.name]: [float(v) for v in np.asarray(t.data, dtype=np.float32).reshape(-1)]
            for t in reader.tensors if t.name in _ROPE_FACTORS}


def _tensors(reader, arch: str, family: Family, config: dict) -> list[_Tensor]:
    permuted = family.gguf_qk_permuted
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    out = []
    for tensor in reader.tensors:
        if tensor.name in _ROPE_FACTORS:
            continue
        if tensor.name in _SKIPPED:
            logger.warning("GGUF import: skipping %s (llama.cpp-only tensor)", tensor.name)
            continue
        experts = hf_expert_names(tensor.name, int(tensor.shape[-1]))
        if experts is not None:
            out += [_Tensor(tensor, name, None, reader.data.filename, expert=e) for e, name in enumerate(experts)]
            continue
        name = hf_tensor_name(tensor.name, arch)
        if name is None:
            raise ValueError(f"GGUF tensor {tensor.name!r} of architecture {arch!r} has no HF Llama/Qwen name; "
                             "this GGUF is not supported")
        pieces = _split(tensor, name, config, reader.data.filename)
        if pieces is not None:
            out += pieces
            continue
        heads = None
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            heads = n_heads if "q_proj" in name else n_kv
        shape = (1, int(tensor.shape[0])) if name.endswith("shared_expert_gate.weight") else None
        shift = _NORM_SHIFTS.get(arch, 0.0) if name.endswith("norm.weight") else 0.0
        out.append(_Tensor(tensor, name, heads, reader.data.filename, shape=shape, shift=shift))
    return out


def _log_types(path: str, tensors: list[_Tensor], dtype: torch.dtype) -> None:
    """What stays quantized, and what is dequantized that a kernel could have kept (with what it costs)."""
    kept = [t for t in tensors if t.kept]
    kept_bytes = sum(t.nbytes for t in kept)
    counts: dict[str, int] = {}
    for t in kept:
        counts[t.type] = counts.get(t.type, 0) + 1
    logger.info("GGUF import of %s: %d tensors kept quantized as the file has them (%s; %.1f MB)",
                os.path.basename(path), len(kept), ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none",
                kept_bytes / 1e6)
    lost: dict[str, list[_Tensor]] = {}
    for t in tensors:
        if not t.kept and t.type not in _FLOAT_TYPES:
            lost.setdefault(t.type, []).append(t)
    size = torch.empty(0, dtype=dtype).element_size()
    for kind, group in sorted(lost.items()):
        file_bytes = sum(t.nbytes for t in group)
        values = sum(math.prod(t.shape) for t in group)
        logger.warning("GGUF import of %s: %d %s tensors dequantized (no kernel keeps %s; it keeps %s): %.1f MB in "
                       "the file become %.1f MB of %s, read on every decode step", os.path.basename(path), len(group),
                       kind, kind, ", ".join(KEPT_TYPES), file_bytes / 1e6, values * size / 1e6,
                       str(dtype).removeprefix("torch."))


def _write_weights(tensors: list[_Tensor], out_dir: str, dtype: torch.dtype) -> int:
    """Writes the kept tensors' blocks (QUANTIZED_FILE) and every other tensor dequantized in `dtype` (shards of
    at most SHARD_BYTES), one tensor at a time: never more than one in memory. Returns the number written."""
    kept = [t for t in tensors if t.kept]
    if kept:
        write_streamed(os.path.join(out_dir, QUANTIZED_FILE),
                       [(t.name, torch.uint8, t.block_shape, t.blocks) for t in kept],
                       metadata={t.name: KEPT_TYPES[t.type] for t in kept})
    floats = [t for t in tensors if not t.kept]
    size = torch.empty(0, dtype=dtype).element_size()
    shards: list[list[_Tensor]] = [[]]
    shard_bytes = 0
    for t in floats:
        nbytes = math.prod(t.shape) * size
        if shards[-1] and shard_bytes + nbytes > SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(t)
        shard_bytes += nbytes
    files = (["model.safetensors"] if len(shards) == 1
             else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for file, shard in zip(files, shards):
        write_streamed(os.path.join(out_dir, file), [(t.name, dtype, t.shape, t.values) for t in shard],
                       metadata={"format": "pt"})
    if len(shards) > 1:
        weight_map = {t.name: file for file, shard in zip(files, shards) for t in shard}
        total = sum(math.prod(t.shape) * size for t in floats)
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return len(tensors)


def _check_complete(reader, meta: _Metadata, path: str) -> None:
    """Refuses, before anything is written, a file cut short or without a tokenizer, naming the file."""
    size = os.path.getsize(path)
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise ValueError(f"{path} is truncated: tensor {tensor.name!r} ends at byte {end}, the file has {size} "
                             "bytes (an interrupted download? fetch it again)")
    if meta.get("tokenizer.ggml.tokens") is None or meta.get("tokenizer.ggml.model") is None:
        raise ValueError(f"{path} has no tokenizer in its metadata (tokenizer.ggml.model / tokenizer.ggml.tokens); "
                         "nvllm serves a GGUF with its tokenizer")


def import_gguf(gguf_path: str, out_dir: str, dtype: torch.dtype | None = None) -> str:
    """Convert `gguf_path` into the HF folder `out_dir` and return `out_dir`.

    Written into a temporary sibling folder, completed by a marker file, then renamed into place, so a
    crash never leaves a half folder at `out_dir`. If `out_dir` already holds a complete import it is kept.
    dtype None: float32, or bfloat16 when the float32 copy would exceed FLOAT32_LIMIT_BYTES."""
    from gguf import GGUFReader

    start = time.perf_counter()
    gguf_path = os.path.abspath(gguf_path)
    out_dir = os.path.abspath(out_dir)
    try:
        reader = GGUFReader(gguf_path)
    except (ValueError, KeyError, IndexError, OSError) as e:  # a bad magic, an unknown type, a header cut short
        if "cannot reshape array" in str(e):  # gguf-py's words for a tensor that runs past the end of the file
            raise ValueError(f"{gguf_path} is truncated: its tensors run past the end of the file "
                             f"({os.path.getsize(gguf_path)} bytes; an interrupted download? fetch it again)") from e
        raise ValueError(f"{gguf_path} is not a GGUF file nvllm can read: {type(e).__name__}: {e}") from e
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    family = family_for_gguf(arch, bool(meta.get(f"{arch}.expert_count")))
    if family is None:
        raise ValueError(f"GGUF architecture {arch!r} of {gguf_path} is not supported; "
                         f"nvllm imports {', '.join(dict.fromkeys(f.gguf_architecture for f in FAMILIES if f.gguf_architecture))} GGUFs")
    _check_complete(reader, meta, gguf_path)
    tensor_names = {t.name for t in reader.tensors}
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    config = _build_config(meta, arch, family, tensor_names, int(embed.shape[-1]), torch.float32)
    keys = [key for key in reader.fields if not key.startswith("GGUF.")]  # GGUF.*: the header's own fields
    check_keys(keys, meta.get, arch, _facts(meta, arch, config))
    factors = _rope_factors(reader)
    if factors:
        config["rope_scaling"] = _longrope_scaling(meta, arch, factors)
    tensors = _tensors(reader, arch, family, config)
    if dtype is None:  # the floats written: what is not kept quantized
        n_params = sum(math.prod(t.shape) for t in tensors if not t.kept)
        dtype = torch.float32 if n_params * 4 <= FLOAT32_LIMIT_BYTES else torch.bfloat16
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    _log_types(gguf_path, tensors, dtype)

    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        count = _write_weights(tensors, tmp, dtype)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        generation = {k: config[k] for k in ("bos_token_id", "pad_token_id") if k in config}
        eos = _eos_ids(meta)
        if eos:
            generation["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(generation, f, indent=2)
        template = meta.get("tokenizer.chat_template")
        del reader, meta, tensors, embed  # the tokenizer's own read of the file comes next: one at a time
        _write_tokenizer(gguf_path, tmp, template, config["max_position_embeddings"])
        with open(os.path.join(tmp, MARKER_FILE), "w") as f:
            json.dump({"format": IMPORT_FORMAT, "source": gguf_path, "architecture": arch, "tensors": count,
                       "dtype": config["torch_dtype"], "seconds": round(time.perf_counter() - start, 2)}, f)
        # mkdtemp made the folder private; an import is a cache others (another user, a container) may read
        os.chmod(tmp, 0o755)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        if os.path.isdir(out_dir):
            if is_complete_import(out_dir):  # someone else finished first
                shutil.rmtree(tmp, ignore_errors=True)
                return out_dir
            if os.listdir(out_dir) and not os.path.exists(os.path.join(out_dir, MARKER_FILE)):
                raise FileExistsError(f"{out_dir} exists and is not an nvllm GGUF import; "
                                      "remove it or import into another folder")
            shutil.rmtree(out_dir)  # empty, or an import of an older format
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("imported %s (%s, %d tensors, %s) into %s in %.1f s", os.path.basename(gguf_path), arch, count,
                config["torch_dtype"], out_dir, time.perf_counter() - start)
    return out_dir


def is_complete_import(folder: str) -> bool:
    """True when `folder` holds a finished import of the current format."""
    try:
        with open(os.path.join(folder, MARKER_FILE)) as f:
            return json.load(f).get("format") == IMPORT_FORMAT
    except (OSError, ValueError):
        return False
