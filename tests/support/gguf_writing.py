"""GGUF files written here as llama.cpp writes them: its q/k permutation, tensors as they are or in Q8_0 blocks,
a tiny byte-level BPE tokenizer, and a whole random llama or qwen3 model."""

import numpy as np
import torch


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF q/k rows (to build GGUFs; the engine undoes it: unpermute_qk)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _bytes_to_unicode() -> list[str]:
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def add_tensor(writer, gguf_name: str, values: np.ndarray, q8: bool = False) -> None:
    """One tensor into a GGUF being written: as it is (float32), or its Q8_0 blocks where `q8`."""
    import gguf

    values = np.ascontiguousarray(values)
    if q8:
        blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(gguf_name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        writer.add_tensor(gguf_name, values)


def add_tiny_tokenizer(writer) -> int:
    """A byte-level BPE vocabulary of 3 special tokens + 256 bytes + 2 merges; returns its size."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _bytes_to_unicode() + ["he", "ll"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}")
    return len(tokens)


def write_gguf(path: str, arch: str, seed: int = 0, n_heads: int = 4, n_kv: int = 2, head_dim: int = 8,
               hidden: int = 32, inter: int = 48, layers: int = 2, tied: bool = False, q8_q: bool = False,
               sliding_window: int | None = None, extra_keys: tuple = ()):
    """A random model as llama.cpp would write it; returns the HF-layout float32 weights it should import to.
    extra_keys: (GGUFWriter method, key, value) of more metadata, e.g. ("add_bool", "llama.attention.causal", True)."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, arch)
    vocab = add_tiny_tokenizer(writer)
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    for method, key, value in extra_keys:
        getattr(writer, method)(key, value)

    expected = {}

    def add(gguf_name, hf_name, shape, permute_heads=None, quantize=False):
        w = rng.standard_normal(shape).astype(np.float32)
        if quantize:  # Q8_0 round trip: what the import sees is the dequantized value
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            w = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        expected[hf_name] = torch.from_numpy(w.copy())
        add_tensor(writer, gguf_name, permute_qk(w, permute_heads) if permute_heads else w, quantize)

    llama = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden))
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", (hidden,))
        add(b + "attn_q.weight", p + "self_attn.q_proj.weight", (n_heads * head_dim, hidden),
            n_heads if llama else None, quantize=q8_q)
        add(b + "attn_k.weight", p + "self_attn.k_proj.weight", (n_kv * head_dim, hidden), n_kv if llama else None)
        add(b + "attn_v.weight", p + "self_attn.v_proj.weight", (n_kv * head_dim, hidden))
        add(b + "attn_output.weight", p + "self_attn.o_proj.weight", (hidden, n_heads * head_dim))
        if arch == "qwen3":
            add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", (head_dim,))
            add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", (head_dim,))
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (hidden,))
        add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (inter, hidden))
        add(b + "ffn_up.weight", p + "mlp.up_proj.weight", (inter, hidden))
        add(b + "ffn_down.weight", p + "mlp.down_proj.weight", (hidden, inter))
    add("output_norm.weight", "model.norm.weight", (hidden,))
    if not tied:
        add("output.weight", "lm_head.weight", (vocab, hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
