"""Paged attention, prefill chunks and decodes alike: paged_avx512_bf16.c (and amx_attention.c on the amx tier) and
paged_fixed_order.c (every tier, float32 and bf16 caches), each beside its binding."""
