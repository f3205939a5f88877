/* Soft-capped attention scores in float32: s -> cap * tanh(s / cap) (Gemma 2's attn_logit_softcapping), with
 * tanh_f32.h's tanh: the same bits from the scalar and the 8-lane AVX2 form. A capped score is within ~1e-7 * cap
 * of cap * tanh(s / cap): 5e-6 at Gemma 2's cap of 50. NaN stays NaN; +-inf gives +-cap. Built with
 * -ffp-contract=off like its includers. */
#ifndef NVLLM_SOFTCAP_F32_H
#define NVLLM_SOFTCAP_F32_H
#include "tanh_f32.h"

static inline float soft_cap(float s, float cap) { return tanh_f32(s / cap) * cap; }

/* scores[j] = soft_cap(scores[j], cap) for j < m */
static inline void soft_cap_scores(float *scores, int m, float cap) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 c = _mm256_set1_ps(cap);
    for (; j + 8 <= m; j += 8)
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(tanh_f32x8(_mm256_div_ps(_mm256_loadu_ps(scores + j), c)), c));
#endif
    for (; j < m; j++) scores[j] = soft_cap(scores[j], cap);
}
#endif
