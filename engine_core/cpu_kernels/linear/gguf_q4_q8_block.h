/* One block of a GGUF Q4_0, Q4_1 or Q8_0 row as the bf16 quantized kernels read it when they pack a weight
 * (quant_bf16_dot.c, quant_vnni.c): its scale, offset and 32 integers. Needs F16C (the avx512 tiers have it). */
#ifndef NVLLM_GGUF_Q4_Q8_BLOCK_H
#define NVLLM_GGUF_Q4_Q8_BLOCK_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifndef QBLOCK
#define QBLOCK 32
#endif

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

/* GGUF block layouts (ggml-common.h): Q4_0 {fp16 d; u8 qs[16]}, Q4_1 {fp16 d, m; u8 qs[16]},
 * Q8_0 {fp16 d; i8 qs[32]}; a Q4 block's input j < 16 is qs[j] & 15, input j + 16 is qs[j] >> 4. */
enum { GGUF_Q4_0 = 2, GGUF_Q4_1 = 3, GGUF_Q8_0 = 8 };

static long gguf_block_bytes(int type) { return type == GGUF_Q4_0 ? 18 : type == GGUF_Q4_1 ? 20 : 34; }

/* column n's block b: scale, offset (Q4) and its 32 integers (Q4: 0..15; Q8: u = q + 128) */
static void read_block(const uint8_t *rows, long row_bytes, int type, long n, long b, uint16_t *d, uint16_t *m,
                       uint8_t q[QBLOCK]) {
    const uint8_t *blk = rows + n * row_bytes + b * gguf_block_bytes(type);
    memcpy(d, blk, 2);
    if (type == GGUF_Q8_0) {
        for (int j = 0; j < QBLOCK; j++) q[j] = blk[2 + j] ^ 0x80;
        *m = 0;
        return;
    }
    const uint8_t *qs = blk + (type == GGUF_Q4_1 ? 4 : 2);
    if (type == GGUF_Q4_1)
        memcpy(m, blk + 2, 2);
    else
        *m = float_to_half(-8.0f * half_to_float(*d)); /* exact: a power-of-two multiple */
    for (int j = 0; j < 16; j++) q[j] = qs[j] & 15, q[j + 16] = qs[j] >> 4;
}
#endif
