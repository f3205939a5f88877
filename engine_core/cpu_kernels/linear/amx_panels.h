/* What the AMX kernels on bf16 panels share (amx_gemm.c, amx_quant.c): a pass of up to 32 rows x 2 panels
 * over all of K on tiles, the stores of its sums, and the passes over a thread's panels. The panels are
 * dense_bf16_dot.c's layout: 32 inputs of a panel's 16 columns ([16 input pairs][16 columns][2]) are one tile B of 1 KB.
 *
 * Included after dense_bf16_dot.c (bf16, LANES, to_bf16, widen).
 */
#ifndef NVLLM_AMX_PANELS_H
#define NVLLM_AMX_PANELS_H
#include "amx_tiles.h"

#define AMX_K 32      /* inputs per tile step */
#define TILE_ROWS 16  /* rows per tile A / C */
#define PASS_ROWS 32  /* two tiles A */

/* 1 where the tiles may be used here: the loader asks once, and logs a refusal */
int amx_ready(void) { return amx_permitted(); }

/* sums [2 row tiles][2 column tiles][16][16] of rows [0, r0 + r1) x the panels b0 (and b1 where not NULL) over
 * all of K; the tiles configured for (r0, r1) */
static void pass(const bf16 *x, long x_stride, int r1, const bf16 *b0, const bf16 *b1, long K,
                 float sums[2][2][TILE_ROWS * LANES]) {
    const long stride = x_stride * (long)sizeof(bf16);
    const bf16 *x1 = x + TILE_ROWS * x_stride;
    _tile_zero(0);
    _tile_zero(1);
    if (r1) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (long k = 0; k < K; k += AMX_K) {
        _tile_loadd(4, x + k, stride);
        _tile_loadd(6, b0 + k * LANES, 2 * LANES * sizeof(bf16));
        _tile_dpbf16ps(0, 4, 6);
        if (b1) {
            _tile_loadd(7, b1 + k * LANES, 2 * LANES * sizeof(bf16));
            _tile_dpbf16ps(1, 4, 7);
        }
        if (r1) {
            _tile_loadd(5, x1 + k, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (b1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, sums[0][0], LANES * sizeof(float));
    if (b1) _tile_stored(1, sums[0][1], LANES * sizeof(float));
    if (r1) {
        _tile_stored(2, sums[1][0], LANES * sizeof(float));
        if (b1) _tile_stored(3, sums[1][1], LANES * sizeof(float));
    }
}

/* rows [0, rows) of a tile's sums + bias -> bf16 columns [n, n + 16) of out (those at or past N left alone) */
static void store_plain(const float *sums, int rows, const float *bias, bf16 *out, long out_stride, long n, long N) {
    const __mmask16 mask = N - n >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (N - n)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
    for (int i = 0; i < rows; i++)
        _mm256_mask_storeu_epi16(out + i * out_stride + n, mask, to_bf16(_mm512_add_ps(_mm512_loadu_ps(sums + i * LANES), b)));
}

/* silu(gate + its bias) * (up + its bias), each rounded to bf16 first, as dense_bf16_dot.c's gated tile: 16 outputs
 * from column o; gate_at, up_at: the packed columns (and bias entries) of the gate and up sums */
static void store_gated_tile(const float *gate, const float *up, int rows, const float *bias, long gate_at,
                             long up_at, bf16 *out, long out_stride, long o, const bf16 *silu) {
    const __m512 bg = bias ? _mm512_loadu_ps(bias + gate_at) : _mm512_setzero_ps();
    const __m512 bu = bias ? _mm512_loadu_ps(bias + up_at) : _mm512_setzero_ps();
    for (int i = 0; i < rows; i++) {
        const __m256i g = to_bf16(_mm512_add_ps(_mm512_loadu_ps(gate + i * LANES), bg));
        const __m256i u = to_bf16(_mm512_add_ps(_mm512_loadu_ps(up + i * LANES), bu));
        const __m512i s = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(g), (const void *)silu, 2);
        const __m512 product = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(s, 16)), widen(u));
        _mm256_storeu_si256((__m256i *)(out + i * out_stride + o), to_bf16(product));
    }
}

/* panels [p_begin, p_end) (gated: whole groups of 4) for every row, rows in chunks whose inputs stay in L2 */
static void amx_columns(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                        bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end) {
    float sums[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));
    long chunk = ROW_CHUNK_BYTES / (K * (long)sizeof(bf16)) / PASS_ROWS * PASS_ROWS;
    if (chunk < PASS_ROWS) chunk = PASS_ROWS;
    int configured = -1;
    for (long m0 = 0; m0 < M; m0 += chunk) {
        const long m_end = M - m0 < chunk ? M : m0 + chunk;
        /* plain: panel pairs (p, p + 1); gated groups g0 g1 u0 u1: (g0, u0), then (g1, u1) */
        for (long p = p_begin; p < p_end; p += silu ? (p % 4 == 0 ? 1 : 3) : 2) {
            const long second = silu ? p + 2 : p + 1;
            const bf16 *b0 = packed + p * K * LANES, *b1 = second < p_end ? packed + second * K * LANES : NULL;
            for (long m = m0; m < m_end; m += PASS_ROWS) {
                const int rows = m_end - m < PASS_ROWS ? (int)(m_end - m) : PASS_ROWS;
                const int r0 = rows < TILE_ROWS ? rows : TILE_ROWS, r1 = rows - r0;
                if (r0 * 32 + r1 != configured) amx_configure_pass(r0, r1), configured = r0 * 32 + r1;
                pass(x + m * x_stride, x_stride, r1, b0, b1, K, sums);
                for (int h = 0; h < 2; h++) {
                    const int hr = h ? r1 : r0;
                    bf16 *o = out + (m + h * TILE_ROWS) * out_stride;
                    if (!hr) continue;
                    if (silu) {
                        store_gated_tile(sums[h][0], sums[h][1], hr, bias, p * LANES, second * LANES, o, out_stride,
                                         (p / 4) * 2 * LANES + (p % 4) * LANES, silu);
                    } else {
                        store_plain(sums[h][0], hr, bias, o, out_stride, p * LANES, N);
                        if (b1) store_plain(sums[h][1], hr, bias, o, out_stride, second * LANES, N);
                    }
                }
            }
        }
    }
    if (configured >= 0) _tile_release();
}

#endif
