/* e^x in float32, this project's own: the same bits from the scalar and the 8-lane AVX2 form, so a value's
 * result never depends on the lane or the tail it fell in, nor on whether a loop was vectorized (libm's
 * expf is one call per value; a vectorizing compiler or another libm would give other bits).
 *
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), e^r by Cephes' degree-6 polynomial
 * (within ~1.4 ulp of the true value), times 2^n built in the exponent bits. Range:
 *   exp_nonpositive: x <= 0 (a softmax's arguments); below EXP_MIN, where e^x stops being a normal float, 0;
 *   exp_capped: any x; above EXP_MAX (e^88, 2^127 as the largest scale) +inf, below EXP_MIN 0.
 * NaN gives 0 (its comparisons fail): callers whose inputs may be NaN get NaN from their other operands.
 * Sources that include this are built with -ffp-contract=off, so every fmaf here is the one written. */
#ifndef NVLLM_EXP_F32_H
#define NVLLM_EXP_F32_H
#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define EXP_MIN -87.0f
#define EXP_MAX 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
static const float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

/* e^x for EXP_MIN <= x <= EXP_MAX */
static inline float exp_in_range(float x) {
    const float n = nearbyintf(x * EXP_LOG2E);
    const float r = fmaf(n, -EXP_LN2_LO, fmaf(n, -EXP_LN2_HI, x));
    float p = exp_poly[0];
    for (int i = 1; i < 6; i++) p = fmaf(p, r, exp_poly[i]);
    const float y = fmaf(p, r * r, r) + 1.0f;
    union { uint32_t u; float f; } scale = {(uint32_t)((int32_t)n + 127) << 23};
    return y * scale.f;
}

static inline float exp_nonpositive(float x) {
    return x >= EXP_MIN ? exp_in_range(x) : 0.0f; /* also -inf and NaN */
}

static inline float exp_capped(float x) {
    if (x > EXP_MAX) return INFINITY;
    return x >= EXP_MIN ? exp_in_range(x) : 0.0f;
}

#if defined(__AVX2__) && defined(__FMA__)
/* exp_in_range on 8 lanes, x already clamped to [EXP_MIN, EXP_MAX] */
static inline __m256 exp_in_range8(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_LO),
                                     _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_HI), x));
    __m256 p = _mm256_set1_ps(exp_poly[0]);
    for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly[i]));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

static inline __m256 exp_nonpositive8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_MIN), _CMP_GE_OQ);
    return _mm256_and_ps(exp_in_range8(_mm256_max_ps(x, _mm256_set1_ps(EXP_MIN))), keep);
}

static inline __m256 exp_capped8(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_MIN), _CMP_GE_OQ);
    const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_MAX), _CMP_GT_OQ);
    const __m256 clamped = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_MIN)), _mm256_set1_ps(EXP_MAX));
    const __m256 e = _mm256_and_ps(exp_in_range8(clamped), keep);
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}
#endif
#endif
