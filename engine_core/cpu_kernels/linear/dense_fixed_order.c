/* Fixed-order linear layers for any x86-64 CPU: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), fp32 sums.
 *
 * Three element-type sets, one scheme: float32 (weights, inputs and outputs in fp32); bfloat16 (weights
 * and inputs widened exactly to fp32, fp32 sums, the output rounded once to bf16: for CPUs where the
 * AVX512-BF16 kernel dense_bf16_dot.c cannot run); and float32 with bf16-stored weights (a bf16 checkpoint in
 * a float32 engine: the same sums as float32, half the weight bytes).
 *
 * The weight is packed once into panels of 16 output columns: [K][16], the 16 columns' weights of
 * input feature k side by side. Each step of k broadcasts x[m][k] and adds x[m][k] * W[n][k] into
 * the 16 columns' sums with one fused multiply-add (one rounding).
 *
 * Fixed reduction order per row: every output is one fp32 sum that starts at 0 and walks k = 0, 1,
 * 2, ... in order, then adds the bias once; whatever M, the register tile a row falls in, the chunk
 * of columns or the thread that computes it. A row's result depends on that row alone (batch
 * invariant). The vector code (AVX512F, or AVX2 + FMA) and the plain-C code (fmaf) round the same way,
 * so which one the compiler took does not matter either.
 *
 * Threads split the panels evenly (OpenMP: torch's libgomp, one thread pool); each walks its panels in
 * tiles of NR panels and, within a tile, the rows MR at a time, so the tile's weights stay in cache.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "../bf16_scalar.h"

#define LANES 16 /* output columns per panel */
#define MR 6     /* rows per register tile */
#if defined(__AVX512F__)
#define NR 4 /* panels per register tile: MR * NR accumulators + NR weights fit in 32 registers */
#else
#define NR 1 /* AVX2: a vec is two registers, 2 * MR * NR + 2 fit in 16 */
#endif
#define ROW_CHUNK_BYTES (256 * 1024) /* inputs of the rows taken together stay in L2 */
#define PARALLEL_MIN_WORK (1L << 18) /* M * N * K below this: one thread */

/* ---- 16 fp32 lanes: AVX512F, two AVX2 halves, or plain C with fmaf; all round the same way ---- */
#if defined(__AVX512F__)
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec vfma(float a, vec w, vec acc) { return _mm512_fmadd_ps(_mm512_set1_ps(a), w, acc); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vload_bf16(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef struct { __m256 lo, hi; } vec;
static inline vec vzero(void) { return (vec){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vec vload(const float *p) { return (vec){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vstore(float *p, vec v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline vec vfma(float a, vec w, vec acc) {
    __m256 b = _mm256_set1_ps(a);
    return (vec){_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
static inline vec vadd(vec a, vec b) { return (vec){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline __m256 widen8(const bf16 *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vec vload_bf16(const bf16 *p) { return (vec){widen8(p), widen8(p + 8)}; }
#else
typedef struct { float v[LANES]; } vec;
static inline vec vzero(void) { vec r; memset(&r, 0, sizeof r); return r; }
static inline vec vload(const float *p) { vec r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void vstore(float *p, vec v) { memcpy(p, v.v, sizeof v.v); }
static inline vec vfma(float a, vec w, vec acc) {
    for (int l = 0; l < LANES; l++) acc.v[l] = fmaf(a, w.v[l], acc.v[l]);
    return acc;
}
static inline vec vadd(vec a, vec b) {
    for (int l = 0; l < LANES; l++) a.v[l] += b.v[l];
    return a;
}
static inline vec vload_bf16(const bf16 *p) {
    vec r;
    for (int l = 0; l < LANES; l++) r.v[l] = bf16_to_float(p[l]);
    return r;
}
#endif


/* ---- packing: W [N, K] (row stride w_stride) -> panels [ceil(N/16)][K][16]; columns past N are 0 ---- */
void pack_weight_f32(const float *w, long N, long K, long w_stride, float *packed) {
    for (long p = 0; p * LANES < N; p++)
        for (long k = 0; k < K; k++)
            for (long c = 0; c < LANES; c++) {
                long n = p * LANES + c;
                packed[(p * K + k) * LANES + c] = n < N ? w[n * w_stride + k] : 0.0f;
            }
}

void pack_weight_bf16_generic(const bf16 *w, long N, long K, long w_stride, bf16 *packed) {
    for (long p = 0; p * LANES < N; p++)
        for (long k = 0; k < K; k++)
            for (long c = 0; c < LANES; c++) {
                long n = p * LANES + c;
                packed[(p * K + k) * LANES + c] = n < N ? w[n * w_stride + k] : 0;
            }
}

/* ---- one register tile: rows [0, mr) x panels [0, nr) over all of K ---- */

/* a tile's sums (+ bias, added once) to its outputs, rounded to bf16 where bf16_io */
static inline __attribute__((always_inline)) void store_tile(vec acc[MR][NR], const float *bias, void *out,
                                                             long out_stride, long n0, long N, const int mr,
                                                             const int nr, const int bf16_io) {
    for (int j = 0; j < nr; j++) {
        long n = n0 + j * LANES, width = N - n < LANES ? N - n : LANES;
        float b[LANES] = {0};
        if (bias) memcpy(b, bias + n, width * sizeof(float));
        for (int i = 0; i < mr; i++) {
            float sums[LANES];
            const vec total = bias ? vadd(acc[i][j], vload(b)) : acc[i][j];
            if (!bf16_io && width == LANES) { /* a whole panel: straight to the output */
                vstore((float *)out + i * out_stride + n, total);
                continue;
            }
            vstore(sums, total);
            if (bf16_io) {
                bf16 *o = (bf16 *)out + i * out_stride + n;
                for (long c = 0; c < width; c++) o[c] = float_to_bf16(sums[c]);
            } else {
                memcpy((float *)out + i * out_stride + n, sums, width * sizeof(float));
            }
        }
    }
}

/* the element types (a constant where the tile is inlined): F32 all float32; BF16 x, panels and out in
 * bfloat16; F32_BF16W float32 x and out with bfloat16 panels (weights that are bf16 values, half the bytes) */
enum { F32 = 0, BF16 = 1, F32_BF16W = 2 };

static inline __attribute__((always_inline)) void tile(const void *x, long x_stride, const void *panels, long K,
                                                       const float *bias, void *out, long out_stride, long n0, long N,
                                                       const int mr, const int nr, const int types) {
    const int bf16_io = types == BF16, bf16_w = types != F32;
    vec acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = vzero();
    for (long k = 0; k < K; k++) {
        vec w[NR];
        for (int j = 0; j < nr; j++)
            w[j] = bf16_w ? vload_bf16((const bf16 *)panels + (j * K + k) * LANES)
                           : vload((const float *)panels + (j * K + k) * LANES);
        for (int i = 0; i < mr; i++) {
            float a = bf16_io ? bf16_to_float(((const bf16 *)x)[i * x_stride + k]) : ((const float *)x)[i * x_stride + k];
            for (int j = 0; j < nr; j++) acc[i][j] = vfma(a, w[j], acc[i][j]);
        }
    }
    store_tile(acc, bias, out, out_stride, n0, N, mr, nr, bf16_io);
}

#define TILE(MRV, NRV) tile(x, x_stride, panels, K, bias, out, out_stride, n0, N, MRV, NRV, types)
#if NR == 1
#define TILE_NR(MRV) TILE(MRV, 1)
#else
#define TILE_NR(MRV)                    \
    do {                                \
        if (nr == 1) TILE(MRV, 1);      \
        else if (nr == 2) TILE(MRV, 2); \
        else if (nr == 3) TILE(MRV, 3); \
        else TILE(MRV, 4);              \
    } while (0)
#endif

/* every (mr, nr) pair gets its own inlined copy, so the accumulators stay in registers */
#define DEFINE_TILE_ANY(NAME, TYPES)                                                                      \
    static void NAME(const void *x, long x_stride, const void *panels, long K, const float *bias, void *out, \
                     long out_stride, long n0, long N, int mr, int nr) {                                    \
        const int types = TYPES;                                                                            \
        (void)nr; /* unused where NR == 1 */                                                                \
        switch (mr) {                                                                                       \
        case 1: TILE_NR(1); break;                                                                          \
        case 2: TILE_NR(2); break;                                                                          \
        case 3: TILE_NR(3); break;                                                                          \
        case 4: TILE_NR(4); break;                                                                          \
        case 5: TILE_NR(5); break;                                                                          \
        default: TILE_NR(6); break;                                                                         \
        }                                                                                                   \
    }
DEFINE_TILE_ANY(tile_f32, F32)
DEFINE_TILE_ANY(tile_bf16, BF16)
DEFINE_TILE_ANY(tile_f32_bf16w, F32_BF16W)

/* the panels [p_begin, p_end) for every row, rows in chunks whose inputs stay in L2 */
static void columns(const void *x, long M, long K, long x_stride, const void *packed, long N, const float *bias,
                    void *out, long out_stride, long p_begin, long p_end, int types) {
    const long elem = types == BF16 ? 2 : 4, w_elem = types == F32 ? 4 : 2;
    long chunk = ROW_CHUNK_BYTES / (K * elem) / MR * MR;
    if (chunk < MR) chunk = MR;
    for (long m0 = 0; m0 < M; m0 += chunk) {
        const long m_end = M - m0 < chunk ? M : m0 + chunk;
        for (long p = p_begin; p < p_end; p += NR) {
            int nr = p_end - p < NR ? (int)(p_end - p) : NR;
            const char *panels = (const char *)packed + p * K * LANES * w_elem;
            for (long m = m0; m < m_end; m += MR) {
                int mr = m_end - m < MR ? (int)(m_end - m) : MR;
                const char *xm = (const char *)x + m * x_stride * elem;
                char *om = (char *)out + m * out_stride * elem;
                if (types == BF16) tile_bf16(xm, x_stride, panels, K, bias, om, out_stride, p * LANES, N, mr, nr);
                else if (types == F32_BF16W)
                    tile_f32_bf16w(xm, x_stride, panels, K, bias, om, out_stride, p * LANES, N, mr, nr);
                else tile_f32(xm, x_stride, panels, K, bias, om, out_stride, p * LANES, N, mr, nr);
            }
        }
    }
}

static void run(const void *x, long M, long K, long x_stride, const void *packed, long N, const float *bias,
                void *out, long out_stride, int num_threads, int types) {
    long panels = (N + LANES - 1) / LANES;
    if (num_threads < 2 || M * N * K < PARALLEL_MIN_WORK || panels < 2) {
        columns(x, M, K, x_stride, packed, N, bias, out, out_stride, 0, panels, types);
        return;
    }
    /* the split changes which thread computes a column, never how: results do not depend on it */
#pragma omp parallel num_threads(num_threads)
    {
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        long t = omp_get_thread_num(), n = omp_get_num_threads();
        columns(x, M, K, x_stride, packed, N, bias, out, out_stride, panels * t / n, panels * (t + 1) / n, types);
    }
}

/* out [M, N] (row stride out_stride) = x [M, K] (row stride x_stride) @ W^T + bias (fp32, or NULL) */
void linear_f32(const float *x, long M, long K, long x_stride, const float *packed, long N, const float *bias,
                float *out, long out_stride, int num_threads) {
    run(x, M, K, x_stride, packed, N, bias, out, out_stride, num_threads, F32);
}

/* the same with the panels in bfloat16 (weights whose values are bf16: a bf16 checkpoint in a float32
 * engine): each weight widened exactly, so the results are linear_f32's to the bit at half the bytes read */
void linear_f32_bf16w(const float *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                      float *out, long out_stride, int num_threads) {
    run(x, M, K, x_stride, packed, N, bias, out, out_stride, num_threads, F32_BF16W);
}

/* the same in bfloat16: inputs and weights widened to fp32, fp32 sums + bias, the output rounded once */
void linear_bf16_generic(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                         bf16 *out, long out_stride, int num_threads) {
    run(x, M, K, x_stride, packed, N, bias, out, out_stride, num_threads, BF16);
}
