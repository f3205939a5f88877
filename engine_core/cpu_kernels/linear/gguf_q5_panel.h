/* GGUF Q5_0 and Q5_1 weights, kept as the file has them (quant_int8_rows.c's layout: column n is the file's row n of
 * K / 32 blocks), dequantized into dense_bf16_dot.c's bf16 panels: the prompt rows of such layers then run on AMX
 * tiles with the dequantized model's weights (amx_quant.c's dot_prompt_linear_bf16).
 *
 * A block (ggml-common.h): Q5_0 {fp16 d; u32 qh; u8 qs[16]}, Q5_1 {fp16 d, m; u32 qh; u8 qs[16]}; input j < 16
 * is qs[j] & 15, input j + 16 is qs[j] >> 4, and bit j of qh is input j's fifth bit. Its value is gguf-py's:
 * d (q - 16) for Q5_0, d q + m for Q5_1 (d q is exact in fp32, so one fused rounding is numpy's), then bf16
 * (to nearest even) as the dequantized model's weights are.
 *
 * Included after dense_bf16_dot.c (bf16, LANES, to_bf16).
 */
#ifndef NVLLM_GGUF_Q5_PANEL_H
#define NVLLM_GGUF_Q5_PANEL_H
#include "../transpose16.h"

enum { Q5_0_TYPE = 6, Q5_1_TYPE = 7 }; /* GGUF's type ids */

static inline int q5_type(int type) { return type == Q5_0_TYPE || type == Q5_1_TYPE; }
static inline long q5_block_bytes(int type) { return type == Q5_1_TYPE ? 24 : 22; }

/* one block's 32 values as bf16, input 2j in the low and 2j + 1 in the high half of dword j */
static inline __m512i q5_block_pairs(const uint8_t *block, int type) {
    const int q5_1 = type == Q5_1_TYPE;
    uint16_t d_bits, m_bits = 0;
    uint32_t high;
    memcpy(&d_bits, block, 2);
    if (q5_1) memcpy(&m_bits, block + 2, 2);
    memcpy(&high, block + (q5_1 ? 4 : 2), 4);
    const __m128i qs = _mm_loadu_si128((const __m128i *)(block + (q5_1 ? 8 : 6)));
    const __m128i low = _mm_and_si128(qs, _mm_set1_epi8(15)), top = _mm_and_si128(_mm_srli_epi16(qs, 4), _mm_set1_epi8(15));
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(low), top, 1); /* inputs 0..31, 4 bits */
    q = _mm256_mask_add_epi8(q, (__mmask32)high, q, _mm256_set1_epi8(16));  /* the fifth bits */
    if (!q5_1) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(d_bits)), m = _mm512_set1_ps(q5_1 ? _cvtsh_ss(m_bits) : 0.0f);
    const __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    const __m512 second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    /* Q5_0: d q + 0 is d q exactly */
    const __m512i words = _mm512_inserti64x4(_mm512_castsi256_si512(to_bf16(_mm512_fmadd_ps(d, first, m))),
                                             to_bf16(_mm512_fmadd_ps(d, second, m)), 1);
    return words; /* words in input order: dword j holds inputs 2j, 2j + 1 */
}

/* panel p (columns 16p .. 16p + 15, those at or past N as zeros) of a Q5 weight -> bf16 panel [K/2][16][2] */
static void q5_dequantize_panel(const uint8_t *rows, int type, long p, long K, long N, bf16 *dst) {
    const long blocks = K / 32, bytes = q5_block_bytes(type), row_bytes = blocks * bytes;
    for (long b = 0; b < blocks; b++) {
        __m512i columns[16], pairs[16];
        for (int c = 0; c < 16; c++)
            columns[c] = 16 * p + c < N ? q5_block_pairs(rows + (16 * p + c) * row_bytes + b * bytes, type)
                                        : _mm512_setzero_si512();
        transpose16(columns, pairs); /* pairs[j] lane c: column c's inputs 2j, 2j + 1 */
        for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + (b * 16 + j) * 2 * LANES, pairs[j]);
    }
}
#endif
