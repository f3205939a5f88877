/* quant_int8_rows.c's tile for the K-quants (Q4_K, Q5_K, Q6_K): a whole 256-input super-block in integers.
 *
 * The input row is rounded to 8 bits per 256 inputs (one d_x per super-block, as llama.cpp's q8_K), so the
 * super-block's integer sub-block scales (Q4_K / Q5_K: 6-bit sc per 32 inputs; Q6_K: int8 per 16) multiply
 * the integer dot products in int32, and floating point is touched once per super-block:
 *     Q4_K / Q5_K: sum = d d_x * S  -  dmin d_x * L,  S = sum_b sc_b sum_k q q_x,  L = sum_b mn_b (sum_k q_x over b)
 *     Q6_K:        sum = d d_x * S,  S = sum_s sc_s sum_k q q_x  -  32 sum_s sc_s (sum_k q_x over 16-input group s)
 * with q the weight's unsigned integers (Q6_K's 6-bit q before its -32). S and L are exact integers (|S| < 2^29),
 * so how a tier forms them does not change them: AVX2 in 8 int32 lanes (vpmaddubsw then vpmaddwd by the scale),
 * AVX512 two blocks per 512-bit register (vpdpwssd where VNNI is), the AMX tier's prefills in tiles of 16 x 16
 * (amx_k_tile.h), the portable build in plain loops; the lanes are added up once per super-block. Then, for each
 * row and column, in this order: acc = fma((float)S, d d_x, acc); low = fma((float)L, dmin d_x, low) (the scale
 * products rounded to fp32 first); after the last super-block acc - low, plus the bias.
 *
 * Included by quant_int8_rows.c after its lanes, Quantized and store definitions.
 */
#ifndef NVLLM_K_QUANT_TILE_H
#define NVLLM_K_QUANT_TILE_H

#define SUPER (GROUP * QBLOCK) /* 256 inputs */

/* a super-block's scales as integers: sc per block (Q4_K / Q5_K, slots 0-7) or per 16 inputs (Q6_K, 0-15);
 * mn2: Q4_K / Q5_K's mins, each twice (the pair of 16-input sums of its block meets it) */
typedef struct {
    int16_t sc[2 * GROUP], mn2[2 * GROUP];
    float d, dmin;
} KScales;

static inline void k_scales(const int type, const uint8_t *g, KScales *k) {
    if (type == GGUF_Q6_K) {
#if defined(__AVX2__)
        _mm256_storeu_si256((__m256i *)k->sc, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g + 192))));
#else
        for (int t = 0; t < 2 * GROUP; t++) k->sc[t] = ((const int8_t *)(g + 192))[t];
#endif
        k->d = fp16_to_float(read_u16(g + 208));
        k->dmin = 0.0f;
        return;
    }
    uint32_t scales[2], mins[2];
    k_scales_and_mins(g + 4, scales, mins);
#if defined(__AVX2__)
    const __m128i bytes = _mm_set_epi32((int)mins[1], (int)mins[0], (int)scales[1], (int)scales[0]); /* sc, mn */
    _mm_storeu_si128((__m128i *)k->sc, _mm_cvtepu8_epi16(bytes));
    const __m128i min_bytes = _mm_srli_si128(bytes, 8);
    _mm256_storeu_si256((__m256i *)k->mn2, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(min_bytes, min_bytes)));
#else
    for (int b = 0; b < GROUP; b++) {
        k->sc[b] = (int16_t)word_byte(scales, b);
        k->mn2[2 * b] = k->mn2[2 * b + 1] = (int16_t)word_byte(mins, b);
    }
#endif
    k->d = fp16_to_float(read_u16(g));
    k->dmin = fp16_to_float(read_u16(g + 2));
}

#if defined(__AVX2__)
typedef __m256i k_sums;
static inline k_sums k_sums_zero(void) { return _mm256_setzero_si256(); }

/* block b's 32 unsigned integers (Q6_K: 0..63, before its -32) */
static inline __m256i k_weight_ints(const uint8_t *g, int b, const int type) {
    if (type == GGUF_Q4_K) return bits_at(g + 16 + 32 * (b / 2), 4 * (b % 2), 15);
    if (type == GGUF_Q5_K)
        return _mm256_or_si256(bits_at(g + 48 + 32 * (b / 2), 4 * (b % 2), 15), _mm256_slli_epi16(bits_at(g + 16, b, 1), 4));
    const __m256i low = bits_at(g + 64 * (b / 4) + 32 * (b % 2), 4 * ((b / 2) % 2), 15);
    return _mm256_or_si256(low, _mm256_slli_epi16(bits_at(g + 128 + 32 * (b / 4), 2 * (b % 4), 3), 4));
}

/* the int16 scale of each pair of inputs of block b: sc_b, or Q6_K's sc[2b] (inputs 0-15), sc[2b+1] */
static inline __m256i k_block_scale(const KScales *k, int b, const int type) {
    if (type == GGUF_Q6_K)
        return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(k->sc[2 * b])),
                                       _mm_set1_epi16(k->sc[2 * b + 1]), 1);
    return _mm256_set1_epi16(k->sc[b]);
}

/* lanes += scale * (the 4-input sums of w x) */
static inline k_sums k_add_dot(k_sums sums, __m256i w, __m256i x, __m256i scale) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(sums, _mm256_maddubs_epi16(w, x), scale);
#else
    return _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale));
#endif
}

/* Q6_K: lane l -= 32 (sc_2l bs_2l + sc_2l+1 bs_2l+1) */
static inline k_sums k_q6_correct(k_sums sums, const KScales *k, const int16_t *bs) {
    const __m256i products = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)k->sc),
                                               _mm256_loadu_si256((const __m256i *)bs));
    return _mm256_sub_epi32(sums, _mm256_slli_epi32(products, 5));
}

/* Q4_K / Q5_K: lane l = mn_l (bs_2l + bs_2l+1), the min term of block l */
static inline k_sums k_min_lanes(const KScales *k, const int16_t *bs) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)k->mn2), _mm256_loadu_si256((const __m256i *)bs));
}

/* one row's running sums of the tile's (up to) 4 columns */
typedef __m128 k_row;
static inline k_row k_row_zero(void) { return _mm_setzero_ps(); }
static inline float k_row_at(k_row r, int j) {
    float v[4];
    _mm_storeu_ps(v, r);
    return v[j];
}

/* four sums' lanes added pairwise: the total of s_j is lane j plus lane j + 4 (exact integers: the order of
 * the additions does not matter) */
static inline __m256i k_halves4(k_sums s0, k_sums s1, k_sums s2, k_sums s3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
}

/* the totals of four sums' 8 lanes each, in lanes 0-3 */
static inline __m128i k_totals4(k_sums s0, k_sums s1, k_sums s2, k_sums s3) {
    const __m256i h = k_halves4(s0, s1, s2, s3);
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* acc_j = fma(S_j, scale_j, acc_j), S_j the total of s[j]'s 8 lanes (an exact integer), for 4 columns at once */
static inline k_row k_fuse(k_row acc, const k_sums s[4], const float scale[4]) {
    return _mm_fmadd_ps(_mm_cvtepi32_ps(k_totals4(s[0], s[1], s[2], s[3])), _mm_loadu_ps(scale), acc);
}
#else
typedef struct { int32_t v[LANES]; } k_sums;
static inline k_sums k_sums_zero(void) { k_sums z = {{0}}; return z; }

static inline void k_weight_ints(const uint8_t *g, int b, const int type, int8_t q[QBLOCK]) {
    block_integers(type, g, b, q);
    if (type == GGUF_Q6_K)
        for (int t = 0; t < QBLOCK; t++) q[t] = (int8_t)(q[t] + 32);
}

static inline k_sums k_add_dot(k_sums sums, const int8_t *w, const int8_t *x, const KScales *k, int b, const int type) {
    for (int l = 0; l < LANES; l++) {
        int32_t dot = 0;
        for (int t = 0; t < 4; t++) dot += w[4 * l + t] * x[4 * l + t];
        sums.v[l] += dot * (type == GGUF_Q6_K ? k->sc[2 * b + l / 4] : k->sc[b]);
    }
    return sums;
}

static inline k_sums k_q6_correct(k_sums sums, const KScales *k, const int16_t *bs) {
    for (int l = 0; l < LANES; l++) sums.v[l] -= 32 * (k->sc[2 * l] * bs[2 * l] + k->sc[2 * l + 1] * bs[2 * l + 1]);
    return sums;
}

static inline k_sums k_min_lanes(const KScales *k, const int16_t *bs) {
    k_sums m;
    for (int l = 0; l < LANES; l++) m.v[l] = k->mn2[2 * l] * bs[2 * l] + k->mn2[2 * l + 1] * bs[2 * l + 1];
    return m;
}

typedef struct { float v[4]; } k_row;
static inline k_row k_row_zero(void) { k_row z = {{0}}; return z; }
static inline float k_row_at(k_row r, int j) { return r.v[j]; }

static inline k_row k_fuse(k_row acc, const k_sums s[4], const float scale[4]) {
    for (int j = 0; j < 4; j++) {
        int32_t total = 0;
        for (int l = 0; l < LANES; l++) total += s[j].v[l];
        acc.v[j] = fmaf((float)total, scale[j], acc.v[j]);
    }
    return acc;
}
#endif

#if defined(__AVX512BW__)
/* AVX512: two blocks per 512-bit register (block 2c in the low half, 2c+1 in the high one), the halves' lanes
 * added at the end of the super-block: the same integers in the same 8 lanes as above */
typedef __m512i k_pair_sums;

/* 64 bytes: the 32 bytes at p in both halves, the low half shifted right by `low`, the high by `high`, masked */
static inline __m512i pair_bits(const uint8_t *p, int low, int high, int mask) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i counts = _mm512_inserti64x4(_mm512_set1_epi16((short)low), _mm256_set1_epi16((short)high), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(v, counts), _mm512_set1_epi8((char)mask));
}

/* blocks 2c and 2c+1's unsigned integers */
static inline __m512i k_pair_ints(const uint8_t *g, int c, const int type) {
    if (type == GGUF_Q4_K) return pair_bits(g + 16 + 32 * c, 0, 4, 15);
    if (type == GGUF_Q5_K)
        return _mm512_or_si512(pair_bits(g + 48 + 32 * c, 0, 4, 15),
                               _mm512_slli_epi16(pair_bits(g + 16, 2 * c, 2 * c + 1, 1), 4));
    /* Q6_K: the pair's low bits are 64 consecutive bytes, their high bits one 32-byte run at two shifts */
    const __m512i low = _mm512_and_si512(
        _mm512_srli_epi16(_mm512_loadu_si512((const void *)(g + 64 * (c / 2))), 4 * (c % 2)), _mm512_set1_epi8(15));
    return _mm512_or_si512(low, _mm512_slli_epi16(pair_bits(g + 128 + 32 * (c / 2), 4 * (c % 2), 4 * (c % 2) + 2, 3), 4));
}

/* the int16 scale of each pair of inputs of blocks 2c, 2c+1 (scales: KScales.sc in the low 16 slots) */
static inline __m512i k_pair_scale(__m512i scales, int c, const int type) {
    __m512i index;
    if (type == GGUF_Q6_K)
        index = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(
                                       _mm256_set1_epi16((short)(4 * c)), _mm_set1_epi16((short)(4 * c + 1)), 1)),
                                   _mm256_inserti128_si256(_mm256_set1_epi16((short)(4 * c + 2)),
                                                           _mm_set1_epi16((short)(4 * c + 3)), 1), 1);
    else
        index = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
    return _mm512_permutexvar_epi16(index, scales);
}

static inline k_pair_sums k_pair_add_dot(k_pair_sums sums, __m512i w, __m512i x, __m512i scale) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(sums, _mm512_maddubs_epi16(w, x), scale);
#else
    return _mm512_add_epi32(sums, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), scale));
#endif
}

static inline k_sums k_fold(k_pair_sums sums) {
    return _mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1));
}
#define K_NR 4 /* columns per tile, whatever the rows: 32 registers hold a 4 x 4 tile */
#else
#define K_NR 2 /* from two rows on (16 registers) */
#endif

/* rows [row, row + mr) x columns [0, nr) of a K-quant weight over all of K; mr, nr compile-time where inlined */
static inline __attribute__((always_inline)) void k_tile(const Quantized *a, long row, const uint8_t *w, long col_bytes,
                                                         const int type, const float *bias, long n0, void *out,
                                                         int out_bf16, long out_stride, const int mr, const int nr) {
    const long K = a->blocks * QBLOCK, supers = K / SUPER, bytes = gguf_block_bytes(type);
    k_row acc[MR], low[MR]; /* low: the Q4_K / Q5_K min terms */
    for (int i = 0; i < mr; i++) acc[i] = k_row_zero(), low[i] = k_row_zero();
    for (long s = 0; s < supers; s++) {
        KScales k[NR];
        for (int j = 0; j < nr; j++) k_scales(type, w + j * col_bytes + s * bytes, &k[j]);
#if defined(__AVX2__)
        prefetch_run(w + nr * s * bytes, nr * bytes, PREFETCH_AHEAD); /* the tile's columns, from memory */
#endif
        k_sums sums[MR][4], mins[4];
        for (int i = 0; i < mr; i++)
            for (int j = nr; j < 4; j++) sums[i][j] = k_sums_zero();
        for (int j = nr; j < 4; j++) mins[j] = k_sums_zero();
#if defined(__AVX512BW__)
        __m512i scales[NR];
        for (int j = 0; j < nr; j++) scales[j] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)k[j].sc));
        k_pair_sums pairs[MR][NR];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) pairs[i][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < GROUP / 2; c++) {
            __m512i wq[NR], scale[NR];
            for (int j = 0; j < nr; j++) {
                wq[j] = k_pair_ints(w + j * col_bytes + s * bytes, c, type);
                scale[j] = k_pair_scale(scales[j], c, type);
            }
            for (int i = 0; i < mr; i++) {
                const __m512i xq = _mm512_loadu_si512((const void *)(a->q + (row + i) * K + s * SUPER + 2 * c * QBLOCK));
                for (int j = 0; j < nr; j++) pairs[i][j] = k_pair_add_dot(pairs[i][j], wq[j], xq, scale[j]);
            }
        }
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) sums[i][j] = k_fold(pairs[i][j]);
#else
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) sums[i][j] = k_sums_zero();
#pragma GCC unroll 8
        for (int b = 0; b < GROUP; b++) {
            const long at = s * SUPER + b * QBLOCK;
#if defined(__AVX2__)
            __m256i wq[NR], scale[NR];
            for (int j = 0; j < nr; j++) {
                wq[j] = k_weight_ints(w + j * col_bytes + s * bytes, b, type);
                scale[j] = k_block_scale(&k[j], b, type);
            }
            for (int i = 0; i < mr; i++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + at));
                for (int j = 0; j < nr; j++) sums[i][j] = k_add_dot(sums[i][j], wq[j], xq, scale[j]);
            }
#else
            int8_t wq[NR][QBLOCK];
            for (int j = 0; j < nr; j++) k_weight_ints(w + j * col_bytes + s * bytes, b, type, wq[j]);
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++)
                    sums[i][j] = k_add_dot(sums[i][j], wq[j], a->q + (row + i) * K + at, &k[j], b, type);
#endif
        }
#endif
        for (int i = 0; i < mr; i++) {
            const float dx = a->d[(row + i) * a->slots + s];
            const int16_t *bs = a->bsums + (row + i) * (K / 16) + s * 16;
            float scale[4] = {0}, min_scale[4] = {0};
            for (int j = 0; j < nr; j++) {
                scale[j] = k[j].d * dx;
                min_scale[j] = k[j].dmin * dx;
                if (type == GGUF_Q6_K) sums[i][j] = k_q6_correct(sums[i][j], &k[j], bs);
                else mins[j] = k_min_lanes(&k[j], bs);
            }
            acc[i] = k_fuse(acc[i], sums[i], scale);
            if (type != GGUF_Q6_K) low[i] = k_fuse(low[i], mins, min_scale);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(k_row_at(acc[i], j) - k_row_at(low[i], j), bias, n0 + j, out, out_bf16, (row + i) * out_stride + n0 + j);
}
#endif
