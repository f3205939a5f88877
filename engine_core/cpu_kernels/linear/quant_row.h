/* quant_int8_rows.c's products of the per-32 types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for one input row (a decode step)
 * on the AVX2 tier: four columns at a time, out of line, their running sums in registers.
 *
 * tile's one-row shape kept its even and odd sums in arrays it indexed by the block's parity, so the compiler
 * spilled them and branched on the parity in the loop. Here the blocks go in pairs (even, then odd), the
 * eight sums are named registers, and each group's scales d_w d_x are one vector product per column. The
 * same integers and the same fp32 steps in the same order as tile (d_w d_x rounded first, even blocks into
 * one sum and odd ones into another, the offset terms after each group, the sums added and reduced as
 * lanes_total does): the same bits.
 *
 * Included by quant_int8_rows.c on the AVX2 tier, after group_weight_scales and the block helpers.
 */
#ifndef NVLLM_QUANT_ROW_H
#define NVLLM_QUANT_ROW_H

#define ROW_COLS 4

/* columns [0, nc) (nc <= ROW_COLS) at w, col_bytes apart, times the single input row: out[j] before the bias */
static inline __attribute__((always_inline)) void row_columns_of(const Quantized *a, const uint8_t *w, long col_bytes,
                                                                 const int type, const int nc, float out[ROW_COLS]) {
    const int signed_w = is_signed(type);
    const long blocks = a->blocks;
    lanes even[ROW_COLS], odd[ROW_COLS];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) even[j] = lanes_zero(), odd[j] = lanes_zero();
    long at = 0; /* byte offset of the group within a column */
    for (long g = 0; g * GROUP < blocks; g++) {
        const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
        const long bytes = group_bytes(type, count);
        float scale[ROW_COLS][GROUP], m[ROW_COLS][GROUP];
        const __m256 dx = _mm256_loadu_ps(a->d + g * GROUP); /* zeros past the last block */
        prefetch_run(w + nc * at, nc * bytes, PREFETCH_AHEAD); /* the columns' run, from memory */
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const uint8_t *group = w + j * col_bytes + at;
            float dw[GROUP];
            group_weight_scales(type, group, count, dw, m[j]);
            _mm256_storeu_ps(scale[j], _mm256_mul_ps(_mm256_loadu_ps(dw), dx));
        }
        const int8_t *x = a->q + g * GROUP * QBLOCK;
        long b = 0;
        for (; b + 2 <= count; b += 2) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + b * QBLOCK));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + (b + 1) * QBLOCK));
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) {
                const uint8_t *group = w + j * col_bytes + at;
                even[j] = add_scaled(even[j], block_dot(weight_ints(group, b, type), x0, signed_w), &scale[j][b]);
                odd[j] = add_scaled(odd[j], block_dot(weight_ints(group, b + 1, type), x1, signed_w), &scale[j][b + 1]);
            }
        }
        if (b < count) { /* a last group's odd count: its last block is even */
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + b * QBLOCK));
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++)
                even[j] = add_scaled(even[j], block_dot(weight_ints(w + j * col_bytes + at, b, type), x0, signed_w),
                                     &scale[j][b]);
        }
        if (!signed_w)
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) even[j] = add_products(even[j], m[j], a->s + g * GROUP);
        at += bytes;
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) out[j] = lanes_total(lanes_add(even[j], odd[j]));
}

/* the full four columns, out of line: one copy per type, its sums in registers */
static __attribute__((noinline)) void row_4cols(const Quantized *a, const uint8_t *w, long col_bytes, const int type,
                                                float out[ROW_COLS]) {
    row_columns_of(a, w, col_bytes, type, ROW_COLS, out);
}

/* columns [n_begin, n_end) of a per-32 weight for the single row 0 */
static inline __attribute__((always_inline)) void row_columns(const Quantized *a, const uint8_t *packed, const int type,
                                                              long col_bytes, const float *bias, void *out, int out_bf16,
                                                              long n_begin, long n_end) {
    for (long n = n_begin; n < n_end; n += ROW_COLS) {
        float v[ROW_COLS];
        const int nc = n_end - n < ROW_COLS ? (int)(n_end - n) : ROW_COLS;
        if (nc == ROW_COLS)
            row_4cols(a, packed + n * col_bytes, col_bytes, type, v);
        else
            for (int j = 0; j < nc; j++) row_columns_of(a, packed + (n + j) * col_bytes, col_bytes, type, 1, v + j);
        for (int j = 0; j < nc; j++) store(v[j], bias, n + j, out, out_bf16, n + j);
    }
}
#endif
