/* quant_int8_rows.c's K-quant prefills on the AVX2 tier: k_quant_tile.h's arithmetic with the weights unpacked first.
 *
 * From UNPACKED_MIN_ROWS rows on, two columns' super-blocks are unpacked once per chunk of rows (their bytes
 * 0..63 in input order, each block's int16 scale vector, the scales), so the 4 x 2 tile's inner loop is loads
 * and the integer products alone: no nibble or bit unpacking and no scale decoding per row group. The same
 * integers in the same lanes, the same fp32 steps: the same bits as the tile it replaces.
 *
 * Included by quant_int8_rows.c on the AVX2 tier (AVX512 builds keep their two-blocks-per-register tile), after
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

/* a pair of rows' running sums [row 0: S_0, S_1, L_0, L_1, row 1: the same] += their totals * d d_x (and
 * dmin d_x): k_fuse's fp32 steps, lane for lane. scales: d_0, d_1, dmin_0, dmin_1 in both halves */
static inline __m256 k_pair_step(__m256 acc, __m256i halves0, __m256i halves1, __m256 scales, float dx0, float dx1,
                                 const int type) {
    const __m256i totals = _mm256_add_epi32(_mm256_permute2x128_si256(halves0, halves1, 0x20),
                                            _mm256_permute2x128_si256(halves0, halves1, 0x31));
    __m256 products = _mm256_mul_ps(scales, _mm256_setr_m128(_mm_set1_ps(dx0), _mm_set1_ps(dx1)));
    if (type == GGUF_Q6_K) products = _mm256_blend_ps(products, _mm256_setzero_ps(), 0xcc); /* no min term (0 * inf) */
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals), products, acc);
}

/* row r's halves for super-block s from its two column sums: Q6_K's -32 correction, or the min terms */
static inline __m256i k_row_of(__m256i s0, __m256i s1, const KScales *k0, const KScales *k1, const int16_t *bs,
                               const int type) {
    if (type == GGUF_Q6_K)
        return k_halves4(k_q6_correct(s0, k0, bs), k_q6_correct(s1, k1, bs), _mm256_setzero_si256(),
                            _mm256_setzero_si256());
    return k_halves4(s0, s1, k_min_lanes(k0, bs), k_min_lanes(k1, bs));
}

/* the full 4 x 2 tile over all of K into acc[0] (rows 0, 1) and acc[1] (rows 2, 3). Out of line and written
 * with one variable per register: the 8 sums, 2 weight and 2 scale vectors and one input row fit the 16
 * registers, which the general tile below does not get from the compiler */
static __attribute__((noinline)) void k_unpacked_4x2(const Quantized *a, long row, const KUnpacked *u, const int type,
                                                     __m256 acc[2]) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER;
    const int8_t *x = a->q + row * K;
    const __m256i *scale0 = u->scale, *scale1 = u->scale + supers * GROUP;
    __m256 acc01 = _mm256_setzero_ps(), acc23 = _mm256_setzero_ps();
    for (long s = 0; s < supers; s++) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00;
        for (long at = s * SUPER, b = s * GROUP; at < (s + 1) * SUPER; at += QBLOCK, b++) {
            /* k_add_dot for the 8 pairs, by hand: each load once into a register (the compiler would load
             * every input row and scale twice, as memory operands, and the loads would bound the loop) */
            __m256i w0, w1, c0, c1, xq, t;
            __asm__("vmovdqu %[w0p], %[w0]\n\t"
                    "vmovdqu %[w1p], %[w1]\n\t"
                    "vmovdqa %[c0p], %[c0]\n\t"
                    "vmovdqa %[c1p], %[c1]\n\t"
#define K_ROW_STEP(X, S0, S1)                                                                          \
                    "vmovdqu " X ", %[xq]\n\t"                                                         \
                    "vpmaddubsw %[xq], %[w0], %[t]\n\t"                                                \
                    "vpmaddwd %[c0], %[t], %[t]\n\t"                                                   \
                    "vpaddd %[t], " S0 ", " S0 "\n\t"                                                  \
                    "vpmaddubsw %[xq], %[w1], %[t]\n\t"                                                \
                    "vpmaddwd %[c1], %[t], %[t]\n\t"                                                   \
                    "vpaddd %[t], " S1 ", " S1 "\n\t"
                    K_ROW_STEP("%[x0p]", "%[s00]", "%[s01]") K_ROW_STEP("%[x1p]", "%[s10]", "%[s11]")
                    K_ROW_STEP("%[x2p]", "%[s20]", "%[s21]") K_ROW_STEP("%[x3p]", "%[s30]", "%[s31]")
#undef K_ROW_STEP
                    : [s00] "+x"(s00), [s01] "+x"(s01), [s10] "+x"(s10), [s11] "+x"(s11), [s20] "+x"(s20),
                      [s21] "+x"(s21), [s30] "+x"(s30), [s31] "+x"(s31), [w0] "=&x"(w0), [w1] "=&x"(w1),
                      [c0] "=&x"(c0), [c1] "=&x"(c1), [xq] "=&x"(xq), [t] "=&x"(t)
                    : [w0p] "m"(*(const __m256i *)(u->ints + at)), [w1p] "m"(*(const __m256i *)(u->ints + K + at)),
                      [c0p] "m"(scale0[b]), [c1p] "m"(scale1[b]), [x0p] "m"(*(const __m256i *)(x + at)),
                      [x1p] "m"(*(const __m256i *)(x + K + at)), [x2p] "m"(*(const __m256i *)(x + 2 * K + at)),
                      [x3p] "m"(*(const __m256i *)(x + 3 * K + at)));
        }
        const KScales *k0 = u->k + s, *k1 = u->k + supers + s;
        const int16_t *bs = a->bsums + row * (K / 16) + s * 16;
        const float *dx = a->d + row * a->slots + s;
        const __m256 scales = _mm256_broadcast_ps((const __m128 *)(u->scales4 + 4 * s));
        const __m256i h0 = k_row_of(s00, s01, k0, k1, bs, type), h1 = k_row_of(s10, s11, k0, k1, bs + K / 16, type);
        acc01 = k_pair_step(acc01, h0, h1, scales, dx[0], dx[a->slots], type);
        const __m256i h2 = k_row_of(s20, s21, k0, k1, bs + 2 * (K / 16), type);
        const __m256i h3 = k_row_of(s30, s31, k0, k1, bs + 3 * (K / 16), type);
        acc23 = k_pair_step(acc23, h2, h3, scales, dx[2 * a->slots], dx[3 * a->slots], type);
    }
    acc[0] = acc01, acc[1] = acc23;
}

/* rows [row, row + mr) x the unpacked columns [0, nr): k_tile's sums from the unpacked weights, each pair of
 * rows in one register of running sums (k_pair_step); the full tile in k_unpacked_4x2, the edges here */
static inline __attribute__((always_inline)) void k_unpacked_tile(const Quantized *a, long row, const KUnpacked *u,
                                                                  const int type, const float *bias, long n0, void *out,
                                                                  int out_bf16, long out_stride, const int mr, const int nr) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER;
    __m256 acc[MR / 2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    if (mr == MR && nr == UNPACKED_COLS) {
        k_unpacked_4x2(a, row, u, type, acc);
    } else {
        for (long s = 0; s < supers; s++) {
            __m256i halves[MR];
            for (int i = 0; i < MR; i++) halves[i] = _mm256_setzero_si256();
            for (int i = 0; i < mr; i++) {
                __m256i sums[UNPACKED_COLS] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int b = 0; b < GROUP; b++) {
                    const long at = s * SUPER + b * QBLOCK;
                    const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + at));
                    for (int j = 0; j < nr; j++)
                        sums[j] = k_add_dot(sums[j], _mm256_loadu_si256((const __m256i *)(u->ints + j * K + at)), xq,
                                            u->scale[(j * supers + s) * GROUP + b]);
                }
                const KScales *k0 = u->k + s, *k1 = nr > 1 ? u->k + supers + s : k0; /* (lanes of no column: not stored) */
                halves[i] = k_row_of(sums[0], sums[1], k0, k1, a->bsums + (row + i) * (K / 16) + s * 16, type);
            }
            const __m256 scales = _mm256_broadcast_ps((const __m128 *)(u->scales4 + 4 * s));
            for (int p = 0; 2 * p < mr; p++) {
                const float dx0 = a->d[(row + 2 * p) * a->slots + s];
                const float dx1 = 2 * p + 1 < mr ? a->d[(row + 2 * p + 1) * a->slots + s] : 0.0f;
                acc[p] = k_pair_step(acc[p], halves[2 * p], halves[2 * p + 1], scales, dx0, dx1, type);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        float v[8];
        _mm256_storeu_ps(v, acc[i / 2]);
        const float *r = v + 4 * (i % 2);
        for (int j = 0; j < nr; j++) store(r[j] - r[2 + j], bias, n0 + j, out, out_bf16, (row + i) * out_stride + n0 + j);
    }
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
