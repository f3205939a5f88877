/* A 16 x 16 matrix of 32-bit elements, transposed in registers (AVX512F): the attention kernels turn key
 * rows into key pairs with it, the quantized prompt kernels dequantized columns into panel rows. */
#ifndef NVLLM_TRANSPOSE16_H
#define NVLLM_TRANSPOSE16_H
#include <immintrin.h>

/* the 16x16 matrix of 32-bit elements in r, transposed: out[c] lane t = r[t] lane c */
static inline void transpose16(const __m512i r[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4q + c], 128-bit lane L: column 4L + c of rows 4q .. 4q + 3 */
    for (int q = 0; q < 4; q++) {
        u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        out[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        out[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        out[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        out[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}
#endif
