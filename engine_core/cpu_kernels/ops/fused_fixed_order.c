/* Fused float32 kernels for every CPU tier: residual add + RMSNorm, SiLU-and-mul, GELU(tanh)-and-mul, rotary. The same
 * operations and argument layouts as fused_torch_rounding.c's bf16 kernels, for float32 engines (the tiers below
 * avx512_bf16 run those), where the module path and the C decoder loop (decoder/loop_portable.c) both
 * call them, so the two give the same bits.
 *
 * Each row's arithmetic is fixed, whatever the row count or the thread that takes the row:
 *  - RMSNorm: x' = x + residual (one add), its statistic from rms_fixed_order.c's fixed-order row sum, then
 *    weight * (x' * scale), two products, as norm.py's torch code computes them;
 *  - SiLU: gate / (1 + e^-gate) times up, e^ from exp_f32.h (8 lanes at a time where AVX2 runs, the same
 *    bits one at a time elsewhere; a gate below -88 gives -0: its true SiLU is under 1e-36 in size);
 *  - GELU, tanh form (Gemma's gelu_pytorch_tanh): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) times up,
 *    tanh from tanh_f32.h (the same bits in 8 lanes and one at a time; torch's own tanh GELU is within 1e-6);
 *  - rotary: x * cos + rotate_half(x) * sin, two products and an add, as rotary.py's _rotate.
 * Built with -ffp-contract=off: no product is fused into an add.
 */
#include "rms_fixed_order.c"
#include "../exp_f32.h"
#include "../tanh_f32.h"

#include <stdint.h>

#define PARALLEL_MIN_ELEMENTS 32768 /* below this, one thread */

static void rms_norm_row(float *x, float *res, float *out, const float *w, long n, float eps) {
    if (res)
        for (long k = 0; k < n; k++) res[k] = x[k] + res[k];
    const float *src = res ? res : x;
    const float scale = row_scale(src, n, eps);
    for (long k = 0; k < n; k++) out[k] = w[k] * (src[k] * scale);
}

/* rows (n0 x n1, strides xs0/xs1 etc.) of n values: out = RMSNorm(x) * w; with res, res = x + res first and
 * the norm is of that (x and res may be overwritten: out may be x) */
int rms_norm_f32(float *x, long xs0, long xs1, float *res, long rs0, long rs1, float *out, long os0, long os1,
                 const float *w, long n0, long n1, long n, float eps, int num_threads) {
    const long rows = n0 * n1;
    const int threads = rows * n < PARALLEL_MIN_ELEMENTS ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long r = 0; r < rows; r++)
        rms_norm_row(x + (r / n1) * xs0 + (r % n1) * xs1, res ? res + (r / n1) * rs0 + (r % n1) * rs1 : (float *)0,
                     out + (r / n1) * os0 + (r % n1) * os1, w, n, eps);
    return 0;
}

/* out[k] = silu(gate[k]) * up[k] for k < n */
static void silu_and_mul_row(const float *gate, const float *up, float *out, long n) {
    long k = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; k + 8 <= n; k += 8) {
        const __m256 g = _mm256_loadu_ps(gate + k);
        const __m256 e = exp_capped8(_mm256_xor_ps(g, sign));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + k)));
    }
#endif
    for (; k < n; k++) out[k] = gate[k] / (1.0f + exp_capped(-gate[k])) * up[k];
}

/* out[t] = silu(x[t][:n]) * x[t][n:] */
int silu_and_mul_f32(const float *x, long xs0, float *out, long os0, long rows, long n, int num_threads) {
    const int threads = rows * n < PARALLEL_MIN_ELEMENTS ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long t = 0; t < rows; t++) {
        silu_and_mul_row(x + t * xs0, x + t * xs0 + n, out + t * os0, n);
    }
    return 0;
}

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_CUBIC 0.044715f

static inline float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanh_f32(GELU_SQRT_2_OVER_PI * (g + GELU_CUBIC * (g * g * g))));
}

/* out[k] = gelu_tanh(gate[k]) * up[k] for k < n, each step in the same order in both forms */
static void gelu_tanh_and_mul_row(const float *gate, const float *up, float *out, long n) {
    long k = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 root = _mm256_set1_ps(GELU_SQRT_2_OVER_PI), cubic = _mm256_set1_ps(GELU_CUBIC);
    for (; k + 8 <= n; k += 8) {
        const __m256 g = _mm256_loadu_ps(gate + k);
        const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        const __m256 t = tanh_f32x8(_mm256_mul_ps(root, _mm256_add_ps(g, _mm256_mul_ps(cubic, g3))));
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(half, g), _mm256_add_ps(one, t));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(y, _mm256_loadu_ps(up + k)));
    }
#endif
    for (; k < n; k++) out[k] = gelu_tanh(gate[k]) * up[k];
}

/* out[t] = gelu_tanh(x[t][:n]) * x[t][n:] (out may be x: each value is read before its slot is written) */
int gelu_tanh_and_mul_f32(const float *x, long xs0, float *out, long os0, long rows, long n, int num_threads) {
    const int threads = rows * n < PARALLEL_MIN_ELEMENTS ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long t = 0; t < rows; t++) gelu_tanh_and_mul_row(x + t * xs0, x + t * xs0 + n, out + t * os0, n);
    return 0;
}

/* heads of d values (rows xs0 apart per token, xs1 per head) rotated in place by their token's position;
 * -1 (nothing written) for a position outside the tables */
int rotary_f32(float *x, long xs0, long xs1, long tokens, long heads, long d, const int64_t *positions,
               const float *cos, const float *sin, long max_position, int num_threads) {
    for (long t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_position) return -1;
    const long half = d / 2;
    const int threads = tokens * heads * d < PARALLEL_MIN_ELEMENTS ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long t = 0; t < tokens; t++) {
        const float *c = cos + positions[t] * d, *s = sin + positions[t] * d;
        for (long h = 0; h < heads; h++) {
            float *v = x + t * xs0 + h * xs1;
            for (long k = 0; k < half; k++) {
                const float a = v[k], b = v[k + half];
                v[k] = a * c[k] + (-b) * s[k];
                v[k + half] = b * c[k + half] + a * s[k + half];
            }
        }
    }
    return 0;
}
