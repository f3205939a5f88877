/* quant_int8_rows.c's prefills of the per-32 types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on the AVX2 tier: tile's
 * arithmetic with the weights unpacked first.
 *
 * From UNPACKED_MIN_ROWS rows on, two columns' blocks are unpacked once per chunk of rows (their 32 integers per
 * block in input order, each block's d and m as fp32), so the 2 x 2 tile's loop is loads, the integer products
 * and one fma per block: no nibble or fifth-bit unpacking and no fp16 conversion per row pair, and its 8
 * running sums stay in registers (tile's 4 x 2, with its even and odd blocks' sums, spills them). The same
 * integers, the same fp32 steps in the same order (each row's scale d_w d_x rounded first, even blocks into
 * one register and odd ones into another, the offset terms after each group): the same bits as tile.
 *
 * Included by quant_int8_rows.c on the AVX2 tier, after k_quant_unpacked.h (UNPACKED_MIN_ROWS).
 */
#ifndef NVLLM_QUANT_UNPACKED_H
#define NVLLM_QUANT_UNPACKED_H

typedef struct {
    uint8_t *ints; /* [UNPACKED_COLS][K] */
    float *d, *m;  /* [UNPACKED_COLS][blocks rounded up to whole groups] */
} Unpacked;

static void unpack_columns(const uint8_t *w, long col_bytes, int cols, long blocks, const int type, Unpacked *u) {
    const long groups = (blocks + GROUP - 1) / GROUP;
    for (int j = 0; j < cols; j++) {
        long at = 0;
        for (long g = 0; g < groups; g++) {
            const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
            const uint8_t *group = w + j * col_bytes + at;
            group_weight_scales(type, group, count, u->d + j * groups * GROUP + g * GROUP, u->m + j * groups * GROUP + g * GROUP);
            for (long b = 0; b < count; b++)
                _mm256_storeu_si256((__m256i *)(u->ints + j * blocks * QBLOCK + (g * GROUP + b) * QBLOCK),
                                    weight_ints(group, b, type));
            at += group_bytes(type, count);
        }
    }
}

/* rows [row, row + mr) x the unpacked columns [0, nr), mr, nr <= 2: tile's sums, lane for lane */
static inline __attribute__((always_inline)) void unpacked_tile(const Quantized *a, long row, const Unpacked *u,
                                                                const int type, const float *bias, long n0, void *out,
                                                                int out_bf16, long out_stride, const int mr, const int nr) {
    const int signed_w = is_signed(type);
    const long blocks = a->blocks, K = blocks * QBLOCK, groups = (blocks + GROUP - 1) / GROUP;
    lanes acc[2][2], odd[2][2];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = lanes_zero(), odd[i][j] = lanes_zero();
    for (long g = 0; g < groups; g++) {
        const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
        float scale[2][2][GROUP];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) /* d_w d_x per block, rounded to fp32 (tile's dw[b] * dx[b]) */
                _mm256_storeu_ps(scale[i][j], _mm256_mul_ps(_mm256_loadu_ps(u->d + j * groups * GROUP + g * GROUP),
                                                            _mm256_loadu_ps(a->d + (row + i) * a->slots + g * GROUP)));
        for (long b = 0; b < count; b++) {
            const long k = (g * GROUP + b) * QBLOCK;
            __m256i wq[2];
            for (int j = 0; j < nr; j++) wq[j] = _mm256_loadu_si256((const __m256i *)(u->ints + j * K + k));
            for (int i = 0; i < mr; i++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + k));
                for (int j = 0; j < nr; j++) add_even_or_odd(&acc[i][j], &odd[i][j], b, wq[j], xq, signed_w, &scale[i][j][b]);
            }
        }
        if (!signed_w)
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++)
                    acc[i][j] = add_products(acc[i][j], u->m + j * groups * GROUP + g * GROUP,
                                             a->s + (row + i) * a->slots + g * GROUP);
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(lanes_total(lanes_add(acc[i][j], odd[i][j])), bias, n0 + j, out, out_bf16, (row + i) * out_stride + n0 + j);
}

/* one block's four products, rows x0, x1 by columns w0, w1 (each at the block), into the four sums r<row><col>,
 * each scaled by its d_w d_x (s<row><col>) */
static inline __attribute__((always_inline)) void block_2x2(const uint8_t *w0, const uint8_t *w1, const int8_t *x0,
                                                            const int8_t *x1, const int signed_w, const float *s00,
                                                            const float *s01, const float *s10, const float *s11,
                                                            lanes *r00, lanes *r01, lanes *r10, lanes *r11) {
    const __m256i wa = _mm256_loadu_si256((const __m256i *)w0), wb = _mm256_loadu_si256((const __m256i *)w1);
    __m256i x = _mm256_loadu_si256((const __m256i *)x0);
    *r00 = add_scaled(*r00, block_dot(wa, x, signed_w), s00);
    *r01 = add_scaled(*r01, block_dot(wb, x, signed_w), s01);
    x = _mm256_loadu_si256((const __m256i *)x1);
    *r10 = add_scaled(*r10, block_dot(wa, x, signed_w), s10);
    *r11 = add_scaled(*r11, block_dot(wb, x, signed_w), s11);
}

/* the full 2 x 2 tile, out of line, one copy per type: unpacked_tile's steps in the same order, written out with
 * its eight sums as named variables and the blocks in even/odd pairs, so they stay in registers (the generic
 * shape's arrays and its branch on the block's parity had the compiler spill half of them every block) */
static __attribute__((noinline)) void unpacked_2x2(const Quantized *a, long row, const Unpacked *u, const int type,
                                                   const float *bias, long n0, void *out, int out_bf16, long out_stride) {
    const int signed_w = is_signed(type);
    const long blocks = a->blocks, K = blocks * QBLOCK, groups = (blocks + GROUP - 1) / GROUP;
    const uint8_t *w0 = u->ints, *w1 = u->ints + K;
    const int8_t *x0 = a->q + row * K, *x1 = x0 + K;
    lanes e00 = lanes_zero(), e01 = lanes_zero(), e10 = lanes_zero(), e11 = lanes_zero();
    lanes o00 = lanes_zero(), o01 = lanes_zero(), o10 = lanes_zero(), o11 = lanes_zero();
    for (long g = 0; g < groups; g++) {
        const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
        const __m256 d0 = _mm256_loadu_ps(u->d + g * GROUP), d1 = _mm256_loadu_ps(u->d + groups * GROUP + g * GROUP);
        const __m256 dx0 = _mm256_loadu_ps(a->d + row * a->slots + g * GROUP);
        const __m256 dx1 = _mm256_loadu_ps(a->d + (row + 1) * a->slots + g * GROUP);
        float s00[GROUP], s01[GROUP], s10[GROUP], s11[GROUP]; /* d_w d_x per block, rounded to fp32 */
        _mm256_storeu_ps(s00, _mm256_mul_ps(d0, dx0));
        _mm256_storeu_ps(s01, _mm256_mul_ps(d1, dx0));
        _mm256_storeu_ps(s10, _mm256_mul_ps(d0, dx1));
        _mm256_storeu_ps(s11, _mm256_mul_ps(d1, dx1));
        const long first = g * GROUP * QBLOCK;
        long b = 0;
        for (; b + 2 <= count; b += 2) {
            const long k = first + b * QBLOCK;
            block_2x2(w0 + k, w1 + k, x0 + k, x1 + k, signed_w, s00 + b, s01 + b, s10 + b, s11 + b, &e00, &e01, &e10, &e11);
            block_2x2(w0 + k + QBLOCK, w1 + k + QBLOCK, x0 + k + QBLOCK, x1 + k + QBLOCK, signed_w, s00 + b + 1,
                      s01 + b + 1, s10 + b + 1, s11 + b + 1, &o00, &o01, &o10, &o11);
        }
        if (b < count) { /* a last group's odd count: its last block is even */
            const long k = first + b * QBLOCK;
            block_2x2(w0 + k, w1 + k, x0 + k, x1 + k, signed_w, s00 + b, s01 + b, s10 + b, s11 + b, &e00, &e01, &e10, &e11);
        }
        if (!signed_w) { /* the offset terms m_w (d_x sum q_x), after each group as tile adds them */
            const float *m0 = u->m + g * GROUP, *m1 = u->m + groups * GROUP + g * GROUP;
            const float *sx0 = a->s + row * a->slots + g * GROUP, *sx1 = a->s + (row + 1) * a->slots + g * GROUP;
            e00 = add_products(e00, m0, sx0);
            e01 = add_products(e01, m1, sx0);
            e10 = add_products(e10, m0, sx1);
            e11 = add_products(e11, m1, sx1);
        }
    }
    store(lanes_total(lanes_add(e00, o00)), bias, n0, out, out_bf16, row * out_stride + n0);
    store(lanes_total(lanes_add(e01, o01)), bias, n0 + 1, out, out_bf16, row * out_stride + n0 + 1);
    store(lanes_total(lanes_add(e10, o10)), bias, n0, out, out_bf16, (row + 1) * out_stride + n0);
    store(lanes_total(lanes_add(e11, o11)), bias, n0 + 1, out, out_bf16, (row + 1) * out_stride + n0 + 1);
}

/* columns [n_begin, n_end) of a per-32 weight for all M rows. Returns -1 when out of memory (nothing written). */
static inline __attribute__((always_inline)) int unpacked_columns(const Quantized *a, long M, const uint8_t *packed,
                                                                  const int type, long col_bytes, const float *bias,
                                                                  void *out, int out_bf16, long out_stride,
                                                                  long n_begin, long n_end) {
    const long blocks = a->blocks, K = blocks * QBLOCK, padded = (blocks + GROUP - 1) / GROUP * GROUP;
    Unpacked u;
    u.ints = malloc(UNPACKED_COLS * K);
    u.d = malloc(UNPACKED_COLS * padded * sizeof(float));
    u.m = malloc(UNPACKED_COLS * padded * sizeof(float));
    const int ok = u.ints && u.d && u.m;
    if (ok) {
        memset(u.d, 0, UNPACKED_COLS * padded * sizeof(float)); /* the last group's blocks past K: scale 0 */
        memset(u.m, 0, UNPACKED_COLS * padded * sizeof(float));
        for (long m0 = 0; m0 < M; m0 += ROW_CHUNK) {
            const long m_end = M - m0 < ROW_CHUNK ? M : m0 + ROW_CHUNK;
            for (long n = n_begin; n < n_end; n += UNPACKED_COLS) {
                const int nr = n_end - n < UNPACKED_COLS ? (int)(n_end - n) : UNPACKED_COLS;
                unpack_columns(packed + n * col_bytes, col_bytes, nr, blocks, type, &u);
                for (long m = m0; m < m_end; m += 2) {
                    if (m + 2 <= m_end && nr == 2)
                        unpacked_2x2(a, m, &u, type, bias, n, out, out_bf16, out_stride);
                    else
                        for (long i = m; i < m + 2 && i < m_end; i++)
                            unpacked_tile(a, i, &u, type, bias, n, out, out_bf16, out_stride, 1, nr);
                }
            }
        }
    }
    free(u.ints);
    free(u.d);
    free(u.m);
    return ok ? 0 : -1;
}
#endif
