"""Model families as data: what a config.json means to nvllm, read once, checked once.

- family.py: `Family`, one declarative record per family (its names in HF and GGUF, what it fixes, what it reads).
- catalog.py: the families nvllm runs (Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, Phi-3, Qwen2-MoE, Qwen3-MoE, Mixtral),
  found by architecture or GGUF name, and `read_spec`, which reads a config.json through its family, refusing by
  name any field it does not know and any value nvllm does not implement.
- spec.py: `ModelSpec`, one model's values (shapes, norm, activation, biases, rotary, ...).
- windows.py: which layers attend through a sliding window, and how wide, per family's config fields.
- rope_scaling.py: rope_scaling read per rope type (linear, llama3, yarn, longrope), defaults filled in.
- errors.py: UnsupportedConfig.
- config_fields.py: the config fields every transformers model carries that never change the forward pass.
- moe_fields.py: the mixture-of-experts fields (experts, top-k, renormalisation, sparse layers, shared expert).

The registry, the GGUF importer, the torch modules and the C decoder loops all read the `ModelSpec`.
"""
