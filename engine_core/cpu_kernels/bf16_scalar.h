/* bfloat16 <-> float32 and fp16 -> float32 one value at a time, in plain C: for the generic kernels
 * (dense_fixed_order.c, paged_fixed_order.c, quant_int8_rows.c, quant_exact_f32.c), which must give the same bits on every
 * CPU whatever it was built for. */
#ifndef NVLLM_BF16_SCALAR_H
#define NVLLM_BF16_SCALAR_H
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

static inline float bf16_to_float(bf16 b) { /* exact */
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* nearest even; a NaN stays a (quiet) NaN */
static inline bf16 float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* an IEEE half (GGUF's block scales) as float32, exactly; no F16C needed */
static inline float fp16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 31, mantissa = h & 1023;
    uint32_t u;
    float f;
    if (exponent == 31) {
        u = sign | 0x7f800000 | (mantissa << 13);
    } else if (exponent) {
        u = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {
        f = (float)mantissa * 5.9604644775390625e-8f; /* subnormal (or zero): m * 2^-24 */
        memcpy(&u, &f, 4);
        u |= sign;
    }
    memcpy(&f, &u, 4);
    return f;
}
#endif
