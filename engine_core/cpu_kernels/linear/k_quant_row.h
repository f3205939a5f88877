/* quant_int8_rows.c's K-quant products for one input row (a decode step) on the AVX2 tier: two columns at a time,
 * out of line, every value in a register.
 *
 * One row reads each weight once, so the work per super-block beside the integer products is what limits it:
 * here the super-block's scales are decoded into registers (the 6-bit scales and mins unpacked in vector and
 * widened to int16, each block's scale vector one byte shuffle from them; the fp16 d and dmin of both columns
 * by one F16C conversion), nothing goes through memory, and the two columns' sums and min terms are reduced and scaled in one register: lanes 0, 1 the
 * columns' running sums, lanes 2, 3 their min terms, the fp32 steps of k_fuse lane for lane. The same exact
 * integers per super-block and the same fp32 steps as k_tile: the same bits.
 *
 * Included by quant_int8_rows.c on the AVX2 tier (AVX512 builds keep k_tile's two blocks per register), after
 * k_quant_tile.h.
 */
#ifndef NVLLM_K_QUANT_ROW_H
#define NVLLM_K_QUANT_ROW_H

/* a column's super-block scales in registers: int16 per block (Q6_K: per 16 inputs) */
typedef struct {
    __m256i sc;  /* Q4_K / Q5_K: sc[0..7] in both halves; Q6_K: sc[0, 2, .., 14] in the low half, sc[1, 3, .., 15]
                  * in the high one (block b's two scales, one shuffle apart) */
    __m256i mn2; /* Q4_K / Q5_K: each min twice (it meets a block's two 16-input sums) */
} KRegs;

/* Q4_K / Q5_K's 12 scale bytes (k_scales_and_mins) in vector: the bytes sc[0..7], mn[0..7]. The 16 bytes read
 * from s end inside the super-block (its quants follow the scales) */
static inline __m128i k_scale_bytes(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i low6 = _mm_and_si128(v, _mm_set1_epi8(63));                                  /* sc0-3, mn0-3 */
    const __m128i top2 = _mm_srli_epi16(_mm_and_si128(v, _mm_set1_epi8((char)0xc0)), 2);      /* their bits 4-5 */
    const __m128i c = _mm_shuffle_epi32(v, 0xaa);                                              /* bytes 8-11 */
    const __m128i nibbles = _mm_blend_epi32(_mm_and_si128(c, _mm_set1_epi8(15)),
                                            _mm_and_si128(_mm_srli_epi16(c, 4), _mm_set1_epi8(15)), 0x2);
    return _mm_unpacklo_epi32(low6, _mm_or_si128(top2, nibbles)); /* sc0-3, sc4-7, mn0-3, mn4-7 */
}

static inline KRegs k_regs(const uint8_t *g, const int type) {
    KRegs r;
    if (type == GGUF_Q6_K) {
        const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        r.sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(g + 192)), even_odd));
        r.mn2 = _mm256_setzero_si256();
        return r;
    }
    const __m128i bytes = k_scale_bytes(g + 4);
    r.sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
    const __m128i min_bytes = _mm_srli_si128(bytes, 8);
    r.mn2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(min_bytes, min_bytes));
    return r;
}

/* d_0, d_1, dmin_0, dmin_1 of the two columns' super-blocks (fp16 in the file; Q6_K: no dmin, 0) */
static inline __m128 k_pair_scales(const uint8_t *g0, const uint8_t *g1, const int type) {
    if (type == GGUF_Q6_K)
        return _mm_cvtph_ps(_mm_setr_epi16((short)read_u16(g0 + 208), (short)read_u16(g1 + 208), 0, 0, 0, 0, 0, 0));
    uint32_t h0, h1; /* d, dmin of each */
    memcpy(&h0, g0, 4);
    memcpy(&h1, g1, 4);
    return _mm_cvtph_ps(_mm_shufflelo_epi16(_mm_setr_epi32((int)h0, (int)h1, 0, 0), 0xd8)); /* d0 d1 dmin0 dmin1 */
}

/* block b's scale in every int16 of the pair sums (Q6_K: sc[2b] for inputs 0-15, sc[2b+1] for 16-31): int16 b of
 * each half */
static inline __m256i k_regs_scale(const KRegs *r, int b) {
    return _mm256_shuffle_epi8(r->sc, _mm256_set1_epi16((short)(0x0100 + 0x0202 * b)));
}

/* out[0], out[1] (before the bias): row `row` times columns w and w + col_bytes over all of K */
static __attribute__((noinline)) void k_row_2cols(const Quantized *a, long row, const uint8_t *w, long col_bytes,
                                                  const int type, float out[2]) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER, bytes = gguf_block_bytes(type);
    const int8_t *x = a->q + row * K;
    __m128 acc = _mm_setzero_ps(); /* column 0, column 1, their min terms */
    for (long s = 0; s < supers; s++) {
        const uint8_t *g0 = w + s * bytes, *g1 = g0 + col_bytes;
        prefetch_run(w + 2 * s * bytes, 2 * bytes, PREFETCH_AHEAD); /* the two columns' run, from memory */
        const KRegs r0 = k_regs(g0, type), r1 = k_regs(g1, type);
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
#pragma GCC unroll 8
        for (int b = 0; b < GROUP; b++) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x + s * SUPER + b * QBLOCK));
            s0 = k_add_dot(s0, k_weight_ints(g0, b, type), xq, k_regs_scale(&r0, b));
            s1 = k_add_dot(s1, k_weight_ints(g1, b, type), xq, k_regs_scale(&r1, b));
        }
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bsums + row * (K / 16) + s * 16));
        __m256i l0 = _mm256_setzero_si256(), l1 = l0;
        if (type == GGUF_Q6_K) { /* the -32 of each weight: 32 sc per 16-input sum (the scales in file order) */
            const __m256i sc0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g0 + 192)));
            const __m256i sc1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g1 + 192)));
            s0 = _mm256_sub_epi32(s0, _mm256_slli_epi32(_mm256_madd_epi16(sc0, bs), 5));
            s1 = _mm256_sub_epi32(s1, _mm256_slli_epi32(_mm256_madd_epi16(sc1, bs), 5));
        } else {
            l0 = _mm256_madd_epi16(r0.mn2, bs), l1 = _mm256_madd_epi16(r1.mn2, bs);
        }
        const __m128i totals = k_totals4(s0, s1, l0, l1);
        /* the scale products rounded to fp32 first, as k_tile; Q6_K's min lanes stay 0 (no 0 * inf) */
        __m128 products = _mm_mul_ps(k_pair_scales(g0, g1, type), _mm_set1_ps(a->d[row * a->slots + s]));
        if (type == GGUF_Q6_K) products = _mm_blend_ps(products, _mm_setzero_ps(), 0xc);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(totals), products, acc);
    }
    float v[4];
    _mm_storeu_ps(v, acc);
    out[0] = v[0] - v[2], out[1] = v[1] - v[3];
}

/* columns [n_begin, n_end) of a K-quant weight for the single row 0 */
static inline __attribute__((always_inline)) void k_row_columns(const Quantized *a, const uint8_t *packed, const int type,
                                                                long col_bytes, const float *bias, void *out, int out_bf16,
                                                                long n_begin, long n_end) {
    long n = n_begin;
    for (; n + 2 <= n_end; n += 2) {
        float v[2];
        k_row_2cols(a, 0, packed + n * col_bytes, col_bytes, type, v);
        store(v[0], bias, n, out, out_bf16, n);
        store(v[1], bias, n + 1, out, out_bf16, n + 1);
    }
    if (n < n_end) k_tile(a, 0, packed + n * col_bytes, col_bytes, type, bias, n, out, out_bf16, 0, 1, 1);
}
#endif
