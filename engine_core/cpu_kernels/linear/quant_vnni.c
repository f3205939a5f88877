/* Linear layers whose weights stay quantized (GGUF Q4_0, Q4_1, Q8_0; per-channel int8) for bf16 engines, with
 * 8-bit activations and exact integer block sums (AVX512-VNNI; AMX int8 tiles for many rows): out[M, N] =
 * x[M, K] @ W[N, K]^T (+ bias), x and out bf16. A drop-in for cpu_quant.c: the same functions and packed
 * sizes, its own packed layout.
 *
 * The arithmetic (llama.cpp's for these types): each row of x is rounded per block of 32 inputs to 8 bits,
 * d_x = max|x| / 127, q_x = rint(x 127 / max|x|); a weight block is d_w q_w + m_w (Q4_1 stores m_w; Q4_0's is
 * -8 d_w; Q8_0 has none). Per row, column and block the integer sum S = sum_k q_w q_x is exact in int32, and
 *     total += (d_w d_x) S,  then for Q4  total += m_w s_x,  s_x = d_x sum_k q_x,
 * in fp32, blocks in order, the product d_w d_x rounded once (built with -ffp-contract=off: nothing else fuses).
 * The result is the dot product of the dequantized weights with the row rounded to 8 bits per block: within
 * about 0.5% of a row's magnitude of the bf16 product (the tests bound it).
 *
 * Batch invariance: S is an integer, exact whichever instructions form it, and the fp32 steps that follow are
 * the same per element on every path. So a row's result never depends on the row count, the tile, the thread,
 * or whether VNNI (vpdpbusd, few rows) or AMX (TDPBUSD, from AMX_MIN_ROWS rows) formed its sums.
 * vpdpbusd and TDPBUSD multiply unsigned by signed bytes: the weights are the unsigned side (Q4's 0..15; Q8's
 * u = q + 128, whose extra 128 sum_k q_x comes off S as an integer).
 *
 * Packed layout, panels of 16 output columns, each a run of blocks of 32 inputs (group g: inputs 4g..4g+3):
 *   Q4 block (320 bytes): d[16], m[16] (fp16), then 4 vectors of 64 bytes; byte 4c + i of vector v holds in its
 *     low nibble q of column c, input 8v + i, and in its high nibble that of input 8v + 4 + i.
 *   Q8 block (544 bytes): d[16] (fp16), then 8 vectors of 64 bytes; byte 4c + i of vector g: u of column c,
 *     input 4g + i.
 * Unpacked, a block's groups are [8][16 columns][4 bytes]: the lanes of vpdpbusd, and a tile B of 8 x 64 bytes.
 * Columns past N have d = m = 0. A gated (gate/up) weight's panels alternate 16 gate and 16 up columns.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "gguf_q4_q8_block.h"

typedef uint16_t bf16;

enum { FORMAT_Q4 = 0, FORMAT_Q8 = 1 };
#define LANES 16
#define GROUPS 8 /* 4-input groups per block */
#define Q4_BLOCK_BYTES 320
#define Q8_BLOCK_BYTES 544
#define MR 4 /* rows per register tile (2 panels); 1-2 rows take 4 panels */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 64 /* from this many rows, AMX tiles form the sums (fewer would run mostly empty) */
#endif
#define PARALLEL_MIN_WORK (1L << 16) /* M * N * K below this: one thread */

static long block_bytes(int format) { return format == FORMAT_Q4 ? Q4_BLOCK_BYTES : Q8_BLOCK_BYTES; }
static int header_bytes(int format) { return format == FORMAT_Q4 ? 64 : 32; }

long quant_packed_bytes(int format, long N, long K) {
    return (N + LANES - 1) / LANES * (K / QBLOCK) * block_bytes(format);
}

/* GGUF rows of a [N, K] weight -> packed panels (gated: a gate/up weight [2I, K], panels alternating gate and up
 * columns). Returns 0, or -1 for a type this file does not take. */
int quant_pack(const uint8_t *rows, long row_bytes, int type, long N, long K, int gated, uint8_t *packed) {
    if (type != GGUF_Q4_0 && type != GGUF_Q4_1 && type != GGUF_Q8_0) return -1;
    const int format = type == GGUF_Q8_0 ? FORMAT_Q8 : FORMAT_Q4;
    const long blocks = K / QBLOCK, panels = (N + LANES - 1) / LANES, bb = block_bytes(format);
    uint16_t d, m;
    uint8_t q[QBLOCK];
    for (long p = 0; p < panels; p++) {
        const long first = gated ? (p % 2) * (N / 2) + (p / 2) * LANES : p * LANES;
        for (long b = 0; b < blocks; b++) {
            uint8_t *dst = packed + (p * blocks + b) * bb, *ints = dst + header_bytes(format);
            uint16_t *ds = (uint16_t *)dst, *ms = ds + LANES;
            memset(dst, 0, bb);
            for (long c = 0; c < LANES && p * LANES + c < N; c++) {
                read_block(rows, row_bytes, type, first + c, b, &d, &m, q);
                ds[c] = d;
                if (format == FORMAT_Q8) {
                    for (int k = 0; k < QBLOCK; k++) ints[(k / 4) * 64 + 4 * c + k % 4] = q[k];
                    continue;
                }
                ms[c] = m;
                for (int k = 0; k < QBLOCK; k++) /* k = 8 v + 4 h + i */
                    ints[(k / 8) * 64 + 4 * c + k % 4] |= (uint8_t)(q[k] << (4 * ((k / 4) % 2)));
            }
        }
    }
    return 0;
}

/* ---- the rows, rounded to 8 bits per block ------------------------------------------------------------- */

typedef struct {
    int8_t *q;        /* [M][K] */
    float *d, *s;     /* [M][blocks]: d_x, and s_x = d_x sum_k q_x */
    int32_t *offset;  /* [M][blocks]: 128 sum_k q_x (what Q8's u = q + 128 adds to S) */
    long blocks, K;
} Rows;

static inline __m512 widen(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

static void round_rows(const bf16 *x, long M, long K, long x_stride, Rows *r, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && M >= 64) schedule(static)
    for (long i = 0; i < M; i++) {
        for (long b = 0; b < r->blocks; b++) {
            const bf16 *p = x + i * x_stride + b * QBLOCK;
            const __m512 lo = widen(_mm256_loadu_si256((const __m256i *)p));
            const __m512 hi = widen(_mm256_loadu_si256((const __m256i *)(p + 16)));
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            const __m512 scale = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            const __m512i qlo = _mm512_cvt_roundps_epi32(_mm512_mul_ps(lo, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i qhi = _mm512_cvt_roundps_epi32(_mm512_mul_ps(hi, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(r->q + i * K + b * QBLOCK), _mm512_cvtsepi32_epi8(qlo));
            _mm_storeu_si128((__m128i *)(r->q + i * K + b * QBLOCK + 16), _mm512_cvtsepi32_epi8(qhi));
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
            const float d = amax / 127.0f;
            r->d[i * r->blocks + b] = d;
            r->s[i * r->blocks + b] = d * (float)sum;
            r->offset[i * r->blocks + b] = 128 * sum;
        }
    }
}

/* ---- the fp32 steps every path shares ------------------------------------------------------------------- */

/* a block's exact integer sums S of one row (16 columns) into the row's totals: the only fp32 arithmetic */
static inline __m512 fold(__m512 total, __m512i s, const uint8_t *head, const Rows *r, long at, const int q4) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
    total = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(r->d[at])), _mm512_cvtepi32_ps(s), total);
    if (q4) total = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32))),
                                    _mm512_set1_ps(r->s[at]), total);
    return total;
}

/* fp32 -> bf16, nearest even */
static inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* the totals of 16 columns from n to out, bias (fp32, packed order) added first */
static inline void store_columns(__m512 total, const float *bias, bf16 *out, long n, long N) {
    const __mmask16 mask = N - n >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (N - n)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
    _mm256_mask_storeu_epi16(out + n, mask, to_bf16(_mm512_add_ps(total, b)));
}

/* silu(gate) * up of 16 outputs from o, each rounded to bf16 first (cpu_quant.c's store_gated): the bias in
 * cpu_gemm.c's gated order (groups of 32 gate, then 32 up); silu: cpu_ops' table of bf16 results */
static inline void store_gated(__m512 gate, __m512 up, const float *bias, long o, bf16 *out, const bf16 *silu) {
    const long g = (o / 32) * 64 + o % 32;
    const __m256i gb = to_bf16(_mm512_add_ps(gate, bias ? _mm512_loadu_ps(bias + g) : _mm512_setzero_ps()));
    const __m256i ub = to_bf16(_mm512_add_ps(up, bias ? _mm512_loadu_ps(bias + g + 32) : _mm512_setzero_ps()));
    const __m512i s = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(gb), (const void *)silu, 2);
    const __m512 product = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(s, 16)), widen(ub));
    _mm256_storeu_si256((__m256i *)(out + o), to_bf16(product));
}

/* one row's totals of panels [0, nr) to out (gated: panel pairs j, j + 1 are gate and up; p: the first panel) */
static inline void store_row(const __m512 *total, int nr, const float *bias, bf16 *out, long p, long N,
                             const bf16 *silu) {
    for (int j = 0; j < nr; j++) {
        if (!silu)
            store_columns(total[j], bias, out, (p + j) * LANES, N);
        else if (j % 2 == 0)
            store_gated(total[j], total[j + 1], bias, (p + j) / 2 * LANES, out, silu);
    }
}

/* ---- few rows: vpdpbusd ------------------------------------------------------------------------------- */

/* rows [m, m + mr) x panels [p, p + nr) over all blocks; mr, nr compile-time where inlined */
static inline __attribute__((always_inline)) void vnni_tile(const Rows *r, long m, const uint8_t *packed, long p,
                                                            int format, long N, const float *bias, bf16 *out,
                                                            long out_stride, const bf16 *silu, const int mr,
                                                            const int nr) {
    const long blocks = r->blocks, bb = block_bytes(format), panel_bytes = blocks * bb;
    const int q4 = format == FORMAT_Q4, header = header_bytes(format);
    const uint8_t *panels = packed + p * panel_bytes;
    __m512 total[MR][4];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) total[i][j] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        __m512i s[MR][4];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) s[i][j] = _mm512_setzero_si512();
        const int8_t *xq = r->q + m * r->K + b * QBLOCK;
        if (q4) {
            for (int v = 0; v < 4; v++) {
                __m512i lo[4], hi[4];
                for (int j = 0; j < nr; j++) {
                    const __m512i z = _mm512_loadu_si512(panels + j * panel_bytes + b * bb + header + v * 64);
                    lo[j] = _mm512_and_si512(z, _mm512_set1_epi8(15));
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(z, 4), _mm512_set1_epi8(15));
                }
                for (int i = 0; i < mr; i++) {
                    int32_t a, c;
                    memcpy(&a, xq + i * r->K + 8 * v, 4);
                    memcpy(&c, xq + i * r->K + 8 * v + 4, 4);
                    for (int j = 0; j < nr; j++) {
                        s[i][j] = _mm512_dpbusd_epi32(s[i][j], lo[j], _mm512_set1_epi32(a));
                        s[i][j] = _mm512_dpbusd_epi32(s[i][j], hi[j], _mm512_set1_epi32(c));
                    }
                }
            }
        } else {
            for (int g = 0; g < GROUPS; g++) {
                __m512i u[4];
                for (int j = 0; j < nr; j++) u[j] = _mm512_loadu_si512(panels + j * panel_bytes + b * bb + header + g * 64);
                for (int i = 0; i < mr; i++) {
                    int32_t a;
                    memcpy(&a, xq + i * r->K + 4 * g, 4);
                    for (int j = 0; j < nr; j++) s[i][j] = _mm512_dpbusd_epi32(s[i][j], u[j], _mm512_set1_epi32(a));
                }
            }
        }
        for (int i = 0; i < mr; i++) {
            const long at = (m + i) * blocks + b;
            const __m512i offset = _mm512_set1_epi32(q4 ? 0 : r->offset[at]); /* Q8's u = q + 128 */
            for (int j = 0; j < nr; j++)
                total[i][j] = fold(total[i][j], _mm512_sub_epi32(s[i][j], offset), panels + j * panel_bytes + b * bb, r,
                                   at, q4);
        }
    }
    for (int i = 0; i < mr; i++) store_row(total[i], nr, bias, out + (m + i) * out_stride, p, N, silu);
}

#define VTILE(MRV, NRV) vnni_tile(r, m, packed, p, format, N, bias, out, out_stride, silu, MRV, NRV)

/* panels [p_begin, p_end) (an even count, but for a plain weight's last panel) for rows [m_begin, m_end): a tile
 * of panels at a time (its blocks stay in L1) for every row */
static void vnni_columns(const Rows *r, long m_begin, long m_end, const uint8_t *packed, int format, long N,
                         const float *bias, bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end) {
    const int width = m_end - m_begin <= 2 ? 4 : 2; /* panels per tile: few rows keep more weight streams going */
    for (long p = p_begin; p < p_end; p += width) {
        const int nr = p_end - p < width ? (int)(p_end - p) : width;
        for (long m = m_begin; m < m_end;) {
            const int mr = m_end - m >= MR ? MR : (int)(m_end - m);
            switch (mr * 8 + (mr <= 2 ? nr : nr > 2 ? 2 : nr)) {
            case 8 + 1: VTILE(1, 1); break;
            case 8 + 2: VTILE(1, 2); break;
            case 8 + 3: VTILE(1, 3); break;
            case 8 + 4: VTILE(1, 4); break;
            case 16 + 1: VTILE(2, 1); break;
            case 16 + 2: VTILE(2, 2); break;
            case 16 + 3: VTILE(2, 3); break;
            case 16 + 4: VTILE(2, 4); break;
            case 24 + 1: VTILE(3, 1); break;
            case 24 + 2: VTILE(3, 2); break;
            case 32 + 1: VTILE(4, 1); break;
            default: VTILE(4, 2); break;
            }
            m += mr;
        }
    }
}
#undef VTILE

/* ---- many rows: AMX int8 tiles ------------------------------------------------------------------------- */

#define TILE_ROWS 16 /* rows per tile A / C */
#define PASS_ROWS 32 /* two tiles A */
#define AMX_ROW_CHUNK_BYTES (1L << 20) /* 8-bit rows one unpacked panel pair serves before the next */

/* 1 where the tiles may be used here */
int amx_ready(void) { return amx_permitted(); }

/* a panel's blocks as tiles B: the signed integers [block][8 groups][16 columns][4] (Q4: 0..15; Q8: q), and
 * 128 sum_k q_w per block and column (TDPBUSD's rows are u = q_x + 128: this comes off S) */
static void unpack_panel(const uint8_t *panel, long blocks, int format, int8_t *w, int32_t *wsum) {
    const long bb = block_bytes(format);
    const int header = header_bytes(format);
    const __m512i ones = _mm512_set1_epi8(1);
    for (long b = 0; b < blocks; b++) {
        const uint8_t *ints = panel + b * bb + header;
        int8_t *dst = w + b * GROUPS * 64;
        __m512i sum = _mm512_setzero_si512();
        for (int g = 0; g < GROUPS; g++) {
            __m512i v;
            if (format == FORMAT_Q4) {
                const __m512i z = _mm512_loadu_si512(ints + (g / 2) * 64);
                v = _mm512_and_si512(g % 2 ? _mm512_srli_epi16(z, 4) : z, _mm512_set1_epi8(15));
            } else {
                v = _mm512_xor_si512(_mm512_loadu_si512(ints + g * 64), _mm512_set1_epi8((char)0x80));
            }
            _mm512_storeu_si512(dst + g * 64, v);
            sum = _mm512_dpbusd_epi32(sum, ones, v);
        }
        _mm512_storeu_si512(wsum + b * LANES, _mm512_slli_epi32(sum, 7));
    }
}

/* tiles: C 0-3 (row tiles 0, 1 x panels 0, 1), A 4-5 (rows x 32 inputs), B 6-7 (8 groups x 16 columns x 4) */
static void configure_int8(int r0, int r1) {
    const uint8_t rows[8] = {(uint8_t)r0, (uint8_t)r0, (uint8_t)r1, (uint8_t)r1, (uint8_t)r0, (uint8_t)r1, 8, 8};
    const uint16_t colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
    amx_load_config(rows, colsb, 8);
}

typedef struct {
    int32_t c[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));  /* a block's sums [row tile][panel][row][col] */
    float total[2][2][TILE_ROWS * LANES] __attribute__((aligned(64))); /* running totals, the same layout */
} PassSums;

/* rows [m, m + r0 + r1) x the unpacked panels 0 (and 1 where two) over all blocks, into s->total; ux: the rows'
 * u = q_x + 128; heads: the packed panels (their scales) */
static void int8_pass(const Rows *r, const uint8_t *ux, long m, int r0, int r1, const int8_t *w, const int32_t *wsum,
                      const uint8_t *p0, int two, int format, PassSums *s) {
    const long blocks = r->blocks, K = r->K, bb = block_bytes(format), panel_bytes = blocks * bb;
    const long unpacked = blocks * GROUPS * 64;
    const int q4 = format == FORMAT_Q4;
    const uint8_t *a0 = ux + m * K, *a1 = a0 + TILE_ROWS * K;
    memset(s->total, 0, sizeof s->total);
    for (long b = 0; b < blocks; b++) {
        _tile_zero(0);
        _tile_loadd(4, a0 + b * QBLOCK, K);
        _tile_loadd(6, w + b * GROUPS * 64, 64);
        _tile_dpbusd(0, 4, 6);
        if (two) {
            _tile_zero(1);
            _tile_loadd(7, w + unpacked + b * GROUPS * 64, 64);
            _tile_dpbusd(1, 4, 7);
        }
        if (r1) {
            _tile_zero(2);
            _tile_loadd(5, a1 + b * QBLOCK, K);
            _tile_dpbusd(2, 5, 6);
            if (two) {
                _tile_zero(3);
                _tile_dpbusd(3, 5, 7);
            }
        }
        _tile_stored(0, s->c[0][0], 64);
        if (two) _tile_stored(1, s->c[0][1], 64);
        if (r1) {
            _tile_stored(2, s->c[1][0], 64);
            if (two) _tile_stored(3, s->c[1][1], 64);
        }
        for (int h = 0; h < 2; h++) {
            const int rows = h ? r1 : r0;
            for (int j = 0; j < 1 + two; j++) {
                const __m512i correction = _mm512_loadu_si512(wsum + j * blocks * LANES + b * LANES);
                const uint8_t *head = p0 + j * panel_bytes + b * bb;
                for (int i = 0; i < rows; i++) {
                    const __m512i sums = _mm512_sub_epi32(_mm512_load_si512(s->c[h][j] + i * LANES), correction);
                    float *t = s->total[h][j] + i * LANES;
                    _mm512_store_ps(t, fold(_mm512_load_ps(t), sums, head, r, (m + h * TILE_ROWS + i) * blocks + b, q4));
                }
            }
        }
    }
}

/* panels [p_begin, p_end) (pairs) for every row: each pair unpacked once per chunk of rows, the rows 32 at a time */
static int int8_columns(const Rows *r, const uint8_t *ux, long M, const uint8_t *packed, int format, long N,
                        const float *bias, bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end) {
    const long blocks = r->blocks, K = r->K, panel_bytes = blocks * block_bytes(format);
    int8_t *w = aligned_alloc(64, 2 * blocks * GROUPS * 64);
    int32_t *wsum = aligned_alloc(64, 2 * blocks * LANES * sizeof(int32_t));
    PassSums *s = aligned_alloc(64, sizeof(PassSums));
    const int ok = w && wsum && s;
    if (ok) {
        long chunk = AMX_ROW_CHUNK_BYTES / K / PASS_ROWS * PASS_ROWS;
        if (chunk < PASS_ROWS) chunk = PASS_ROWS;
        int configured = -1;
        for (long m0 = 0; m0 < M; m0 += chunk) {
            const long m_end = M - m0 < chunk ? M : m0 + chunk;
            for (long p = p_begin; p < p_end; p += 2) {
                const int two = p + 1 < p_end;
                const uint8_t *p0 = packed + p * panel_bytes;
                unpack_panel(p0, blocks, format, w, wsum);
                if (two) unpack_panel(p0 + panel_bytes, blocks, format, w + blocks * GROUPS * 64, wsum + blocks * LANES);
                for (long m = m0; m < m_end; m += PASS_ROWS) {
                    const int rows = m_end - m < PASS_ROWS ? (int)(m_end - m) : PASS_ROWS;
                    const int r0 = rows < TILE_ROWS ? rows : TILE_ROWS, r1 = rows - r0;
                    if (r0 * 32 + r1 != configured) configure_int8(r0, r1), configured = r0 * 32 + r1;
                    int8_pass(r, ux, m, r0, r1, w, wsum, p0, two, format, s);
                    for (int h = 0; h < 2; h++)
                        for (int i = 0; i < (h ? r1 : r0); i++) {
                            const __m512 total[2] = {_mm512_load_ps(s->total[h][0] + i * LANES),
                                                     _mm512_load_ps(s->total[h][1] + i * LANES)};
                            store_row(total, 1 + two, bias, out + (m + h * TILE_ROWS + i) * out_stride, p, N, silu);
                        }
                }
            }
        }
        if (configured >= 0) _tile_release();
    }
    free(w);
    free(wsum);
    free(s);
    return ok ? 0 : -1;
}

/* ---- entry points --------------------------------------------------------------------------------------- */

static int run(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
               const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    const long blocks = K / QBLOCK, panels = (N + LANES - 1) / LANES, units = (panels + 1) / 2; /* panel pairs */
    const int threads = num_threads < 2 || M * N * K < PARALLEL_MIN_WORK ? 1 : num_threads;
    Rows r = {malloc(M * K), malloc(sizeof(float) * M * blocks), malloc(sizeof(float) * M * blocks),
              malloc(sizeof(int32_t) * M * blocks), blocks, K};
    int failed = !r.q || !r.d || !r.s || !r.offset;
    uint8_t *ux = NULL; /* the AMX path's rows: u = q_x + 128 */
    if (!failed) {
        round_rows(x, M, K, x_stride, &r, threads);
        if (M >= AMX_MIN_ROWS && amx_permitted()) {
            ux = malloc(M * K);
            failed = !ux;
            for (long i = 0; !failed && i < M * K; i++) ux[i] = (uint8_t)r.q[i] ^ 0x80;
        }
    }
    if (!failed && ux) {
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            extern int omp_get_thread_num(void), omp_get_num_threads(void);
            const long t = omp_get_thread_num(), n = omp_get_num_threads();
            const long end = units * (t + 1) / n * 2;
            if (int8_columns(&r, ux, M, packed, format, N, bias, out, out_stride, silu, units * t / n * 2,
                             end < panels ? end : panels)) {
#pragma omp atomic write
                failed = 1;
            }
        }
    } else if (!failed) {
        if (threads > 1 && units >= 2) {
#pragma omp parallel num_threads(threads)
            {
                extern int omp_get_thread_num(void), omp_get_num_threads(void);
                const long t = omp_get_thread_num(), n = omp_get_num_threads();
                const long end = units * (t + 1) / n * 2;
                vnni_columns(&r, 0, M, packed, format, N, bias, out, out_stride, silu, units * t / n * 2,
                             end < panels ? end : panels);
            }
        } else if (threads > 1) { /* one panel pair: the rows split instead */
#pragma omp parallel num_threads(threads)
            {
                extern int omp_get_thread_num(void), omp_get_num_threads(void);
                const long t = omp_get_thread_num(), n = omp_get_num_threads();
                vnni_columns(&r, M * t / n, M * (t + 1) / n, packed, format, N, bias, out, out_stride, silu, 0, panels);
            }
        } else {
            vnni_columns(&r, 0, M, packed, format, N, bias, out, out_stride, silu, 0, panels);
        }
    }
    free(ux);
    free(r.q);
    free(r.d);
    free(r.s);
    free(r.offset);
    return failed ? -1 : 0;
}

/* out [M, N] = x [M, K] @ W^T + bias (fp32 in column order, or NULL); format FORMAT_Q4 / FORMAT_Q8. One
 * arithmetic at every M (every_row_alike is cpu_quant.c's choice; here it changes nothing). 0, or -1 when out
 * of memory. */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    (void)every_row_alike;
    return run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, num_threads);
}

/* out [M, I] = silu(x @ gate^T + gate bias) * (x @ up^T + up bias), each rounded to bf16 first. packed:
 * quant_pack(gated = 1); bias in cpu_gemm.c's gated column order or NULL; silu: cpu_ops' table. */
int quant_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format,
                               long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                               int every_row_alike, int num_threads) {
    (void)every_row_alike;
    return run(x, M, K, x_stride, packed, format, 2 * I, bias, out, out_stride, silu, num_threads);
}

/* rows of a packed weight's columns, dequantized (an embedding lookup): out[r] = column ids[r] of W as
 * bf16(d q + m), K values each */
void quant_rows_bf16(const uint8_t *packed, int format, long K, const int64_t *ids, long count, bf16 *out) {
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    for (long r = 0; r < count; r++) {
        const long c = ids[r] % LANES;
        const uint8_t *panel = packed + ids[r] / LANES * panel_bytes;
        for (long b = 0; b < blocks; b++) {
            const uint8_t *head = panel + b * bb, *ints = head + header_bytes(format);
            const float d = half_to_float(((const uint16_t *)head)[c]);
            const float m = format == FORMAT_Q4 ? half_to_float(((const uint16_t *)head)[LANES + c]) : 0.0f;
            for (int k = 0; k < QBLOCK; k++) {
                float q;
                if (format == FORMAT_Q4)
                    q = (float)((ints[(k / 8) * 64 + 4 * c + k % 4] >> (4 * ((k / 4) % 2))) & 15);
                else
                    q = (float)((int)ints[(k / 4) * 64 + 4 * c + k % 4] - 128);
                const float v = __builtin_fmaf(d, q, m);
                uint32_t u;
                memcpy(&u, &v, 4);
                out[r * K + b * QBLOCK + k] = (bf16)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
            }
        }
    }
}
