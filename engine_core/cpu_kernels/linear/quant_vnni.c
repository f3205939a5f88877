/* Linear layers whose weights stay quantized (GGUF Q4_0, Q4_1, Q8_0; per-channel int8) for bf16 engines on the amx
 * tier, with 8-bit activations and exact integer block sums (AVX512-VNNI): out[M, N] = x[M, K] @ W[N, K]^T (+ bias),
 * x and out bf16. A drop-in for quant_bf16_dot.c: the same functions and packed sizes, its own packed layout.
 *
 * The arithmetic (llama.cpp's for these types): each row of x is rounded per block of 32 inputs to 8 bits,
 * d_x = max|x| / 127, q_x = rint(x 127 / max|x|); a weight block is d_w q_w + m_w (Q4_1 stores m_w; Q4_0's is
 * -8 d_w; Q8_0 has none). Per row, column and block the integer sum S = sum_k q_w q_x is exact in int32, and
 *     total += (d_w d_x) S,  then for Q4  total += m_w s_x,  s_x = d_x sum_k q_x,
 * in fp32, blocks in order, the product d_w d_x rounded once (built with -ffp-contract=off: nothing else fuses).
 * The result is the dot product of the dequantized weights with the row rounded to 8 bits per block: off by at
 * most (the block's max |x|) / 254 per input from the bf16 product (the tests bound it).
 *
 * Batch invariance: S is an integer, exact whichever instructions form it, and the fp32 steps that follow are
 * the same per element in every tile. So a row's result never depends on the row count, the tile or the thread.
 * vpdpbusd multiplies unsigned by signed bytes: the weights are the unsigned side (Q4's 0..15; Q8's
 * u = q + 128, whose extra 128 sum_k q_x comes off S as an integer).
 *
 * Why not AMX tiles here (measured on the AMX Xeon, the default model's Q4_1 layer shapes at 512 rows): AMX int8
 * tiles (TDPBUSD) give the same integers, but each 32-input block's 16 x 16 sums must leave the tile and be
 * scaled on their own (d_w per block and column), and that store and fold cost more than the tile saves: 343-390
 * GFLOP/s on two threads (143 on one) against this kernel's 445-477 (205-288). bf16 tiles on the weights
 * dequantized run prefills faster (about 630) but round differently, and a one-row decode step, which must share
 * a prefill row's arithmetic, then costs 2.6x: a dense bf16 layer takes AMX tiles (amx_gemm.c), these do not.
 *
 * Packed layout, panels of 16 output columns, each a run of blocks of 32 inputs (group g: inputs 4g..4g+3):
 *   Q4 block (320 bytes): d[16], m[16] (fp16), then 4 vectors of 64 bytes; byte 4c + i of vector v holds in its
 *     low nibble q of column c, input 8v + i, and in its high nibble that of input 8v + 4 + i.
 *   Q8 block (544 bytes): d[16] (fp16), then 8 vectors of 64 bytes; byte 4c + i of vector g: u of column c,
 *     input 4g + i.
 * Columns past N have d = m = 0. A gated (gate/up) weight's panels alternate 16 gate and 16 up columns.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_q4_q8_block.h"

typedef uint16_t bf16;

enum { FORMAT_Q4 = 0, FORMAT_Q8 = 1 };
#define LANES 16
#define GROUPS 8 /* 4-input groups per block */
#define Q4_BLOCK_BYTES 320
#define Q8_BLOCK_BYTES 544
#ifndef MR
#define MR 4 /* rows per register tile (2 panels); 1-2 rows take 4 panels */
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

/* a panel block's scales as fold takes them: d_w, and m_w (Q4; zeros for Q8) */
typedef struct {
    __m512 d, m;
} Scales;

static inline Scales scales_of(const uint8_t *head, const int q4) {
    const Scales s = {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head)),
                      q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32))) : _mm512_setzero_ps()};
    return s;
}

/* a block's exact integer sums S of one row (16 columns) into the row's totals, the only fp32 arithmetic:
 * total += (d_w d_x) S, then for Q4 total += m_w s_x */
static inline __m512 fold(__m512 total, __m512i s, Scales w, const Rows *r, long at, const int q4) {
    total = _mm512_fmadd_ps(_mm512_mul_ps(w.d, _mm512_set1_ps(r->d[at])), _mm512_cvtepi32_ps(s), total);
    if (q4) total = _mm512_fmadd_ps(w.m, _mm512_set1_ps(r->s[at]), total);
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

/* silu(gate) * up of 16 outputs from o, each rounded to bf16 first (quant_bf16_dot.c's store_gated): the bias in
 * dense_bf16_dot.c's gated order (groups of 32 gate, then 32 up); silu: fused_ops.py's table of bf16 results */
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
        Scales w[4];
        for (int j = 0; j < nr; j++) w[j] = scales_of(panels + j * panel_bytes + b * bb, q4);
        for (int i = 0; i < mr; i++) {
            const long at = (m + i) * blocks + b;
            const __m512i offset = _mm512_set1_epi32(q4 ? 0 : r->offset[at]); /* Q8's u = q + 128 */
            for (int j = 0; j < nr; j++) total[i][j] = fold(total[i][j], _mm512_sub_epi32(s[i][j], offset), w[j], r, at, q4);
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
#if MR > 4
            case 32 + 2: VTILE(4, 2); break;
            case 40 + 1: VTILE(5, 1); break;
            case 40 + 2: VTILE(5, 2); break;
            case 48 + 1: VTILE(6, 1); break;
            default: VTILE(6, 2); break;
#else
            default: VTILE(4, 2); break;
#endif
            }
            m += mr;
        }
    }
}
#undef VTILE

/* ---- entry points --------------------------------------------------------------------------------------- */

static int run(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
               const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    const long blocks = K / QBLOCK, panels = (N + LANES - 1) / LANES, units = (panels + 1) / 2; /* panel pairs */
    const int threads = num_threads < 2 || M * N * K < PARALLEL_MIN_WORK ? 1 : num_threads;
    Rows r = {malloc(M * K), malloc(sizeof(float) * M * blocks), malloc(sizeof(float) * M * blocks),
              malloc(sizeof(int32_t) * M * blocks), blocks, K};
    const int failed = !r.q || !r.d || !r.s || !r.offset;
    if (!failed) {
        round_rows(x, M, K, x_stride, &r, threads);
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
    free(r.q);
    free(r.d);
    free(r.s);
    free(r.offset);
    return failed ? -1 : 0;
}

/* out [M, N] = x [M, K] @ W^T + bias (fp32 in column order, or NULL); format FORMAT_Q4 / FORMAT_Q8. One
 * arithmetic at every M (every_row_alike is quant_bf16_dot.c's choice; here it changes nothing). 0, or -1 when out
 * of memory. */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    (void)every_row_alike;
    return run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, num_threads);
}

/* out [M, I] = silu(x @ gate^T + gate bias) * (x @ up^T + up bias), each rounded to bf16 first. packed:
 * quant_pack(gated = 1); bias in dense_bf16_dot.c's gated column order or NULL; silu: fused_ops.py's table. */
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
