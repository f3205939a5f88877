/* Fused elementwise kernels for bfloat16, every CPU tier: residual add + RMSNorm, SiLU-and-mul, rotary.
 *
 * Each replaces several torch ops (and their temporaries) by one pass over memory, and reproduces
 * torch's rounding steps exactly, so results are bit-identical to the torch code they replace
 * (engine_core/layers/norm.py, rotary.py, models/decoder.py):
 *  - every bf16 op of torch is computed in float32 and rounded to bf16 (nearest even, the integer
 *    way torch's AVX512 code does it: subnormals kept);
 *  - RMSNorm's float32 sum of squares has two orders, one per form of norm.py's code: batch-invariant
 *    (rms_norm_fixed_bf16, the default) rms_fixed_order.c's fixed order, as norm.py takes its statistic from
 *    rms_fixed_order.c then; otherwise (rms_norm_bf16) torch's CPU sum order (its SumKernel.cpp: interleaved
 *    vector accumulators cascaded in blocks, then lanes added in order; see TORCH_ORDER_SUM), whose
 *    vector width the loader finds (which of 8 or 16 lanes reproduces torch: 8 with torch 2.13 on an
 *    AVX512 CPU, its sum kernel runs at AVX2 width); mean = sum / n, then rsqrt = 1 / sqrt, as torch
 *    computes them;
 *  - silu(bf16) takes one of 65536 values: it is looked up in a table of torch's own results
 *    (built by the loader with torch), then multiplied by up and rounded.
 * Compiled with -ffp-contract=off: a fused multiply-add would skip a rounding torch does.
 * Each row's result depends only on that row (no reduction across rows): batch invariant.
 * Rows are shared among OpenMP threads, except for small inputs (decode steps), where starting a
 * parallel region costs more than the work.
 *
 * Two forms of the same operations: 16 lanes at a time where AVX512 runs, one value at a time in plain C
 * elsewhere (AVX2, portable). Every step is one IEEE operation or an integer rounding, and the sum's order
 * is torch's in both (the plain form keeps the L lane sums in an array), so both give the same bits
 * (NaNs come out as 0xffff in both).
 */
#include <math.h>
#include <stdint.h>

#include "rms_fixed_order.c"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef PARALLEL_MIN_ELEMENTS
#define PARALLEL_MIN_ELEMENTS 32768 /* below this, one thread */
#endif

typedef uint16_t bf16;

static const bf16 *silu_table; /* 65536 (+1 padding) bf16 results of torch's silu, by input bits */

void set_silu_table(const bf16 *table) { silu_table = table; }

#define MAX_NORM_SIZE 16384 /* a row's squares sit on the stack */

static int sum_lanes = 8; /* the width of torch's float vectors in its sum kernel (set by the loader) */

void set_sum_lanes(int lanes) { sum_lanes = lanes; }

#if defined(__AVX512F__)
static inline __m512 load_bf16(const bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512 load_bf16_masked(const bf16 *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* float32 rounded to the nearest bfloat16 (ties to even), still as float32; NaN stays NaN */
static inline __m512 round_bf16(__m512 f) {
    __m512i v = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(v, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(v, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                 _mm512_set1_epi32((int)0xffff0000u));
    __mmask16 ordered = _mm512_cmp_ps_mask(f, f, _CMP_ORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(ordered, _mm512_set1_epi32((int)0xffff0000u), r));
}

/* the bf16 bits of a float32 that round_bf16 produced */
static inline __m256i pack_bf16(__m512 rounded) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16));
}

static inline void store_bf16(bf16 *p, __m512 rounded) { _mm256_storeu_si256((__m256i *)p, pack_bf16(rounded)); }

static inline void store_bf16_masked(bf16 *p, __m512 rounded, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, pack_bf16(rounded));
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

/* s[0..n) summed in the order of torch's CPU sum over a contiguous row with L-lane vectors: vector
 * v = s[L*v .. L*v+L) goes to accumulator v % 4 (of the first n/L/4*4 vectors); accumulators are
 * cascaded every 16 groups of 4 vectors (3 more levels, each carried up when the one below fills);
 * then the levels are added, the leftover vectors added to accumulator 0, accumulators 1..3 added
 * to it, and the row's scalar tail and then the L lanes added in order to a float starting at 0. */
#define TORCH_ORDER_SUM(NAME, L, VEC, ZERO, LOAD, ADD, STORE)                                    \
    static float NAME(const float *s, long n) {                                                      \
        const long nvec = n / L, ngroups = nvec / 4;                                                 \
        VEC acc[4][4];                                                                               \
        for (int j = 0; j < 4; j++)                                                                  \
            for (int k = 0; k < 4; k++) acc[j][k] = ZERO();                                          \
        for (long g = 0; g < ngroups; g++) {                                                         \
            for (int k = 0; k < 4; k++) acc[0][k] = ADD(acc[0][k], LOAD(s + (g * 4 + k) * L));       \
            if (((g + 1) & 15) == 0) {                                                               \
                for (int j = 1; j < 4; j++) {                                                        \
                    for (int k = 0; k < 4; k++) {                                                    \
                        acc[j][k] = ADD(acc[j][k], acc[j - 1][k]);                                   \
                        acc[j - 1][k] = ZERO();                                                      \
                    }                                                                                \
                    if (((g + 1) & (15L << (4 * j))) != 0) break;                                    \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int k = 0; k < 4; k++)                                                                  \
            for (int j = 1; j < 4; j++) acc[0][k] = ADD(acc[0][k], acc[j][k]);                       \
        VEC partial = acc[0][0];                                                                     \
        for (long v = ngroups * 4; v < nvec; v++) partial = ADD(partial, LOAD(s + v * L));          \
        for (int k = 1; k < 4; k++) partial = ADD(partial, acc[0][k]);                               \
        float total = 0.0f, lanes[L];                                                                \
        for (long i = nvec * L; i < n; i++) total += s[i];                                           \
        STORE(lanes, partial);                                                                       \
        for (int l = 0; l < L; l++) total += lanes[l];                                               \
        return total;                                                                                \
    }
TORCH_ORDER_SUM(torch_order_sum8, 8, __m256, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_add_ps, _mm256_storeu_ps)
TORCH_ORDER_SUM(torch_order_sum16, 16, __m512, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_add_ps, _mm512_storeu_ps)

/* x (+ residual, rounded to bf16: the new residual, stored back into it) -> the squares of its values
 * (float32, each rounded, as torch's pow(2) gives them) into sq; returns where the values are */
static const bf16 *row_squares(const bf16 *x, bf16 *res, long n, float *sq) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = load_bf16(x + i);
        if (res) {
            v = round_bf16(_mm512_add_ps(v, load_bf16(res + i)));
            store_bf16(res + i, v);
        }
        _mm512_storeu_ps(sq + i, _mm512_mul_ps(v, v));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = load_bf16_masked(x + i, m);
        if (res) {
            v = round_bf16(_mm512_add_ps(v, load_bf16_masked(res + i, m)));
            store_bf16_masked(res + i, v, m);
        }
        _mm512_mask_storeu_ps(sq + i, m, _mm512_mul_ps(v, v));
    }
    return res ? res : x;
}

static void rms_norm_row(const bf16 *x, bf16 *res, bf16 *out, const bf16 *w, long n, float eps, int fixed) {
    float sq[n];
    const bf16 *vals = row_squares(x, res, n, sq);
    const float sum = fixed ? fixed_order_sum(sq, n, 0) : sum_lanes == 16 ? torch_order_sum16(sq, n) : torch_order_sum8(sq, n);
    const float mean = sum / (float)n;
    const float r = 1.0f / sqrtf(mean + eps);
    const __m512 rv = _mm512_set1_ps(r);
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = round_bf16(_mm512_mul_ps(load_bf16(vals + i), rv));
        store_bf16(out + i, round_bf16(_mm512_mul_ps(load_bf16(w + i), y)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 y = round_bf16(_mm512_mul_ps(load_bf16_masked(vals + i, m), rv));
        store_bf16_masked(out + i, round_bf16(_mm512_mul_ps(load_bf16_masked(w + i, m), y)), m);
    }
}

static inline __m512 silu_lookup(__m256i gate_bits) {
    /* 4-byte gathers at 2-byte steps: the low half is the entry (the table has one padding entry) */
    __m512i got = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(gate_bits), (const void *)silu_table, 2);
    return _mm512_castsi512_ps(_mm512_slli_epi32(got, 16));
}

static void silu_and_mul_row(const bf16 *gate, const bf16 *up, bf16 *out, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 s = silu_lookup(_mm256_loadu_si256((const __m256i *)(gate + i)));
        store_bf16(out + i, round_bf16(_mm512_mul_ps(s, load_bf16(up + i))));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 s = silu_lookup(_mm256_maskz_loadu_epi16(m, gate + i));
        store_bf16_masked(out + i, round_bf16(_mm512_mul_ps(s, load_bf16_masked(up + i, m))), m);
    }
}

/* one head of d values, in place: the torch code is x * cos + cat(-x2, x1) * sin with cos/sin
 * rounded to bf16 first, and every product and the sum rounded to bf16 */
static void rotary_head(bf16 *x, const float *cos, const float *sin, long half) {
    for (long i = 0; i < half; i += 16) {
        const __mmask16 m = half - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (half - i)) - 1);
        const __m512 x1 = load_bf16_masked(x + i, m), x2 = load_bf16_masked(x + half + i, m);
        const __m512 c1 = round_bf16(_mm512_maskz_loadu_ps(m, cos + i));
        const __m512 c2 = round_bf16(_mm512_maskz_loadu_ps(m, cos + half + i));
        const __m512 s1 = round_bf16(_mm512_maskz_loadu_ps(m, sin + i));
        const __m512 s2 = round_bf16(_mm512_maskz_loadu_ps(m, sin + half + i));
        const __m512 neg_x2 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x2), _mm512_set1_epi32((int)0x80000000u)));
        const __m512 o1 = round_bf16(_mm512_add_ps(round_bf16(_mm512_mul_ps(x1, c1)), round_bf16(_mm512_mul_ps(neg_x2, s1))));
        const __m512 o2 = round_bf16(_mm512_add_ps(round_bf16(_mm512_mul_ps(x2, c2)), round_bf16(_mm512_mul_ps(x1, s2))));
        store_bf16_masked(x + i, o1, m);
        store_bf16_masked(x + half + i, o2, m);
    }
}

#else /* one value at a time: the same operations as the vector form above */

static inline float bf16_value(bf16 b) {
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

/* nearest even, the integer way (subnormals kept); a NaN gives 0xffff, as round_bf16 above */
static inline bf16 bf16_bits(float f) {
    union { float f; uint32_t u; } v = {f};
    if (f != f) return 0xffff;
    return (bf16)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float round_value(float f) { return bf16_value(bf16_bits(f)); }

/* TORCH_ORDER_SUM with `lanes` lane sums kept in arrays: each lane's adds are the vector form's */
static float torch_order_sum(const float *s, long n, int lanes) {
    const long nvec = n / lanes, ngroups = nvec / 4;
    float acc[4][4][16] = {{{0}}};
    for (long g = 0; g < ngroups; g++) {
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += s[(g * 4 + k) * lanes + l];
        if (((g + 1) & 15) == 0) {
            for (int j = 1; j < 4; j++) {
                for (int k = 0; k < 4; k++)
                    for (int l = 0; l < lanes; l++) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0.0f;
                if (((g + 1) & (15L << (4 * j))) != 0) break;
            }
        }
    }
    for (int k = 0; k < 4; k++)
        for (int j = 1; j < 4; j++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
    float partial[16];
    for (int l = 0; l < lanes; l++) partial[l] = acc[0][0][l];
    for (long v = ngroups * 4; v < nvec; v++)
        for (int l = 0; l < lanes; l++) partial[l] += s[v * lanes + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < lanes; l++) partial[l] += acc[0][k][l];
    float total = 0.0f;
    for (long i = nvec * lanes; i < n; i++) total += s[i];
    for (int l = 0; l < lanes; l++) total += partial[l];
    return total;
}

static void rms_norm_row(const bf16 *x, bf16 *res, bf16 *out, const bf16 *w, long n, float eps, int fixed) {
    float sq[n];
    for (long i = 0; i < n; i++) {
        float v = bf16_value(x[i]);
        if (res) {
            res[i] = bf16_bits(v + bf16_value(res[i]));
            v = bf16_value(res[i]);
        }
        sq[i] = v * v;
    }
    const bf16 *vals = res ? res : x;
    const float mean = (fixed ? fixed_order_sum(sq, n, 0) : torch_order_sum(sq, n, sum_lanes)) / (float)n;
    const float r = 1.0f / sqrtf(mean + eps);
    for (long i = 0; i < n; i++) out[i] = bf16_bits(bf16_value(w[i]) * round_value(bf16_value(vals[i]) * r));
}

static void silu_and_mul_row(const bf16 *gate, const bf16 *up, bf16 *out, long n) {
    for (long i = 0; i < n; i++) out[i] = bf16_bits(bf16_value(silu_table[gate[i]]) * bf16_value(up[i]));
}

static void rotary_head(bf16 *x, const float *cos, const float *sin, long half) {
    for (long i = 0; i < half; i++) {
        const float x1 = bf16_value(x[i]), x2 = bf16_value(x[half + i]);
        const float c1 = round_value(cos[i]), c2 = round_value(cos[half + i]);
        const float s1 = round_value(sin[i]), s2 = round_value(sin[half + i]);
        x[i] = bf16_bits(round_value(x1 * c1) + round_value(-x2 * s1));
        x[half + i] = bf16_bits(round_value(x2 * c2) + round_value(x1 * s2));
    }
}
#endif

/* rows r = (a, b) of shape [n0, n1], each of n contiguous values:
 *   res == NULL: out[r] = rmsnorm(x[r]) * w
 *   else:        res[r] = x[r] + res[r]; out[r] = rmsnorm(res[r]) * w   (out may be x: in place)
 * Element strides: x (xs0, xs1), res (rs0, rs1), out (os0, os1). Returns 0, or -1 (nothing written)
 * for rows shorter than 16 (torch sums them another way) or longer than MAX_NORM_SIZE. */
static int rms_norm_rows(const bf16 *x, long xs0, long xs1, bf16 *res, long rs0, long rs1, bf16 *out, long os0,
                         long os1, const bf16 *w, long n0, long n1, long n, float eps, int num_threads, int fixed) {
    const long rows = n0 * n1;
    if (n < 16 || n > MAX_NORM_SIZE) return -1;
#define ROW(r) rms_norm_row(x + ((r) / n1) * xs0 + ((r) % n1) * xs1,                      \
                            res ? res + ((r) / n1) * rs0 + ((r) % n1) * rs1 : (bf16 *)0, \
                            out + ((r) / n1) * os0 + ((r) % n1) * os1, w, n, eps, fixed)
    if (rows * n < PARALLEL_MIN_ELEMENTS || num_threads <= 1) {
        for (long r = 0; r < rows; r++) ROW(r);
    } else {
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (long r = 0; r < rows; r++) ROW(r);
    }
#undef ROW
    return 0;
}

/* the statistic in torch's sum order: norm.py's code without batch invariance */
int rms_norm_bf16(const bf16 *x, long xs0, long xs1, bf16 *res, long rs0, long rs1, bf16 *out, long os0,
                  long os1, const bf16 *w, long n0, long n1, long n, float eps, int num_threads) {
    return rms_norm_rows(x, xs0, xs1, res, rs0, rs1, out, os0, os1, w, n0, n1, n, eps, num_threads, 0);
}

/* the statistic in rms_fixed_order.c's fixed order: norm.py's batch-invariant code */
int rms_norm_fixed_bf16(const bf16 *x, long xs0, long xs1, bf16 *res, long rs0, long rs1, bf16 *out, long os0,
                        long os1, const bf16 *w, long n0, long n1, long n, float eps, int num_threads) {
    return rms_norm_rows(x, xs0, xs1, res, rs0, rs1, out, os0, os1, w, n0, n1, n, eps, num_threads, 1);
}

/* ---- SiLU and mul -------------------------------------------------------------------------- */

/* out[t, :] = silu(x[t, :n]) * x[t, n:2n]; x rows xs0 elements apart, out rows os0. Returns 0, or
 * -1 before the silu table is set. */
int silu_and_mul_bf16(const bf16 *x, long xs0, bf16 *out, long os0, long rows, long n, int num_threads) {
    if (!silu_table) return -1;
    if (rows * n < PARALLEL_MIN_ELEMENTS || num_threads <= 1) {
        for (long t = 0; t < rows; t++) silu_and_mul_row(x + t * xs0, x + t * xs0 + n, out + t * os0, n);
    } else {
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (long t = 0; t < rows; t++) silu_and_mul_row(x + t * xs0, x + t * xs0 + n, out + t * os0, n);
    }
    return 0;
}

/* ---- rotary (rotate-half layout) ----------------------------------------------------------- */

/* x [t, h, d] (element strides xs0, xs1; d contiguous, even) rotated in place by positions[t], reading
 * rows of the float32 tables cos/sin [max_position, d]. Returns 0, or -1 (nothing written) where a
 * position is outside the tables. */
int rotary_bf16(bf16 *x, long xs0, long xs1, long tokens, long heads, long d, const int64_t *positions,
                const float *cos, const float *sin, long max_position, int num_threads) {
    for (long t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_position) return -1;
    const long half = d / 2;
    if (tokens * heads * d < PARALLEL_MIN_ELEMENTS || num_threads <= 1) {
        for (long t = 0; t < tokens; t++)
            for (long h = 0; h < heads; h++)
                rotary_head(x + t * xs0 + h * xs1, cos + positions[t] * d, sin + positions[t] * d, half);
    } else {
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (long t = 0; t < tokens; t++)
            for (long h = 0; h < heads; h++)
                rotary_head(x + t * xs0 + h * xs1, cos + positions[t] * d, sin + positions[t] * d, half);
    }
    return 0;
}
