/* Linear layers whose weights stay quantized in memory (quant_bf16_dot.c's packed GGUF Q4_0, Q4_1, Q8_0 blocks and
 * per-channel int8) for the amx tier: a few rows on AVX512-BF16, more on AMX tiles (TDPBF16PS), the same bits.
 *
 * Every product is an exact integer, so no order of adding them can round: each input row is written per block of
 * 32 inputs as a scale s (its largest |x| / 32767) and integers n = round(x / s) in [-32767, 32767], split into
 * two digits n = 256 hi + lo (hi in [-128, 127], lo in [0, 255]), each exact in bf16. The weights are
 * quant_bf16_dot.c's bf16 words: 128 + q for Q4 (q in [0, 15]), q for Q8, exact. A block's digit sums
 * sum_k hi_k w_k and sum_k lo_k w_k stay below 2^21 in magnitude: exact in fp32 whichever unit adds them and in
 * whatever order (vdpbf16ps pairs or a tile's steps); for Q4 each less 128 times its digits' sum (exact too) is
 * sum_k hi_k q_k and sum_k lo_k q_k. The block's sum_k n_k q_k, rounded once to fp32, then folds into the column's
 * fp32 total in fold_block_sum's fixed sequence:
 *     total += (d s) * (256 hi_sum + lo_sum)  [+ m * (s sum_k n_k) for Q4],
 * blocks in order, s sum_k n_k (the block's inputs as quantized, summed) rounded once per row and block. The
 * inputs lose at most a block's largest |x| / 65534 each (bf16 keeps |x| / 256), so the result is the exact
 * product but for that and fp32's roundings.
 *
 * A row's result is therefore the same bits at every M, on either unit, in any tile and on any thread (batch
 * invariant): up to AVX512_ROWS rows run register tiles that unpack the weights as they go (a decode step reads
 * each weight once, bound by memory), more run tiles over slabs unpacked once into L2 (bound by the tiles).
 * Where the OS refuses the tile state, every M runs the register tiles.
 *
 * AMX tiles: C 0-3 (digit-row tiles 0, 1 x panels 0, 1), A 4-5, B 6-7: 16 input rows (32 digit rows) x 2 panels
 * per pass, one block (one tile step) at a time; the block's sums leave the tiles to be folded.
 *
 * Prompt rows have an arithmetic of their own (quant_prompt_linear_bf16, at the end): the dequantized model's
 * weights on amx_gemm.c's tiles, whose sums stay in the tiles over all of K (the fold above bounds the integer
 * tiles at about a third of that rate). The engine hands a step's prompt tokens to it and its output tokens to the
 * integer arithmetic, a split by each token's role in its own request, never by the batch.
 */
#include "amx_tiles.h"

#define quant_linear_bf16 vector_quant_linear_bf16
#define quant_linear_silu_mul_bf16 vector_quant_linear_silu_mul_bf16
#include "quant_bf16_dot.c"
#undef quant_linear_bf16
#undef quant_linear_silu_mul_bf16

#include "amx_panels.h"   /* amx_ready, TILE_ROWS (digit rows per tile A / C here), amx_columns */
#include "gguf_q5_panel.h" /* quant_int8_rows.c's Q5_0 / Q5_1 weights as bf16 panels */

#define PASS_INPUTS 16    /* input rows per tile pass: 32 digit rows */
#define INT_MR 8          /* input rows per register tile, at most */
#define INT_NR 8          /* panels per register tile of one row; 2-4 rows take 4, 5-8 rows 2 */
#ifndef AVX512_ROWS
#define AVX512_ROWS 64 /* up to this many rows: register tiles (as fast as the tiles or faster below 128, measured); more: AMX */
#endif

/* ---- the inputs as digits ----------------------------------------------------------------------------------- */

/* rows of x -> per row and block of 32 inputs a scale s, the integers n = round(x / s), their sum (int32 in
 * n_sums) and s times it (sums), the integers either as two bf16 digits for the AMX tiles (digits [M][2][K]: row
 * i's hi, then its lo digits; digit_offsets [M][blocks][2]: 128 times the block's hi and lo digits' sums) or as
 * int16 for the register tiles (ints [M][K]); the other pointers NULL */
static void to_digits(const bf16 *x, long M, long K, long x_stride, bf16 *digits, float *digit_offsets, int16_t *ints,
                      float *scales, float *sums, int32_t *n_sums) {
    const long blocks = K / QBLOCK;
    for (long i = 0; i < M; i++)
        for (long b = 0; b < blocks; b++) {
            const bf16 *p = x + i * x_stride + b * QBLOCK;
            const __m512 v0 = widen(_mm256_loadu_si256((const __m256i *)p));
            const __m512 v1 = widen(_mm256_loadu_si256((const __m256i *)(p + 16)));
            const float most = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float s = most > 0.0f ? most / 32767.0f : 0.0f, inverse = most > 0.0f ? 32767.0f / most : 0.0f;
            /* n = round(x / s) to nearest even, kept in [-32767, 32767] (x / s may round a few ulps past) */
            const __m512i low = _mm512_set1_epi32(-32767), high = _mm512_set1_epi32(32767);
            const __m512i n[2] = {
                _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inverse))), low), high),
                _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inverse))), low), high)};
            __m512i hi_sum = _mm512_setzero_si512(), lo_sum = _mm512_setzero_si512();
            for (int half = 0; half < 2; half++) {
                if (ints) {
                    _mm256_storeu_si256((__m256i *)(ints + i * K + b * QBLOCK + 16 * half), _mm512_cvtepi32_epi16(n[half]));
                    continue;
                }
                /* hi = n >> 8 in [-128, 127], lo = n & 255: n = 256 hi + lo */
                bf16 *hi = digits + 2 * i * K + b * QBLOCK + 16 * half, *lo = hi + K;
                const __m512i high_digits = _mm512_srai_epi32(n[half], 8);
                const __m512i low_digits = _mm512_and_si512(n[half], _mm512_set1_epi32(255));
                hi_sum = _mm512_add_epi32(hi_sum, high_digits);
                lo_sum = _mm512_add_epi32(lo_sum, low_digits);
                _mm256_storeu_si256((__m256i *)hi, to_bf16(_mm512_cvtepi32_ps(high_digits)));
                _mm256_storeu_si256((__m256i *)lo, to_bf16(_mm512_cvtepi32_ps(low_digits)));
            }
            if (digits) {
                digit_offsets[2 * (i * blocks + b)] = 128.0f * (float)_mm512_reduce_add_epi32(hi_sum);
                digit_offsets[2 * (i * blocks + b) + 1] = 128.0f * (float)_mm512_reduce_add_epi32(lo_sum);
            }
            const int32_t total = _mm512_reduce_add_epi32(_mm512_add_epi32(n[0], n[1]));
            scales[i * blocks + b] = s;
            sums[i * blocks + b] = s * (float)total; /* (float)total is exact: |total| < 2^21 */
            n_sums[i * blocks + b] = total;
        }
}

/* a block's scale d and (Q4) offset m of a panel's 16 columns; head: the panel's block */
static inline __attribute__((always_inline)) void block_scales(const uint8_t *head, int q4, __m512 *d, __m512 *m) {
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
    *m = q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32))) : _mm512_setzero_ps();
}

/* one block's sum sum_k n_k q_k (fp32: the exact integer rounded once) into a row's running totals of 16 columns,
 * input_sum: s sum_k n_k; the one sequence both units' tiles call */
static inline __attribute__((always_inline)) __m512 fold_block_sum(__m512 total, __m512 block, __m512 d, __m512 m,
                                                                   float s, float input_sum, int q4) {
    total = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(s)), block, total);
    if (q4) total = _mm512_fmadd_ps(m, _mm512_set1_ps(input_sum), total);
    return total;
}

/* ---- a few rows: register tiles ----------------------------------------------------------------------------- */

/* rows [0, mr) x panels [0, nr) over all of K from the packed blocks, in integers: a panel's words for an input
 * pair unpacked to int16 (q for Q4, u = q + 128 for Q8), and vpdpwssd adds pairs of products n w to int32 sums
 * (|sum| < 2^28: exact). A block's sum is then the tiles' exactly: sum_k n_k q_k for Q4, sum_k n_k u_k - 128
 * sum_k n_k for Q8, rounded once to fp32 as the tiles' 256 hi + lo is. On this tier vdpbf16ps took 6-11 FMAs'
 * time and vpdpwssd 3 (0.84-1.47, 0.43 and 0.14 ns, measured). ints: the rows' integers, [row][K]. */
static inline __attribute__((always_inline)) void int_tile(const int16_t *ints, long K, const float *scales,
                                                           const float *sums, const int32_t *n_sums,
                                                           const uint8_t *panels, const int q4, const float *bias,
                                                           bf16 *out, long out_stride, long n0, long N,
                                                           const bf16 *silu, const int mr, const int nr) {
    const long blocks = K / QBLOCK, bb = q4 ? Q4_BLOCK_BYTES : Q8_BLOCK_BYTES, panel_bytes = blocks * bb;
    const int header = q4 ? 64 : 32;
    __m512 total[INT_MR][INT_NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) total[i][j] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        __m512i acc[INT_MR][INT_NR];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_si512();
        const int16_t *nb = ints + b * QBLOCK;
        for (int g = 0; g < (q4 ? 4 : 8); g++) {
            __m512i z[INT_NR];
            for (int j = 0; j < nr; j++) z[j] = _mm512_loadu_si512(panels + j * panel_bytes + b * bb + header + g * 64);
            for (int part = 0; part < (q4 ? 4 : 2); part++) {
                const int pair = q4 ? 4 * g + part : 2 * g + part; /* the input pair these words hold */
                __m512i w[INT_NR];
                for (int j = 0; j < nr; j++)
                    w[j] = q4 ? _mm512_and_si512(_mm512_srli_epi16(z[j], 4 * part), _mm512_set1_epi16(15))
                         : part ? _mm512_srli_epi16(z[j], 8) : _mm512_and_si512(z[j], _mm512_set1_epi16(255));
                for (int i = 0; i < mr; i++) {
                    int32_t two; /* the row's integers of the pair, as one dword */
                    memcpy(&two, nb + i * K + 2 * pair, 4);
                    for (int j = 0; j < nr; j++) acc[i][j] = _mm512_dpwssd_epi32(acc[i][j], _mm512_set1_epi32(two), w[j]);
                }
            }
        }
        for (int j = 0; j < nr; j++) {
            __m512 d, m;
            block_scales(panels + j * panel_bytes + b * bb, q4, &d, &m);
            for (int i = 0; i < mr; i++) {
                const __m512i exact =
                    q4 ? acc[i][j] : _mm512_sub_epi32(acc[i][j], _mm512_set1_epi32(128 * n_sums[i * blocks + b]));
                total[i][j] = fold_block_sum(total[i][j], _mm512_cvtepi32_ps(exact), d, m, scales[i * blocks + b],
                                             sums[i * blocks + b], q4);
            }
        }
    }
    store_tile(&total[0][0], INT_NR, bias, out, out_stride, n0, N, silu, mr, nr);
}

#define INT_TILE(Q4, MRV, NRV)                                                                                   \
    int_tile(ints + m * K, K, scales + m * blocks, sums + m * blocks, n_sums + m * blocks, panels, Q4, bias,     \
             out + m * out_stride, out_stride, n0, N, silu, MRV, NRV)
#define INT_TILES(Q4)                                                                                         \
    switch (mr * 16 + nr) {                                                                                   \
    case 16 + 1: INT_TILE(Q4, 1, 1); break;                                                                   \
    case 16 + 2: INT_TILE(Q4, 1, 2); break;                                                                   \
    case 16 + 3: INT_TILE(Q4, 1, 3); break;                                                                   \
    case 16 + 4: INT_TILE(Q4, 1, 4); break;                                                                   \
    case 16 + 5: INT_TILE(Q4, 1, 5); break;                                                                   \
    case 16 + 6: INT_TILE(Q4, 1, 6); break;                                                                   \
    case 16 + 7: INT_TILE(Q4, 1, 7); break;                                                                   \
    case 16 + 8: INT_TILE(Q4, 1, 8); break;                                                                   \
    case 32 + 1: INT_TILE(Q4, 2, 1); break;                                                                   \
    case 32 + 2: INT_TILE(Q4, 2, 2); break;                                                                   \
    case 32 + 3: INT_TILE(Q4, 2, 3); break;                                                                   \
    case 32 + 4: INT_TILE(Q4, 2, 4); break;                                                                   \
    case 48 + 1: INT_TILE(Q4, 3, 1); break;                                                                   \
    case 48 + 2: INT_TILE(Q4, 3, 2); break;                                                                   \
    case 48 + 3: INT_TILE(Q4, 3, 3); break;                                                                   \
    case 48 + 4: INT_TILE(Q4, 3, 4); break;                                                                   \
    case 64 + 1: INT_TILE(Q4, 4, 1); break;                                                                   \
    case 64 + 2: INT_TILE(Q4, 4, 2); break;                                                                   \
    case 64 + 3: INT_TILE(Q4, 4, 3); break;                                                                   \
    case 64 + 4: INT_TILE(Q4, 4, 4); break;                                                                   \
    case 80 + 1: INT_TILE(Q4, 5, 1); break;                                                                   \
    case 80 + 2: INT_TILE(Q4, 5, 2); break;                                                                   \
    case 96 + 1: INT_TILE(Q4, 6, 1); break;                                                                   \
    case 96 + 2: INT_TILE(Q4, 6, 2); break;                                                                   \
    case 112 + 1: INT_TILE(Q4, 7, 1); break;                                                                  \
    case 112 + 2: INT_TILE(Q4, 7, 2); break;                                                                  \
    case 128 + 1: INT_TILE(Q4, 8, 1); break;                                                                  \
    default: INT_TILE(Q4, 8, 2); break;                                                                       \
    }

/* panels [p_begin, p_end) for every row on register tiles: one row 8 panels at a time (more weight streams in
 * flight), up to 4 rows 4, up to 8 rows 2 (each weight vector unpacked once for 8 rows: 1.1-1.2x 4 x 4 tiles at
 * 16-32 rows, measured) */
static void register_columns(const int16_t *ints, long M, long K, const float *scales, const float *sums,
                             const int32_t *n_sums, const uint8_t *packed, int format, long N, const float *bias,
                             bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end) {
    const long blocks = K / QBLOCK, panel_bytes = blocks * block_bytes(format);
    for (long m = 0; m < M; m += INT_MR) {
        const long mr = M - m < INT_MR ? M - m : INT_MR;
        const int width = mr == 1 ? INT_NR : mr <= 4 ? INT_NR / 2 : INT_NR / 4;
        for (long p = p_begin; p < p_end; p += width) {
            const int nr = p_end - p < width ? (int)(p_end - p) : width;
            const uint8_t *panels = packed + p * panel_bytes;
            const long n0 = p * LANES;
            if (format == FORMAT_Q4) {
                INT_TILES(1)
            } else {
                INT_TILES(0)
            }
        }
    }
}
#undef INT_TILES
#undef INT_TILE

/* ---- more rows: AMX tiles ----------------------------------------------------------------------------------- */

/* input rows [0, rows <= 16) (digit rows [0, 2 rows)) x panels w0 (and w1 where not NULL) over every block, into
 * totals [input row][panel][16]; w: a panel's unpacked words (16 vectors per block), head: its packed blocks.
 * The tiles configured by amx_configure_pass for the digit rows. */
static void tile_pass(const bf16 *digits, long K, int rows, const __m512bh *w0, const __m512bh *w1,
                      const uint8_t *head0, const uint8_t *head1, long bb, const float *scales, const float *sums,
                      const float *digit_offsets, int q4, float totals[PASS_INPUTS][2][LANES]) {
    float block[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));
    const long blocks = K / QBLOCK, stride = K * (long)sizeof(bf16);
    const int r1 = 2 * rows > TILE_ROWS ? 2 * rows - TILE_ROWS : 0;
    const uint8_t *heads[2] = {head0, head1};
    __m512 t[PASS_INPUTS][2];
    for (int i = 0; i < rows; i++) t[i][0] = t[i][1] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        _tile_zero(0);
        _tile_loadd(4, digits + b * QBLOCK, stride);
        _tile_loadd(6, w0 + b * (QBLOCK / 2), 64);
        _tile_dpbf16ps(0, 4, 6);
        if (w1) {
            _tile_zero(1);
            _tile_loadd(7, w1 + b * (QBLOCK / 2), 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (r1) {
            _tile_zero(2);
            _tile_loadd(5, digits + TILE_ROWS * K + b * QBLOCK, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (w1) {
                _tile_zero(3);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, block[0][0], 64);
        if (w1) _tile_stored(1, block[0][1], 64);
        if (r1) {
            _tile_stored(2, block[1][0], 64);
            if (w1) _tile_stored(3, block[1][1], 64);
        }
        for (int j = 0; j < (w1 ? 2 : 1); j++) {
            __m512 d, m;
            block_scales(heads[j] + b * bb, q4, &d, &m);
            for (int i = 0; i < rows; i++) { /* digit rows 2i (hi), 2i + 1 (lo) */
                const float *c = block[i / (TILE_ROWS / 2)][j] + (2 * i % TILE_ROWS) * LANES;
                __m512 hi_sum = _mm512_load_ps(c), lo_sum = _mm512_load_ps(c + LANES);
                if (q4) { /* the words are 128 + q: less 128 times the digits' sums, exactly */
                    hi_sum = _mm512_sub_ps(hi_sum, _mm512_set1_ps(digit_offsets[2 * (i * blocks + b)]));
                    lo_sum = _mm512_sub_ps(lo_sum, _mm512_set1_ps(digit_offsets[2 * (i * blocks + b) + 1]));
                }
                const __m512 block_sum = _mm512_fmadd_ps(_mm512_set1_ps(256.0f), hi_sum, lo_sum);
                t[i][j] = fold_block_sum(t[i][j], block_sum, d, m, scales[i * blocks + b], sums[i * blocks + b], q4);
            }
        }
    }
    for (int i = 0; i < rows; i++) {
        _mm512_store_ps(totals[i][0], t[i][0]);
        _mm512_store_ps(totals[i][1], t[i][1]);
    }
}

/* panels [p_begin, p_end) for every row on AMX tiles: a slab of panels unpacked at a time, input rows in chunks
 * whose digits stay in L2, 16 rows x a pair of panels (gated: a gate panel and its up panel) per pass */
static void tile_columns(const bf16 *digits, long M, long K, const float *scales, const float *sums,
                         const float *digit_offsets, const uint8_t *packed, int format, long N, const float *bias,
                         bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end, long slab,
                         __m512bh *buffer) {
    float totals[PASS_INPUTS][2][LANES] __attribute__((aligned(64)));
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    const long slab_panel = blocks * unpacked_vectors(format);
    long chunk = ROW_CHUNK_BYTES / (2 * K * (long)sizeof(bf16)) / PASS_INPUTS * PASS_INPUTS;
    if (chunk < PASS_INPUTS) chunk = PASS_INPUTS;
    int configured = -1;
    for (long s = p_begin; s < p_end; s += slab) {
        const long count = p_end - s < slab ? p_end - s : slab;
        for (long p = 0; p < count; p++) unpack_panel(packed + (s + p) * panel_bytes, K, format, buffer + p * slab_panel);
        for (long m0 = 0; m0 < M; m0 += chunk) {
            const long m_end = M - m0 < chunk ? M : m0 + chunk;
            for (long p = 0; p < count; p += 2) {
                const int pair = count - p >= 2;
                const uint8_t *head = packed + (s + p) * panel_bytes;
                const long n0 = (s + p) * LANES;
                for (long m = m0; m < m_end; m += PASS_INPUTS) {
                    const int rows = m_end - m < PASS_INPUTS ? (int)(m_end - m) : PASS_INPUTS;
                    const int r0 = 2 * rows < TILE_ROWS ? 2 * rows : TILE_ROWS, r1 = 2 * rows - r0;
                    if (r0 * 32 + r1 != configured) amx_configure_pass(r0, r1), configured = r0 * 32 + r1;
                    tile_pass(digits + 2 * m * K, K, rows, buffer + p * slab_panel,
                              pair ? buffer + (p + 1) * slab_panel : NULL, head, pair ? head + panel_bytes : NULL, bb,
                              scales + m * blocks, sums + m * blocks, digit_offsets + 2 * m * blocks,
                              format == FORMAT_Q4, totals);
                    for (int i = 0; i < rows; i++) {
                        bf16 *o = out + (m + i) * out_stride;
                        if (silu) {
                            store_gated(_mm512_load_ps(totals[i][0]), _mm512_load_ps(totals[i][1]), bias, n0 / 2, o,
                                        silu);
                        } else {
                            store_columns(_mm512_load_ps(totals[i][0]), bias, o, n0, N);
                            if (pair) store_columns(_mm512_load_ps(totals[i][1]), bias, o, n0 + LANES, N);
                        }
                    }
                }
            }
        }
    }
    if (configured >= 0) _tile_release();
}

/* ---- entry points ------------------------------------------------------------------------------------------- */

static int digit_run(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                     const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    const PanelSplit split = panel_split(M, N, K, silu != NULL, num_threads);
    const long blocks = K / QBLOCK;
    const int tiles = M > AVX512_ROWS && amx_permitted();
    void *digits = malloc(sizeof(int16_t) * 2 * M * K); /* bf16 digits, or int16 integers */
    float *scales = malloc(sizeof(float) * 5 * M * blocks), *sums = scales + M * blocks;
    float *digit_offsets = sums + M * blocks; /* [M][blocks][2] */
    int32_t *n_sums = (int32_t *)(digit_offsets + 2 * M * blocks);
    if (!digits || !scales) {
        free(digits);
        free(scales);
        return -1;
    }
    const long unpacked_panel_bytes = blocks * unpacked_vectors(format) * 64;
    long slab = SLAB_BYTES / unpacked_panel_bytes / NR * NR;
    if (slab < NR) slab = NR;
    int failed = 0;
#pragma omp parallel num_threads(split.threads) if (split.threads > 1)
    {
        /* each thread writes its share of the rows' digits (a row's are the same whichever thread writes them) */
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        const long t = omp_get_thread_num(), n = omp_get_num_threads(), r0 = M * t / n, r1 = M * (t + 1) / n;
        to_digits(x + r0 * x_stride, r1 - r0, K, x_stride, tiles ? (bf16 *)digits + 2 * r0 * K : NULL,
                  tiles ? digit_offsets + 2 * r0 * blocks : NULL, tiles ? NULL : (int16_t *)digits + r0 * K,
                  scales + r0 * blocks, sums + r0 * blocks, n_sums + r0 * blocks);
#pragma omp barrier
        long begin, end;
        thread_panels(&split, &begin, &end);
        if (!tiles) {
            register_columns(digits, M, K, scales, sums, n_sums, packed, format, N, bias, out, out_stride, silu, begin,
                             end);
        } else {
            __m512bh *buffer = scratch_or_fail(slab * unpacked_panel_bytes, &failed);
            if (buffer)
                tile_columns(digits, M, K, scales, sums, digit_offsets, packed, format, N, bias, out, out_stride, silu,
                             begin, end, slab, buffer);
        }
    }
    free(digits);
    free(scales);
    return failed ? -1 : 0;
}

/* quant_bf16_dot.c's quant_linear_bf16 with this file's arithmetic (every_row_alike: every M is alike here) */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    (void)every_row_alike;
    return digit_run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, num_threads);
}

/* quant_bf16_dot.c's quant_linear_silu_mul_bf16 with this file's arithmetic */
int quant_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format,
                               long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                               int every_row_alike, int num_threads) {
    (void)every_row_alike;
    return digit_run(x, M, K, x_stride, packed, format, 2 * I, bias, out, out_stride, silu, num_threads);
}

/* ---- prompt rows: the dequantized model's arithmetic on AMX tiles ------------------------------------------ */

/* out [M, N] = x @ W^T + bias for rows that are prompt tokens (the engine passes only those): each thread
 * dequantizes its columns per slab to bf16(d q + m), the dequantized model's weights bit for bit, and amx_gemm.c's
 * passes multiply them, so a row's bits are amx_gemm.c's on the dequantized weights, whatever M (TDPBF16PS
 * computes each row of a tile from that row alone). Bound by the tiles, not by the fold of exact block sums:
 * 2-3x this file's integer tiles on a prefill. A request's prompt rows always take this arithmetic and its output
 * rows the integer one, so its result still depends on nothing but itself (the prefix cache keys blocks by role). */
int quant_prompt_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                             const float *bias, bf16 *out, long out_stride, int num_threads) {
    return dequantized_run(x, M, K, x_stride, packed, format, packed_panel, N, bias, out, out_stride, NULL,
                           amx_permitted() ? amx_columns : columns, num_threads);
}

/* quant_prompt_linear_bf16 for a gated weight: silu(gate) * up, as quant_linear_silu_mul_bf16 */
int quant_prompt_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed,
                                      int format, long I, const float *bias, bf16 *out, long out_stride,
                                      const bf16 *silu, int num_threads) {
    return dequantized_run(x, M, K, x_stride, packed, format, packed_panel, 2 * I, bias, out, out_stride, silu,
                           amx_permitted() ? amx_columns : columns, num_threads);
}

/* The prompt rows of a GGUF Q5_0 or Q5_1 layer that quant_int8_rows.c keeps (its layout: the file's rows), on AMX tiles
 * with the dequantized model's weights, as quant_prompt_linear_bf16 runs this file's formats: a row's bits are
 * amx_gemm.c's on the dequantized weights, whatever M. quant_int8_rows.c's 8-bit rows stay the arithmetic of output
 * rows. 1 (nothing done) for the other types: the K-quants' prompts keep quant_int8_rows.c's int8 tiles (amx_k_tile.h),
 * one arithmetic for every row. */
int dot_prompt_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *rows, int type, long N,
                           const float *bias, bf16 *out, long out_stride, int num_threads) {
    if (!q5_type(type) || K % QBLOCK) return 1;
    return dequantized_run(x, M, K, x_stride, rows, type, q5_dequantize_panel, N, bias, out, out_stride, NULL,
                           amx_permitted() ? amx_columns : columns, num_threads);
}
