"""The decoder layers of one step in one C call: loop_avx512_bf16.c (bf16 on avx512_bf16 and up) and loop_portable.c
(float32 on every tier; bf16 below avx512_bf16, built with -DDECODER_BF16), each beside its binding."""
