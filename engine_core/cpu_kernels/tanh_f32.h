/* tanh in float32 with the same bits from the scalar and the 8-lane AVX2 form, so a value's tanh never depends
 * on the lane or the tail it fell in (libm's tanhf is one call per value, and a vectorizing compiler would give
 * other bits). Used by the attention soft cap (softcap_f32.h) and GELU's tanh form (ops/fused_fixed_order.c).
 *
 * tanh|x| = (1 - e) / (1 + e) with e = e^(-2|x|) from exp_f32.h's exp_nonpositive, the sign put back after.
 * Every step is a correctly rounded IEEE operation on the same inputs in both forms. Accuracy: the absolute
 * error is under 1e-7 (8.6e-8 at most against float64 over [-20, 20], about 1.5 float32 ulps of 1; 1 - e
 * cancels for small |x|, so the relative error there is larger, the absolute one is not). NaN stays NaN;
 * +-inf gives +-1. Built with -ffp-contract=off like its includers. */
#ifndef NVLLM_TANH_F32_H
#define NVLLM_TANH_F32_H
#include <math.h>

#include "exp_f32.h"

static inline float tanh_f32(float x) {
    const float e = exp_nonpositive(-2.0f * fabsf(x));
    const float t = (1.0f - e) / (1.0f + e);
    return x != x ? x : copysignf(t, x);
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 tanh_f32x8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 e = exp_nonpositive8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 signed_t = _mm256_or_ps(t, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(signed_t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif
#endif
