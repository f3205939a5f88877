/* Float32 linear layers whose weights stay quantized (GGUF Q4_0, Q4_1, Q8_0), for every CPU tier:
 * out[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and out in float32.
 *
 * The weights are unpacked to their exact float values, w = d q + m (d q is exact in fp32: an fp16 scale
 * times a 4- or 8-bit integer; + m rounds once, as gguf-py dequantizes), and multiplied with
 * dense_fixed_order.c's arithmetic: one fp32 fused multiply-add per input, k in order, then the bias. So a
 * row's result is, to the bit, what the dequantized float32 model gives through dense_fixed_order.c: keeping
 * the weights quantized changes the bytes a step reads, never a result. Every tier gives the bits of
 * dense_fixed_order.c on that tier (the same on all of them).
 *
 * Few rows (decode): each weight is unpacked in registers as the tile reaches it, a 16-column vector per
 * input (Q4: 8 bytes, zero-extended, the two nibbles masked and shifted out; Q8: 16 signed bytes), so a
 * step streams 5 (Q4) or 8.5 (Q8) bits per weight. From SLAB_MIN_M rows (batched decodes, prefill): a
 * thread unpacks a slab of panels into dense_fixed_order.c's float panels, which stay in L2, and runs that
 * file's tiles over every row: the same values, the same sums, the dense kernel's rate.
 *
 * Packed layout: panels of 16 output columns, each a run of blocks of 32 inputs:
 *   Q4 block (320 bytes): d[16], m[16] (fp16; Q4_0's m is -8 d, exact), then per input k 8 bytes: byte c
 *     holds column c in its low nibble and column c + 8 in its high one.
 *   Q8 block (544 bytes): d[16] (fp16), then per input k 16 signed bytes, one per column.
 * Columns past N have d = m = 0.
 */
#include "dense_fixed_order.c"
#include "prefetch_run.h"

#include <stdlib.h>

enum { GGUF_Q4_0 = 2, GGUF_Q4_1 = 3, GGUF_Q8_0 = 8 };
#define QBLOCK 32
#define Q4_BLOCK 320
#define Q8_BLOCK 544
#ifndef SLAB_MIN_M
#define SLAB_MIN_M 8 /* from this many rows, unpack slabs of panels once for all of them */
#endif
#define SLAB_BYTES (256 * 1024) /* float panels one thread unpacks at a time */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096 /* bytes ahead of a few-rows tile in its run of panels: they stream from memory */
#endif
/* panels per few-rows tile: each panel's sums are a chain of fused multiply-adds, one per input (the dense
 * kernel's order); a one-row tile keeps four chains in flight, so their latency hides behind each other */
#define QNR 4

static long block_bytes(int q8) { return q8 ? Q8_BLOCK : Q4_BLOCK; }

static uint16_t fp16_bits(float f) { /* for -8 d: exact whenever d is a normal fp16 well below the maximum */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000;
    const int exponent = (int)((u >> 23) & 255) - 112;
    if ((u & 0x7fffffff) == 0) return (uint16_t)sign;
    if (exponent <= 0 || exponent >= 31) { /* subnormal or out of range: round through the value */
        const float a = fabsf(f);
        if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
        return (uint16_t)(sign | (uint16_t)lrintf(a / 5.9604644775390625e-8f)); /* subnormals: exact multiples */
    }
    return (uint16_t)(sign | (exponent << 10) | ((u >> 13) & 1023));
}

long quant_f32_packed_bytes(int type, long N, long K) {
    return (N + LANES - 1) / LANES * (K / QBLOCK) * block_bytes(type == GGUF_Q8_0);
}

/* GGUF rows of a [N, K] weight (row_bytes apart) -> packed panels. Returns 0, or -1 for another type. */
int quant_f32_pack(const uint8_t *rows, long row_bytes, int type, long N, long K, uint8_t *packed) {
    if (type != GGUF_Q4_0 && type != GGUF_Q4_1 && type != GGUF_Q8_0) return -1;
    const int q8 = type == GGUF_Q8_0;
    const long blocks = K / QBLOCK, bb = block_bytes(q8), gb = type == GGUF_Q4_0 ? 18 : type == GGUF_Q4_1 ? 20 : 34;
    memset(packed, 0, quant_f32_packed_bytes(type, N, K));
    for (long n = 0; n < N; n++) {
        const long p = n / LANES, c = n % LANES;
        for (long b = 0; b < blocks; b++) {
            const uint8_t *src = rows + n * row_bytes + b * gb;
            uint8_t *dst = packed + (p * blocks + b) * bb;
            uint16_t d, m;
            memcpy(&d, src, 2);
            memcpy(dst + 2 * c, &d, 2);
            if (q8) {
                for (int k = 0; k < QBLOCK; k++) dst[32 + k * LANES + c] = src[2 + k];
                continue;
            }
            if (type == GGUF_Q4_1)
                memcpy(&m, src + 2, 2);
            else
                m = fp16_bits(-8.0f * fp16_to_float(d));
            memcpy(dst + 32 + 2 * c, &m, 2);
            const uint8_t *qs = src + (type == GGUF_Q4_1 ? 4 : 2);
            for (int k = 0; k < QBLOCK; k++) { /* GGUF: input k < 16 in qs[k]'s low nibble, k >= 16 in qs[k - 16]'s high */
                const uint8_t q = k < 16 ? qs[k] & 15 : qs[k - 16] >> 4;
                dst[64 + k * 8 + c % 8] |= (uint8_t)(c < 8 ? q : q << 4);
            }
        }
    }
    return 0;
}

/* ---- the 16 columns' weights of one input, as floats ------------------------------------------------ */

#if defined(__AVX512F__)
static inline vec vload_fp16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vec q4_weights(const uint8_t *p, vec d, vec m) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, _mm256_set1_epi32(15))),
                                            _mm256_srli_epi32(q, 4), 1);
    return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(both), m);
}
static inline vec q8_weights(const uint8_t *p, vec d) {
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline vec vload_fp16(const uint16_t *p) {
    return (vec){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
static inline vec q4_weights(const uint8_t *p, vec d, vec m) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15)));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
    return (vec){_mm256_fmadd_ps(d.lo, lo, m.lo), _mm256_fmadd_ps(d.hi, hi, m.hi)};
}
static inline vec q8_weights(const uint8_t *p, vec d) {
    const __m128i q = _mm_loadu_si128((const __m128i *)p);
    return (vec){_mm256_mul_ps(d.lo, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))),
                 _mm256_mul_ps(d.hi, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))))};
}
#else
static inline vec vload_fp16(const uint16_t *p) {
    vec r;
    for (int l = 0; l < LANES; l++) r.v[l] = fp16_to_float(p[l]);
    return r;
}
static inline vec q4_weights(const uint8_t *p, vec d, vec m) {
    vec r;
    for (int l = 0; l < LANES; l++) r.v[l] = fmaf(d.v[l], (float)(l < 8 ? p[l] & 15 : p[l - 8] >> 4), m.v[l]);
    return r;
}
static inline vec q8_weights(const uint8_t *p, vec d) {
    vec r;
    for (int l = 0; l < LANES; l++) r.v[l] = d.v[l] * (float)(int8_t)p[l];
    return r;
}
#endif

/* panel [K/32 blocks] -> dense_fixed_order.c's float panel [K][16] */
static void unpack_panel(const uint8_t *panel, long K, int q8, float *dst) {
    const long blocks = K / QBLOCK, bb = block_bytes(q8);
    for (long b = 0; b < blocks; b++) {
        const uint8_t *blk = panel + b * bb;
        const vec d = vload_fp16((const uint16_t *)blk), m = q8 ? vzero() : vload_fp16((const uint16_t *)(blk + 32));
        for (int k = 0; k < QBLOCK; k++)
            vstore(dst + (b * QBLOCK + k) * LANES, q8 ? q8_weights(blk + 32 + k * LANES, d) : q4_weights(blk + 64 + k * 8, d, m));
    }
}

/* ---- few rows: unpacked in registers --------------------------------------------------------------- */

/* rows [0, mr) x panels [0, nr) over all of K, tile()'s arithmetic on weights unpacked as they are read */
static inline __attribute__((always_inline)) void qtile(const float *x, long x_stride, const uint8_t *panels,
                                                        long panel_bytes, long K, const float *bias, float *out,
                                                        long out_stride, long n0, long N, const int mr, const int nr,
                                                        const int q8) {
    const long blocks = K / QBLOCK, bb = block_bytes(q8);
    vec acc[MR][QNR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = vzero();
    for (long b = 0; b < blocks; b++) {
        vec d[QNR], m[QNR];
#if defined(__AVX2__)
        prefetch_run(panels + nr * b * bb, nr * bb, PREFETCH_AHEAD); /* the tile's panels, from memory */
#endif
        for (int j = 0; j < nr; j++) {
            const uint8_t *blk = panels + j * panel_bytes + b * bb;
            d[j] = vload_fp16((const uint16_t *)blk);
            m[j] = q8 ? vzero() : vload_fp16((const uint16_t *)(blk + 32));
        }
        for (int k = 0; k < QBLOCK; k++) {
            /* each panel's weights used as soon as they are unpacked: fewer values live at once, so the
             * accumulators stay in registers (the order of each accumulator's adds is unchanged) */
            for (int j = 0; j < nr; j++) {
                const uint8_t *blk = panels + j * panel_bytes + b * bb;
                const vec w = q8 ? q8_weights(blk + 32 + k * LANES, d[j]) : q4_weights(blk + 64 + k * 8, d[j], m[j]);
                for (int i = 0; i < mr; i++) acc[i][j] = vfma(x[i * x_stride + b * QBLOCK + k], w, acc[i][j]);
            }
        }
    }
    for (int j = 0; j < nr; j++) { /* one panel at a time through dense_fixed_order.c's epilogue */
        vec column[MR][NR];
        for (int i = 0; i < mr; i++) column[i][0] = acc[i][j];
        store_tile(column, bias, out, out_stride, n0 + j * LANES, N, mr, 1, 0);
    }
}

#define QTILE(MRV, NRV, Q8) qtile(x + m * x_stride, x_stride, panels, panel_bytes, K, bias, out + m * out_stride, \
                                  out_stride, p * LANES, N, MRV, NRV, Q8)
#define QTILE_NR(MRV, Q8)                    \
    do {                                     \
        if (nr == 1) QTILE(MRV, 1, Q8);      \
        else if (nr == 2) QTILE(MRV, 2, Q8); \
        else if (nr == 3) QTILE(MRV, 3, Q8); \
        else QTILE(MRV, 4, Q8);              \
    } while (0)
#define QTILE_MR(Q8)                       \
    switch (mr) {                          \
    case 1: QTILE_NR(1, Q8); break;        \
    case 2: QTILE_NR(2, Q8); break;        \
    case 3: QTILE_NR(3, Q8); break;        \
    case 4: QTILE_NR(4, Q8); break;        \
    case 5: QTILE_NR(5, Q8); break;        \
    default: QTILE_NR(6, Q8); break;       \
    }

static void few_rows(const float *x, long M, long K, long x_stride, const uint8_t *packed, int q8, long N,
                     const float *bias, float *out, long out_stride, long p_begin, long p_end) {
    const long panel_bytes = K / QBLOCK * block_bytes(q8);
    /* as many panels per tile as the rows leave registers for (any tiling gives the same sums) */
    const int width = M == 1 ? QNR : M <= 3 ? 2 : 1;
    for (long p = p_begin; p < p_end; p += width) {
        const int nr = p_end - p < width ? (int)(p_end - p) : width;
        const uint8_t *panels = packed + p * panel_bytes;
        for (long m = 0; m < M; m += MR) {
            const int mr = M - m < MR ? (int)(M - m) : MR;
            if (q8) {
                QTILE_MR(1)
            } else {
                QTILE_MR(0)
            }
        }
    }
}
#undef QTILE_MR
#undef QTILE_NR
#undef QTILE

/* ---- many rows: slabs unpacked into float panels, then dense_fixed_order.c's tiles --------------------- */

static void many_rows(const float *x, long M, long K, long x_stride, const uint8_t *packed, int q8, long N,
                      const float *bias, float *out, long out_stride, long p_begin, long p_end, long slab,
                      float *buffer) {
    const long panel_bytes = K / QBLOCK * block_bytes(q8);
    for (long s = p_begin; s < p_end; s += slab) {
        const long count = p_end - s < slab ? p_end - s : slab;
        for (long p = 0; p < count; p++) unpack_panel(packed + (s + p) * panel_bytes, K, q8, buffer + p * K * LANES);
        columns(x, M, K, x_stride, buffer, N - s * LANES, bias ? bias + s * LANES : NULL, out + s * LANES, out_stride,
                0, count, 0);
    }
}

/* out [M, N] (row stride out_stride) = x [M, K] (row stride x_stride) @ W^T + bias (fp32, or NULL); packed:
 * quant_f32_pack's of GGUF type `type`. Returns 0, or -1 when out of memory. */
int quant_f32_linear(const float *x, long M, long K, long x_stride, const uint8_t *packed, int type, long N,
                     const float *bias, float *out, long out_stride, int num_threads) {
    const int q8 = type == GGUF_Q8_0;
    const long panels = (N + LANES - 1) / LANES;
    long slab = SLAB_BYTES / (K * LANES * (long)sizeof(float)) / NR * NR;
    if (slab < NR) slab = NR;
    const int threads = num_threads < 2 || M * N * K < PARALLEL_MIN_WORK || panels < 2 ? 1 : num_threads;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        const long t = omp_get_thread_num(), n = omp_get_num_threads();
        /* whole tiles of NR panels per thread: the split changes which thread computes a column, never how */
        const long tiles = (panels + NR - 1) / NR;
        const long begin = tiles * t / n * NR, end_tile = tiles * (t + 1) / n * NR;
        const long end = end_tile < panels ? end_tile : panels;
        if (M < SLAB_MIN_M) {
            few_rows(x, M, K, x_stride, packed, q8, N, bias, out, out_stride, begin, end);
        } else {
            float *buffer = aligned_alloc(64, slab * K * LANES * sizeof(float));
            if (!buffer) {
#pragma omp atomic write
                failed = 1;
            } else {
                many_rows(x, M, K, x_stride, packed, q8, N, bias, out, out_stride, begin, end, slab, buffer);
                free(buffer);
            }
        }
    }
    return failed ? -1 : 0;
}

/* columns ids of W as floats (an embedding lookup): out[r] = d q + m of column ids[r], K values each */
void quant_f32_rows(const uint8_t *packed, int type, long K, const int64_t *ids, long count, float *out) {
    const int q8 = type == GGUF_Q8_0;
    const long blocks = K / QBLOCK, bb = block_bytes(q8), panel_bytes = blocks * bb;
    for (long r = 0; r < count; r++) {
        const long c = ids[r] % LANES;
        const uint8_t *panel = packed + ids[r] / LANES * panel_bytes;
        for (long b = 0; b < blocks; b++) {
            const uint8_t *blk = panel + b * bb;
            const float d = fp16_to_float(((const uint16_t *)blk)[c]);
            const float m = q8 ? 0.0f : fp16_to_float(((const uint16_t *)(blk + 32))[c]);
            for (int k = 0; k < QBLOCK; k++) {
                float v;
                if (q8)
                    v = d * (float)(int8_t)blk[32 + k * LANES + c];
                else
                    v = fmaf(d, (float)(c < 8 ? blk[64 + k * 8 + c] & 15 : blk[64 + k * 8 + c - 8] >> 4), m);
                out[r * K + b * QBLOCK + k] = v;
            }
        }
    }
}
