"""The engine core: scheduler, paged KV cache, model execution. Owns the accelerators."""
