/* Soft-capped attention scores in float32: s -> cap * tanh(s / cap) (Gemma 2's attn_logit_softcapping), the
 * same bits from the scalar and the 8-lane AVX2 form, so a score's cap never depends on the lane or the tail it
 * fell in (libm's tanhf is one call per value, and a vectorizing compiler would give other bits).
 *
 * tanh|x| = (1 - e) / (1 + e) with e = e^(-2|x|) from exp_f32.h's exp_nonpositive, the sign put back after.
 * Every step is a correctly rounded IEEE operation on the same inputs in both forms. Accuracy: the absolute
 * error of tanh is under 1e-7 (8.6e-8 at most against float64 over [-20, 20], about 1.5 float32 ulps of 1;
 * 1 - e cancels for small |x|, so the relative error there is larger, the absolute one is not), so a capped
 * score is within ~1e-7 * cap of cap * tanh(s / cap): 5e-6 at Gemma 2's cap of 50.
 * NaN stays NaN; +-inf gives +-cap. Built with -ffp-contract=off like its includers. */
#ifndef NVLLM_SOFTCAP_F32_H
#define NVLLM_SOFTCAP_F32_H
#include <math.h>

#include "exp_f32.h"

static inline float soft_cap(float s, float cap) {
    const float x = s / cap;
    const float e = exp_nonpositive(-2.0f * fabsf(x));
    const float t = (1.0f - e) / (1.0f + e);
    return (x != x ? x : copysignf(t, x)) * cap;
}

/* scores[j] = soft_cap(scores[j], cap) for j < m */
static inline void soft_cap_scores(float *scores, int m, float cap) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 c = _mm256_set1_ps(cap), one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; j + 8 <= m; j += 8) {
        const __m256 x = _mm256_div_ps(_mm256_loadu_ps(scores + j), c);
        const __m256 e = exp_nonpositive8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
        const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        const __m256 signed_t = _mm256_or_ps(t, _mm256_and_ps(sign, x));
        const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(_mm256_blendv_ps(signed_t, x, nan), c));
    }
#endif
    for (; j < m; j++) scores[j] = soft_cap(scores[j], cap);
}
#endif
