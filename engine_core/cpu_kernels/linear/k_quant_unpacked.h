/* quant_dot.c's K-quant prefills on the AVX2 tier: k_quant_tile.h's arithmetic with the weights unpacked first.
 *
 * From UNPACKED_MIN_ROWS rows on, two columns' super-blocks are unpacked once per chunk of rows (their bytes
 * 0..63 in input order, each block's int16 scale vector, the scales), so the 4 x 2 tile's inner loop is loads
 * and the integer products alone: no nibble or bit unpacking and no scale decoding per row group. The same
 * integers in the same lanes, the same fp32 steps: the same bits as the tile it replaces.
 *
 * Included by quant_dot.c on the AVX2 tier (AVX512 builds keep their two-blocks-per-register tile), after
 * k_quant_tile.h.
 */
#ifndef NVLLM_K_QUANT_UNPACKED_H
#define NVLLM_K_QUANT_UNPACKED_H

#define UNPACKED_MIN_ROWS 8
#define UNPACKED_COLS 2

typedef struct {
    uint8_t *ints;   /* [UNPACKED_COLS][K] */
    __m256i *scale;  /* [UNPACKED_COLS][supers][GROUP]: k_block_scale */
    KScales *k;      /* [UNPACKED_COLS][supers] */
    float *scales4;  /* [supers][4]: d of columns 0 and 1, then their dmin (0 past the last column) */
} KUnpacked;

static void k_unpack(const uint8_t *w, long col_bytes, int cols, long K, const int type, KUnpacked *u) {
    const long supers = K / SUPER, bytes = gguf_block_bytes(type);
    memset(u->scales4, 0, supers * 4 * sizeof(float));
    for (int j = 0; j < cols; j++)
        for (long s = 0; s < supers; s++) {
            const uint8_t *g = w + j * col_bytes + s * bytes;
            KScales *k = u->k + j * supers + s;
            k_scales(type, g, k);
            u->scales4[4 * s + j] = k->d;
            u->scales4[4 * s + 2 + j] = k->dmin;
            for (int b = 0; b < GROUP; b++) {
                _mm256_storeu_si256((__m256i *)(u->ints + j * K + s * SUPER + b * QBLOCK), k_weight_ints(g, b, type));
                u->scale[(j * supers + s) * GROUP + b] = k_block_scale(k, b, type);
            }
        }
}

/* rows [row, row + mr) x the unpacked columns [0, nr): k_tile's sums from the unpacked weights. Each row keeps
 * one k_row: lanes 0, 1 the columns' running sums, lanes 2, 3 their min terms (k_fuse reduces all four at once) */
static inline __attribute__((always_inline)) void k_unpacked_tile(const Quantized *a, long row, const KUnpacked *u,
                                                                  const int type, const float *bias, long n0, void *out,
                                                                  int out_bf16, long out_stride, const int mr, const int nr) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER;
    k_row acc[MR];
    for (int i = 0; i < mr; i++) acc[i] = k_row_zero();
    for (long s = 0; s < supers; s++) {
        __m256i sums[MR][UNPACKED_COLS];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) sums[i][j] = k_sums_zero();
        for (int b = 0; b < GROUP; b++) {
            const long at = s * SUPER + b * QBLOCK;
            __m256i wq[UNPACKED_COLS], scale[UNPACKED_COLS];
            for (int j = 0; j < nr; j++) {
                wq[j] = _mm256_loadu_si256((const __m256i *)(u->ints + j * K + at));
                scale[j] = u->scale[(j * supers + s) * GROUP + b];
            }
            for (int i = 0; i < mr; i++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + at));
                for (int j = 0; j < nr; j++) sums[i][j] = k_add_dot(sums[i][j], wq[j], xq, scale[j]);
            }
        }
        const __m128 scales = _mm_loadu_ps(u->scales4 + 4 * s); /* d_0, d_1, dmin_0, dmin_1 */
        for (int i = 0; i < mr; i++) {
            const int16_t *bs = a->bsums + (row + i) * (K / 16) + s * 16;
            k_sums four[4] = {k_sums_zero(), k_sums_zero(), k_sums_zero(), k_sums_zero()};
            for (int j = 0; j < nr; j++) {
                const KScales *k = u->k + j * supers + s;
                if (type == GGUF_Q6_K) {
                    four[j] = k_q6_correct(sums[i][j], k, bs);
                } else {
                    four[j] = sums[i][j];
                    four[2 + j] = k_min_lanes(k, bs);
                }
            }
            float scale[4];
            __m128 products = _mm_mul_ps(scales, _mm_set1_ps(a->d[(row + i) * a->slots + s]));
            if (type == GGUF_Q6_K) products = _mm_blend_ps(products, _mm_setzero_ps(), 0xc); /* no min term (0 * inf) */
            _mm_storeu_ps(scale, products);
            acc[i] = k_fuse(acc[i], four, scale);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(k_row_at(acc[i], j) - k_row_at(acc[i], 2 + j), bias, n0 + j, out, out_bf16, (row + i) * out_stride + n0 + j);
}

/* columns [n_begin, n_end) of a K-quant weight for all M rows. Returns -1 when out of memory (nothing written). */
static inline __attribute__((always_inline)) int k_unpacked_columns(const Quantized *a, long M, const uint8_t *packed,
                                                                     const int type, long col_bytes, const float *bias,
                                                                     void *out, int out_bf16, long out_stride,
                                                                     long n_begin, long n_end) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER;
    KUnpacked u;
    u.ints = malloc(UNPACKED_COLS * K);
    u.scale = aligned_alloc(32, UNPACKED_COLS * supers * GROUP * sizeof(__m256i));
    u.k = malloc(UNPACKED_COLS * supers * sizeof(KScales));
    u.scales4 = malloc(supers * 4 * sizeof(float));
    const int ok = u.ints && u.scale && u.k && u.scales4;
    if (ok)
        for (long m0 = 0; m0 < M; m0 += ROW_CHUNK) {
            const long m_end = M - m0 < ROW_CHUNK ? M : m0 + ROW_CHUNK;
            for (long n = n_begin; n < n_end; n += UNPACKED_COLS) {
                const int nr = n_end - n < UNPACKED_COLS ? (int)(n_end - n) : UNPACKED_COLS;
                k_unpack(packed + n * col_bytes, col_bytes, nr, K, type, &u);
                for (long m = m0; m < m_end; m += MR) {
                    const int mr = m_end - m < MR ? (int)(m_end - m) : MR;
#define UNPACKED_TILE(MRV, NRV) k_unpacked_tile(a, m, &u, type, bias, n, out, out_bf16, out_stride, MRV, NRV)
                    if (nr == UNPACKED_COLS) {
                        switch (mr) {
                        case 1: UNPACKED_TILE(1, UNPACKED_COLS); break;
                        case 2: UNPACKED_TILE(2, UNPACKED_COLS); break;
                        case 3: UNPACKED_TILE(3, UNPACKED_COLS); break;
                        default: UNPACKED_TILE(4, UNPACKED_COLS); break;
                        }
                    } else {
                        for (long i = m; i < m + mr; i++)
                            k_unpacked_tile(a, i, &u, type, bias, n, out, out_bf16, out_stride, 1, 1);
                    }
#undef UNPACKED_TILE
                }
            }
        }
    free(u.ints);
    free(u.scale);
    free(u.k);
    free(u.scales4);
    return ok ? 0 : -1;
}
#endif
