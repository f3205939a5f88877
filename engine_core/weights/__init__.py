"""Weight loading: HF safetensors folders, GGUF import, and where models come from."""
