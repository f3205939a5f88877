/* quant_int8_rows.c's K-quant prefills on the AMX tier: the integers of k_quant_tile.h formed by AMX int8 tiles.
 *
 * A super-block's S = sum_k v_k q_x,k with v_k the weight's integer times its sub-block scale (Q4_K / Q5_K:
 * q sc_b, 0..1953; Q6_K: (q - 32) sc_s, -4064..4096: its -32 folded in). v does not fit a byte, so it is split,
 * v = 256 hi + lo with lo = v & 255 (unsigned) and hi = v >> 8 (Q6_K's signed), and
 *     S = sum_k lo_k q_x,k + 256 sum_k hi_k q_x,k,
 * two plain int8 products over the whole super-block: TDPBUSD for lo (and Q4_K / Q5_K's hi), TDPBSSD for Q6_K's
 * hi, four 64-input steps into the same tiles C, stored once per super-block. A weight's 16 columns (outputs) are
 * unpacked so once per chunk of rows (tile A: 16 columns x 64 inputs); the rows' 8-bit inputs are laid out for
 * tile B (AMX's 4-byte groups: for each 4 inputs, 16 rows' 4 bytes side by side). Q4_K / Q5_K's min term L comes
 * from the rows' 16-input sums in pairs (vpdpwssd). The same exact integers S and L as every other tier's tile,
 * then the same fp32 steps per row and column (k_quant_tile.h): a row's bits do not depend on which path ran it,
 * so choosing by the row count keeps results batch invariant.
 *
 * Linux hands out AMX's tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); where that fails the
 * other tile runs.
 *
 * Included by quant_int8_rows.c on the AMX tier, after k_quant_tile.h.
 */
#ifndef NVLLM_AMX_K_TILE_H
#define NVLLM_AMX_K_TILE_H
#include "amx_tiles.h"

/* fewer rows: k_quant_tile.h's tile. Measured on the AMX Xeon, Q4_K / Q6_K on Qwen2.5-Coder 0.5B and 1.5B shapes,
 * the int8 tiles against it: 0.4-0.6x at 8 rows, 0.9-1.2x at 16, 1.3-2.4x at 24, 1.8-3.4x at 32 */
#define AMX_MIN_ROWS 24
#define AMX_CHUNK_BYTES (1L << 23) /* the rows' tile-B inputs that stay in L2 while a thread's columns pass over them */
#define AMX_COLS 16       /* columns per tile A */
#define AMX_TILE_ROWS 16  /* rows per tile B */
#define AMX_ROWS 32       /* rows per pass: two tiles B */
#define AMX_STEP 64       /* inputs per tile product */

/* two int16 as one int32 word, lo first: a vpdpwssd pair */
static inline int32_t pair_word(int lo, int hi) { return (int32_t)(((uint32_t)(uint16_t)hi << 16) | (uint16_t)lo); }

/* the rows' inputs as the tiles read them, 16 rows at a time: x4[r / 16][g][r % 16] = inputs 4g..4g+3 of row r
 * (a tile B is 1 KB in a row); dx[s][r]: d_x of super-block s; pairs[s][p][r]: the 32-input sums 2p and 2p+1
 * of super-block s (int16 each, |sum| <= 4064) as one int32 word. Rows padded with zeros to a multiple of AMX_ROWS. */
typedef struct {
    int32_t *x4, *pairs;
    float *dx;
    long rows;
} AmxInputs;

static int amx_inputs(const Quantized *a, long M, AmxInputs *v, int threads) {
    const long K = a->blocks * QBLOCK, groups = K / 4, supers = K / SUPER, rows = (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    v->rows = rows;
    v->x4 = calloc(groups * rows, sizeof(int32_t));
    v->pairs = calloc(supers * 4 * rows, sizeof(int32_t));
    v->dx = calloc(supers * rows, sizeof(float));
    if (!v->x4 || !v->pairs || !v->dx) return -1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long r = 0; r < M; r++) {
        const int32_t *row = (const int32_t *)(a->q + r * K);
        int32_t *x4 = v->x4 + (r / AMX_TILE_ROWS) * groups * AMX_TILE_ROWS + r % AMX_TILE_ROWS;
        for (long g = 0; g < groups; g++) x4[g * AMX_TILE_ROWS] = row[g];
        const int16_t *sums = a->bsums + r * (K / 16);
        for (long s = 0; s < supers; s++) {
            v->dx[s * rows + r] = a->d[r * a->slots + s];
            for (int p = 0; p < 4; p++) {
                const int16_t *at = sums + s * 16 + 4 * p; /* 16-input sums of blocks 2p and 2p+1 */
                v->pairs[(s * 4 + p) * rows + r] = pair_word(at[0] + at[1], at[2] + at[3]);
            }
        }
    }
    return 0;
}

static void amx_inputs_free(AmxInputs *v) {
    free(v->x4);
    free(v->pairs);
    free(v->dx);
}

/* 16 columns of a weight over all of K, unpacked: lo and hi bytes of v (lo[k / 64][j][k % 64]: a tile A is 1 KB
 * in a row), Q4_K / Q5_K's mins in pair words (mn_2p, mn_2p+1), d and dmin, per super-block */
typedef struct {
    uint8_t *lo, *hi;  /* [K / 64][AMX_COLS][64] */
    int32_t *min_pair; /* [AMX_COLS][supers][4] */
    float *d, *dmin;   /* [AMX_COLS][supers] */
} AmxColumns;

/* v's 16 values from 16 weight bytes times their scale, split into lo and hi bytes at lo_at, hi_at */
static inline void amx_split(__m128i ints, int16_t scale, const int type, uint8_t *lo_at, uint8_t *hi_at) {
    __m256i v = _mm256_cvtepu8_epi16(ints);
    if (type == GGUF_Q6_K) v = _mm256_sub_epi16(v, _mm256_set1_epi16(32));
    v = _mm256_mullo_epi16(v, _mm256_set1_epi16(scale));
    _mm_storeu_si128((__m128i *)lo_at, _mm256_cvtepi16_epi8(_mm256_and_si256(v, _mm256_set1_epi16(255))));
    _mm_storeu_si128((__m128i *)hi_at, _mm256_cvtepi16_epi8(_mm256_srai_epi16(v, 8)));
}

static void amx_unpack(const uint8_t *w, long col_bytes, int cols, long K, const int type, AmxColumns *c) {
    const long supers = K / SUPER, bytes = gguf_block_bytes(type);
    for (int j = 0; j < AMX_COLS; j++) {
        if (j >= cols) { /* past the weight's last column: zeros, never stored */
            for (long k = 0; k < K; k += AMX_STEP) {
                memset(c->lo + k * AMX_COLS + j * AMX_STEP, 0, AMX_STEP);
                memset(c->hi + k * AMX_COLS + j * AMX_STEP, 0, AMX_STEP);
            }
            memset(c->min_pair + j * supers * 4, 0, supers * 4 * sizeof(int32_t));
            for (long s = 0; s < supers; s++) c->d[j * supers + s] = c->dmin[j * supers + s] = 0.0f;
            continue;
        }
        for (long s = 0; s < supers; s++) {
            const uint8_t *g = w + j * col_bytes + s * bytes;
            KScales k;
            k_scales(type, g, &k);
            for (int b = 0; b < GROUP; b++) {
                const __m256i ints = k_weight_ints(g, b, type);
                for (int half = 0; half < 2; half++) {
                    const long at = s * SUPER + b * QBLOCK + 16 * half;
                    const long to = (at / AMX_STEP) * AMX_STEP * AMX_COLS + j * AMX_STEP + at % AMX_STEP;
                    const int16_t scale = type == GGUF_Q6_K ? k.sc[2 * b + half] : k.sc[b];
                    amx_split(half ? _mm256_extracti128_si256(ints, 1) : _mm256_castsi256_si128(ints), scale, type,
                              c->lo + to, c->hi + to);
                }
            }
            int32_t *pair = c->min_pair + (j * supers + s) * 4;
            for (int p = 0; p < 4; p++) pair[p] = type == GGUF_Q6_K ? 0 : pair_word(k.mn2[4 * p], k.mn2[4 * p + 2]);
            c->d[j * supers + s] = k.d;
            c->dmin[j * supers + s] = k.dmin;
        }
    }
}

/* float_to_bf16 of 16 values: round to nearest even, NaN kept quiet */
static inline __m256i bf16_of16(__m512 values) {
    const __m512i u = _mm512_castps_si512(values);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

/* eight tiles of 16 x 64 bytes: 0, 1: A (lo, hi); 2, 5: B (rows 0-15, 16-31 of the pass); 3, 4, 6, 7: C (lo and
 * hi products of each B) */
static void amx_configure(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    amx_configure_rows(rows, 8);
}

/* rows [r0, r0 + 32) x the 16 unpacked columns: out[r][n0 + j] for r < M, j < cols */
static void amx_pass(const AmxInputs *v, const AmxColumns *c, long K, long r0, long M, int cols, const int type,
                     const float *bias, long n0, void *out, int out_bf16, long out_stride) {
    const long supers = K / SUPER, rows = v->rows;
    const int32_t *x0 = v->x4 + r0 * (K / 4), *x1 = x0 + AMX_TILE_ROWS * (K / 4);
    float acc[2][AMX_COLS][16] __attribute__((aligned(64))), low[2][AMX_COLS][16] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    memset(low, 0, sizeof low);
    int32_t lo[2][AMX_COLS][16] __attribute__((aligned(64))), hi[2][AMX_COLS][16] __attribute__((aligned(64)));
    for (long s = 0; s < supers; s++) {
        _tile_zero(3);
        _tile_zero(4);
        _tile_zero(6);
        _tile_zero(7);
        for (long k = s * SUPER; k < (s + 1) * SUPER; k += AMX_STEP) {
            _tile_loadd(0, c->lo + k * AMX_COLS, AMX_STEP);
            _tile_loadd(1, c->hi + k * AMX_COLS, AMX_STEP);
            _tile_loadd(2, x0 + k * AMX_TILE_ROWS / 4, 64);
            _tile_loadd(5, x1 + k * AMX_TILE_ROWS / 4, 64);
            _tile_dpbusd(3, 0, 2);
            _tile_dpbusd(6, 0, 5);
            if (type == GGUF_Q6_K) {
                _tile_dpbssd(4, 1, 2);
                _tile_dpbssd(7, 1, 5);
            } else {
                _tile_dpbusd(4, 1, 2);
                _tile_dpbusd(7, 1, 5);
            }
        }
        _tile_stored(3, lo[0], 64);
        _tile_stored(4, hi[0], 64);
        _tile_stored(6, lo[1], 64);
        _tile_stored(7, hi[1], 64);
        for (int h = 0; h < 2; h++) {
            const long r = r0 + AMX_TILE_ROWS * h;
            const __m512 dx = _mm512_loadu_ps(v->dx + s * rows + r);
            __m512i pairs[4];
            if (type != GGUF_Q6_K)
                for (int p = 0; p < 4; p++) pairs[p] = _mm512_loadu_si512((const void *)(v->pairs + (s * 4 + p) * rows + r));
            for (int j = 0; j < AMX_COLS; j++) {
                const long at = j * supers + s;
                const __m512i sums = _mm512_add_epi32(_mm512_load_si512(lo[h][j]), _mm512_slli_epi32(_mm512_load_si512(hi[h][j]), 8));
                _mm512_store_ps(acc[h][j], _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(_mm512_set1_ps(c->d[at]), dx),
                                                           _mm512_load_ps(acc[h][j])));
                if (type == GGUF_Q6_K) continue;
                __m512i mins = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) mins = _mm512_dpwssd_epi32(mins, _mm512_set1_epi32(c->min_pair[at * 4 + p]), pairs[p]);
                _mm512_store_ps(low[h][j], _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(_mm512_set1_ps(c->dmin[at]), dx),
                                                           _mm512_load_ps(low[h][j])));
            }
        }
    }
    const __mmask16 valid = (__mmask16)((1u << cols) - 1);
    const __m512 biases = bias ? _mm512_maskz_loadu_ps(valid, bias + n0) : _mm512_setzero_ps();
    for (int h = 0; h < 2; h++) {
        float total[AMX_COLS][16] __attribute__((aligned(64)));
        for (int j = 0; j < AMX_COLS; j++) _mm512_store_ps(total[j], _mm512_sub_ps(_mm512_load_ps(acc[h][j]), _mm512_load_ps(low[h][j])));
        for (int i = 0; i < AMX_TILE_ROWS && r0 + AMX_TILE_ROWS * h + i < M; i++) {
            float row[AMX_COLS] __attribute__((aligned(64)));
            for (int j = 0; j < AMX_COLS; j++) row[j] = total[j][i];
            __m512 values = _mm512_load_ps(row);
            if (bias) values = _mm512_add_ps(values, biases); /* store()'s order: the sum, then the bias */
            const long at = (r0 + AMX_TILE_ROWS * h + i) * out_stride + n0;
            if (out_bf16)
                _mm256_mask_storeu_epi16((bf16 *)out + at, valid, bf16_of16(values));
            else
                _mm512_mask_storeu_ps((float *)out + at, valid, values);
        }
    }
}

/* columns [n_begin, n_end) of a K-quant weight for all M rows, on this thread's tiles. Returns -1 when out of
 * memory (nothing written then). */
static int amx_columns(const AmxInputs *v, long M, const uint8_t *packed, const int type, long col_bytes, long K,
                       const float *bias, void *out, int out_bf16, long out_stride, long n_begin, long n_end) {
    const long supers = K / SUPER;
    AmxColumns c;
    c.lo = aligned_alloc(64, AMX_COLS * K);
    c.hi = aligned_alloc(64, AMX_COLS * K);
    c.min_pair = malloc(AMX_COLS * supers * 4 * sizeof(int32_t));
    c.d = malloc(AMX_COLS * supers * sizeof(float));
    c.dmin = malloc(AMX_COLS * supers * sizeof(float));
    const int ok = c.lo && c.hi && c.min_pair && c.d && c.dmin;
    if (ok) {
        amx_configure();
        const long chunk = AMX_CHUNK_BYTES / K / AMX_ROWS * AMX_ROWS > AMX_ROWS ? AMX_CHUNK_BYTES / K / AMX_ROWS * AMX_ROWS : AMX_ROWS;
        for (long m0 = 0; m0 < M; m0 += chunk) {
            const long m_end = M - m0 < chunk ? M : m0 + chunk;
            for (long n = n_begin; n < n_end; n += AMX_COLS) {
                const int cols = n_end - n < AMX_COLS ? (int)(n_end - n) : AMX_COLS;
                amx_unpack(packed + n * col_bytes, col_bytes, cols, K, type, &c);
                for (long r = m0; r < m_end; r += AMX_ROWS)
                    amx_pass(v, &c, K, r, M, cols, type, bias, n, out, out_bf16, out_stride);
            }
        }
        _tile_release();
    }
    free(c.lo);
    free(c.hi);
    free(c.min_pair);
    free(c.d);
    free(c.dmin);
    return ok ? 0 : -1;
}
#endif
