/* Linear layers whose weights stay quantized (GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), for every
 * CPU tier:
 * out[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and out in float32 or bfloat16.
 *
 * The way llama.cpp multiplies on CPUs without bf16 dot products: each row of x is quantized to 8 bits
 * per block of 32 inputs (scale d_x = max|x| / 127, q_x = rint(x / d_x), in [-127, 127]), and a weight
 * block (scale d_w, integers q_w; Q4_1 also an offset m_w, Q4_0 is Q4_1 with m_w = -8 d_w) meets it in
 * integer dot products, exact in int32:
 *     sum_k (d_w q_w + m_w)(d_x q_x) = d_w d_x * sum_k q_w q_x + m_w * (d_x sum_k q_x).
 * The result is the dot product of the dequantized weights with the row rounded to 8 bits per block,
 * summed in fp32: about 0.3% of a row's magnitude from the dense product (the tests bound it).
 * The K-quants (Q4_K, Q5_K, Q6_K) round each row per 256 inputs instead and keep their sub-block scales in the
 * integers: k_quant_tile.h. What follows is the arithmetic of the per-32 types, and the dequantized values of all.
 * The other types are the same sum with their own d_w, m_w and integers (gguf_blocks.h): Q5_x's unsigned
 * 5-bit integers take the offset term; Q8_0's signed ones do not.
 * AVX2: vpmaddubsw + vpmaddwd (unsigned 4- or 5-bit, or |q| of a signed type, times signed 8-bit: no int16
 * saturation is possible); AVX512-VNNI: vpdpbusd, the same integers, two blocks per 512-bit register; AVX512
 * without VNNI: vpmaddubsw + vpmaddwd on 512 bits. Portable C: the same integers in plain loops. The amx tier's
 * K-quant steps of 24 rows and more: AMX int8 tiles, amx_k_tile.h.
 *
 * One arithmetic on every tier, so every tier gives the same bits: the integer sum of a block is taken
 * in 8 lanes of 4 inputs each (lane l: inputs 4l..4l+3), each lane converted to fp32 and added to that
 * lane's running sum times the block's d_w d_x in one fused multiply-add (the portable build calls
 * fmaf, exact everywhere, slow only where the CPU has no FMA); the even blocks of a column and its odd
 * blocks keep two running sums (AVX512 holds both in one register); after each group of 8 blocks lane l of
 * the even sum also adds m_w * s_x of block l of the group, fused likewise. The two sums are added lane by
 * lane, the 8 lanes then in a fixed tree ((l, l+4), (l, l+2), (l, l+1)), then the bias. Built with -ffp-contract=off, so nothing else is fused.
 * A row's result depends on that row alone, whatever M, the tile it falls in or the thread: batch
 * invariant.
 *
 * Packed layout (quant_dot_pack), one column (output) after another, each a run of groups of 8 blocks.
 * Q4_0, Q4_1, Q8_0: d[8] fp16, Q4_1 only: m[8] fp16, then the blocks' integers: Q4 16 bytes per block (GGUF's
 * order: byte j holds input j in its low nibble and input j + 16 in its high one), Q8 32 signed bytes.
 * A last group of fewer blocks keeps 8 scale slots (zeros past its end) and only its blocks' integers.
 * Q4_1 and Q8_0 take as many bytes as in the GGUF file; Q4_0 as many (its m is -8 d, never stored).
 * Q5_0, Q5_1 and the K-quants: the file's rows as they are (a group is 8 blocks, or one super-block).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../bf16_scalar.h"
#include "gguf_blocks.h"

#define LANES 8     /* int32 / fp32 lanes of a block's dot product */
#define MR 4        /* rows per register tile */
#define NR 4        /* columns per register tile of one row; 2 from two rows on */
#define PREFETCH_AHEAD 4096 /* bytes */
#define ROW_CHUNK 64 /* rows whose quantized inputs stay in L2 while a thread's columns pass over them */
#ifndef QUANT_DOT_PARALLEL_MIN_WORK
#define QUANT_DOT_PARALLEL_MIN_WORK (1L << 16) /* M * N * K below this: one thread */
#endif

/* bytes of one packed column of K inputs, and of a whole weight */
static long column_bytes(int type, long K) {
    const long blocks = K / QBLOCK, full = blocks / GROUP, rest = blocks % GROUP;
    return full * group_bytes(type, GROUP) + (rest ? group_bytes(type, rest) : 0);
}

long quant_dot_packed_bytes(int type, long N, long K) { return N * column_bytes(type, K); }

/* GGUF rows of a [N, K] weight (row_bytes apart) -> packed columns. Returns 0, or -1 for another type (or
 * a K-quant whose K is not a multiple of its 256-input super-block). */
int quant_dot_pack(const uint8_t *rows, long row_bytes, int type, long N, long K, uint8_t *packed) {
    if (!known_type(type) || (is_k_quant(type) && K % (GROUP * QBLOCK))) return -1;
    if (as_in_file(type)) {
        const long col = column_bytes(type, K);
        for (long n = 0; n < N; n++) memcpy(packed + n * col, rows + n * row_bytes, col);
        return 0;
    }
    const long blocks = K / QBLOCK, col = column_bytes(type, K), ints = block_ints(type), gb = gguf_block_bytes(type);
    const long skip = type == GGUF_Q4_1 ? 4 : 2; /* the integers' offset in a GGUF block */
    for (long n = 0; n < N; n++) {
        uint8_t *dst = packed + n * col;
        for (long g = 0; g * GROUP < blocks; g++) {
            const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
            uint16_t d[GROUP] = {0}, m[GROUP] = {0};
            for (long b = 0; b < count; b++) {
                const uint8_t *src = rows + n * row_bytes + (g * GROUP + b) * gb;
                memcpy(&d[b], src, 2);
                if (has_offset(type)) memcpy(&m[b], src + 2, 2);
            }
            memcpy(dst, d, sizeof d);
            dst += sizeof d;
            if (has_offset(type)) {
                memcpy(dst, m, sizeof m);
                dst += sizeof m;
            }
            for (long b = 0; b < count; b++, dst += ints)
                memcpy(dst, rows + n * row_bytes + (g * GROUP + b) * gb + skip, ints);
        }
    }
    return 0;
}

/* ---- the inputs, 8 bits per block ------------------------------------------------------------------ */

typedef struct {
    int8_t *q;       /* [M][K] */
    float *d, *s;    /* [M][slots]: d_x per block of `block` inputs, and d_x * sum q_x (per 32 only) */
    int16_t *bsums;  /* [M][K / 16]: sum q_x per 16 inputs (K-quants only) */
    long blocks, slots, block;
} Quantized;

static float input(const void *x, int x_bf16, long i) {
    return x_bf16 ? bf16_to_float(((const bf16 *)x)[i]) : ((const float *)x)[i];
}

#if defined(__AVX2__)
static inline __m256 inputs8(const void *x, int x_bf16, long k) {
    if (!x_bf16) return _mm256_loadu_ps((const float *)x + k);
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const bf16 *)x + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)); /* exact, as bf16_to_float */
}

static inline int32_t sum8(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1)));
}

/* quantize_row's arithmetic 32 inputs at a time: the same max (a NaN input never wins it), the same product,
 * rounding and clamp (NaN to -127), the same integer sums */
static void quantize_row8(const void *x, int x_bf16, long K, long block, int8_t *q, float *d, float *s, int16_t *bsums) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (long b = 0; b < K / block; b++) {
        __m256 amax = _mm256_setzero_ps();
        for (long k = b * block; k < (b + 1) * block; k += 8)
            amax = _mm256_max_ps(_mm256_and_ps(inputs8(x, x_bf16, k), magnitude), amax);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float scale = _mm_cvtss_f32(m4) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum = 0;
        for (long k = b * block; k < (b + 1) * block; k += 32) {
            __m256i ints[4];
            for (int t = 0; t < 4; t++) {
                const __m256 r = _mm256_round_ps(_mm256_mul_ps(inputs8(x, x_bf16, k + 8 * t), _mm256_set1_ps(inverse)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                ints[t] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f)));
            }
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
            _mm256_storeu_si256((__m256i *)(q + k), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            const int32_t low = sum8(_mm256_add_epi32(ints[0], ints[1])), high = sum8(_mm256_add_epi32(ints[2], ints[3]));
            if (bsums) bsums[k / 16] = (int16_t)low, bsums[k / 16 + 1] = (int16_t)high;
            sum += low + high;
        }
        d[b] = scale;
        if (s) s[b] = scale * (float)sum;
    }
}
#endif

/* one row rounded to 8 bits per `block` inputs (32, or a K-quant's 256) */
static void quantize_row(const void *x, int x_bf16, long K, long block, int8_t *q, float *d, float *s, int16_t *bsums) {
#if defined(__AVX2__)
    quantize_row8(x, x_bf16, K, block, q, d, s, bsums);
#else
    for (long b = 0; b < K / block; b++) {
        float amax = 0.0f;
        for (long k = b * block; k < (b + 1) * block; k++) {
            const float a = fabsf(input(x, x_bf16, k));
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum = 0;
        for (long k = b * block; k < (b + 1) * block; k++) {
            const float r = rintf(input(x, x_bf16, k) * inverse);
            const int qk = r >= -127.0f && r <= 127.0f ? (int)r : (r > 0.0f ? 127 : -127); /* NaN: -127 */
            q[k] = (int8_t)qk;
            sum += qk;
        }
        d[b] = scale;
        if (s) s[b] = scale * (float)sum;
    }
    if (bsums)
        for (long t = 0; t < K / 16; t++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += q[16 * t + k];
            bsums[t] = (int16_t)sum;
        }
#endif
}

static int quantize(const void *x, int x_bf16, long M, long K, long x_stride, int k_quant, Quantized *out, int threads) {
    out->blocks = K / QBLOCK;
    out->block = k_quant ? GROUP * QBLOCK : QBLOCK;
    out->slots = k_quant ? K / out->block : (out->blocks + GROUP - 1) / GROUP * GROUP;
    out->q = malloc(M * K);
    out->d = calloc(M * out->slots, sizeof(float));
    out->s = k_quant ? NULL : calloc(M * out->slots, sizeof(float));
    out->bsums = k_quant ? malloc(M * (K / 16) * sizeof(int16_t)) : NULL;
    if (!out->q || !out->d || (k_quant ? !out->bsums : !out->s)) return -1;
    const size_t elem = x_bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long i = 0; i < M; i++)
        quantize_row((const char *)x + i * x_stride * elem, x_bf16, K, out->block, out->q + i * K,
                     out->d + i * out->slots, k_quant ? NULL : out->s + i * out->slots,
                     k_quant ? out->bsums + i * (K / 16) : NULL);
    return 0;
}

/* ---- one block's integer dot products, 8 lanes ---------------------------------------------------- */

#if defined(__AVX2__)
typedef __m256 lanes;
static inline lanes lanes_zero(void) { return _mm256_setzero_ps(); }

/* 16 bytes' nibbles in input order: low nibbles, then high ones (Q4_0, Q4_1, Q5_x's low bits) */
static inline __m256i split_nibbles(const uint8_t *p) {
    /* the 16 bytes in both halves (one load), the high half shifted down a nibble, both masked */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(15));
}

/* 32 bytes' low (shift 0) or high (shift 4) nibbles, or bit pairs (shift 0, 2, 4, 6; mask 3) and bits (mask 1) */
static inline __m256i bits_at(const uint8_t *p, int shift, int mask) {
    const __m256i v = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)p), _mm_cvtsi32_si128(shift));
    return _mm256_and_si256(v, _mm256_set1_epi8((char)mask));
}

/* bit k of the 32 bits at p as byte k: 16 where set, else 0 (Q5_0 / Q5_1's fifth bits) */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i byte_of = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  /* low half */
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3); /* high half */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), byte_of), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* block b's 32 integers of the group at g, in input order (gguf_blocks.h's block_integers, 32 at once); the
 * per-32 types (the K-quants: k_quant_tile.h) */
static inline __m256i weight_ints(const uint8_t *g, long b, const int type) {
    switch (type) {
    case GGUF_Q8_0: return _mm256_loadu_si256((const __m256i *)(g + header_bytes(type) + b * 32));
    case GGUF_Q4_0:
    case GGUF_Q4_1: return split_nibbles(g + header_bytes(type) + b * 16);
    default: { /* Q5_0, Q5_1 */
        const uint8_t *qh = g + b * gguf_block_bytes(type) + (type == GGUF_Q5_1 ? 4 : 2);
        return _mm256_or_si256(split_nibbles(qh + 4), fifth_bits(qh));
    }
    }
}

/* the 8 halves at p + b * bytes (b < count; zeros past it) in one register, built in registers (halves stored
 * to memory one by one and read back as one vector stall the load) */
static inline __m128i gathered_halves(const uint8_t *p, long bytes, long count) {
    if (count == GROUP)
        return _mm_setr_epi16((short)read_u16(p), (short)read_u16(p + bytes), (short)read_u16(p + 2 * bytes),
                              (short)read_u16(p + 3 * bytes), (short)read_u16(p + 4 * bytes),
                              (short)read_u16(p + 5 * bytes), (short)read_u16(p + 6 * bytes),
                              (short)read_u16(p + 7 * bytes));
    uint16_t h[GROUP] = {0};
    for (long b = 0; b < count; b++) h[b] = read_u16(p + b * bytes);
    return _mm_loadu_si128((const __m128i *)h);
}

/* Q5_0 / Q5_1's scales d (and offsets m) of a group, 8 at once, converted by F16C exactly as fp16_to_float does
 * one at a time (Q5_0's m = -16 d is exact too) */
static inline void q5_group_scales(int type, const uint8_t *g, long count, float *d, float *m) {
    const long bytes = gguf_block_bytes(type);
    const __m256 dv = _mm256_cvtph_ps(gathered_halves(g, bytes, count));
    _mm256_storeu_ps(d, dv);
    _mm256_storeu_ps(m, type == GGUF_Q5_1 ? _mm256_cvtph_ps(gathered_halves(g + 2, bytes, count))
                                          : _mm256_mul_ps(dv, _mm256_set1_ps(-16.0f)));
}

/* lane l: sum of w[4l + t] x[4l + t], t < 4 (w unsigned, or signed bytes where `signed_w`) */
static inline __m256i block_dot(__m256i w, __m256i x, int signed_w) {
    if (signed_w) { /* |w| times x with w's sign: unsigned by signed */
        x = _mm256_sign_epi8(x, w);
        w = _mm256_sign_epi8(w, w);
    }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

static inline lanes add_scaled(lanes acc, __m256i sums, const float *scale) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_broadcast_ss(scale), acc);
}

/* block b's products (w, x: its 32 integers) scaled into the even or the odd blocks' running sum: two chains of
 * fused multiply-adds, each half as long (tile's order, which every tier keeps) */
static inline __attribute__((always_inline)) void add_even_or_odd(lanes *even, lanes *odd, long b, __m256i w, __m256i x,
                                                                   int signed_w, const float *scale) {
    const __m256i sums = block_dot(w, x, signed_w);
    if (b % 2)
        *odd = add_scaled(*odd, sums, scale);
    else
        *even = add_scaled(*even, sums, scale);
}

static inline lanes add_products(lanes acc, const float *m, const float *s) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(m), _mm256_loadu_ps(s), acc);
}

static inline lanes lanes_add(lanes a, lanes b) { return _mm256_add_ps(a, b); }

static inline float lanes_total(lanes v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l + (l + 4) */
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));                                /* l + (l + 2) */
    half = _mm_add_ss(half, _mm_shuffle_ps(half, half, 1));                            /* 0 + 1 */
    return _mm_cvtss_f32(half);
}
#else
typedef struct { float v[LANES]; } lanes;
static inline lanes lanes_zero(void) { lanes z = {{0}}; return z; }

static inline lanes add_block(lanes acc, const int8_t *w, const int8_t *x, const float *scale) {
    for (int l = 0; l < LANES; l++) {
        int32_t sum = 0;
        for (int t = 0; t < 4; t++) sum += w[4 * l + t] * x[4 * l + t];
        acc.v[l] = fmaf((float)sum, *scale, acc.v[l]);
    }
    return acc;
}

static inline lanes add_products(lanes acc, const float *m, const float *s) {
    for (int l = 0; l < LANES; l++) acc.v[l] = fmaf(m[l], s[l], acc.v[l]);
    return acc;
}

static inline lanes lanes_add(lanes a, lanes b) {
    for (int l = 0; l < LANES; l++) a.v[l] = a.v[l] + b.v[l];
    return a;
}

static inline float lanes_total(lanes a) {
    float h[4];
    for (int l = 0; l < 4; l++) h[l] = a.v[l] + a.v[l + 4];
    h[0] = h[0] + h[2], h[1] = h[1] + h[3];
    return h[0] + h[1];
}
#endif

#if defined(__AVX512BW__)
/* AVX512: blocks 2c and 2c+1 of a group in one register (block 2c's 32 integers in the low half, 2c+1's in the
 * high one): the same integers in the same lanes as two calls of weight_ints and block_dot */
static inline __m512i pair_weight_ints(const uint8_t *g, int c, const int type) {
    const __m512i nibble_shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0); /* 128-bit lanes: low, high, low, high */
    switch (type) {
    case GGUF_Q8_0: return _mm512_loadu_si512((const void *)(g + header_bytes(type) + 2 * c * 32));
    case GGUF_Q4_0:
    case GGUF_Q4_1: { /* the two blocks' 16 bytes each, as 128-bit lanes A, A, B, B */
        const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g + header_bytes(type) + 2 * c * 16)));
        return _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(v, v, 0x50), nibble_shifts), _mm512_set1_epi8(15));
    }
    default: { /* Q5_0, Q5_1: the fifth bits, 32 per block, are a byte mask */
        const long bytes = gguf_block_bytes(type), skip = type == GGUF_Q5_1 ? 4 : 2;
        const uint8_t *qa = g + 2 * c * bytes + skip, *qb = qa + bytes;
        const __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qa + 4))),
                                                      0xff00, _mm_loadu_si128((const __m128i *)(qb + 4)));
        uint32_t ha, hb;
        memcpy(&ha, qa, 4);
        memcpy(&hb, qb, 4);
        const __m512i low = _mm512_and_si512(_mm512_srlv_epi64(v, nibble_shifts), _mm512_set1_epi8(15));
        return _mm512_or_si512(low, _mm512_maskz_mov_epi8((__mmask64)ha | (__mmask64)hb << 32, _mm512_set1_epi8(16)));
    }
    }
}

static inline __m512i pair_dot(__m512i w, __m512i x, int signed_w) {
    if (signed_w) { /* |w| times x with w's sign */
        x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
        w = _mm512_abs_epi8(w);
    }
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
#endif
}
#endif

/* ---- tiles ------------------------------------------------------------------------------------------ */

static inline void store(float total, const float *bias, long n, void *out, int out_bf16, long at) {
    if (bias) total = total + bias[n];
    if (out_bf16)
        ((bf16 *)out)[at] = float_to_bf16(total);
    else
        ((float *)out)[at] = total;
}

/* the scales d and offsets m of the group at g (count blocks) of a per-32 type: d q + m is a weight */
static inline void group_weight_scales(const int type, const uint8_t *g, long count, float dw[GROUP], float m[GROUP]) {
    const int offset = has_offset(type);
    const uint16_t *head = (const uint16_t *)g;
    if (as_in_file(type)) { /* Q5_0, Q5_1 */
#if defined(__AVX2__)
        q5_group_scales(type, g, count, dw, m);
#else
        float unused[GROUP];
        file_group_scales(type, g, count, dw, unused, m);
#endif
        return;
    }
#if defined(__AVX2__) /* F16C: the same exact conversion, 8 at once */
    _mm256_storeu_ps(dw, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)head)));
    if (offset) _mm256_storeu_ps(m, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + GROUP))));
#else
    for (int b = 0; b < GROUP; b++) dw[b] = fp16_to_float(head[b]);
    if (offset)
        for (int b = 0; b < GROUP; b++) m[b] = fp16_to_float(head[GROUP + b]);
#endif
    if (!offset)
        for (int b = 0; b < GROUP; b++) m[b] = type == GGUF_Q4_0 ? -8.0f * dw[b] : 0.0f;
}

#include "k_quant_tile.h"
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include "amx_k_tile.h"
#endif
#if defined(__AVX2__) && !defined(__AVX512BW__)
#include "k_quant_unpacked.h"
#include "k_quant_row.h"
#include "quant_unpacked.h"
#include "quant_row.h"
#endif

/* rows [0, mr) x columns [0, nr) over all of K, for the per-32 types; mr, nr compile-time where inlined */
static inline __attribute__((always_inline)) void tile(const Quantized *a, long row, const uint8_t *w, long col_bytes,
                                                       const int type, const float *bias, long n0, void *out, int out_bf16,
                                                       long out_stride, const int mr, const int nr) {
    const int signed_w = is_signed(type);
    const long blocks = a->blocks, K = blocks * QBLOCK;
#if defined(__AVX512BW__)
    __m512 acc[MR][NR]; /* lanes 0-7: the even blocks', 8-15: the odd ones' */
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
#else
    lanes acc[MR][NR], odd[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = lanes_zero(), odd[i][j] = lanes_zero();
#endif
    long at = 0; /* byte offset of the group within a column */
    for (long g = 0; g * GROUP < blocks; g++) {
        const long count = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
        const long bytes = group_bytes(type, count);
        float scale[MR][NR][GROUP], m[NR][GROUP];
        for (int j = 0; j < nr; j++) {
            float dw[GROUP];
            group_weight_scales(type, w + j * col_bytes + at, count, dw, m[j]);
            for (int i = 0; i < mr; i++) {
                const float *dx = a->d + (row + i) * a->slots + g * GROUP;
                for (int b = 0; b < GROUP; b++) scale[i][j][b] = dw[b] * dx[b];
            }
        }
#if defined(__AVX2__)
        prefetch_run(w + nr * at, nr * bytes, PREFETCH_AHEAD); /* the tile's columns, from memory */
#endif
#if defined(__AVX512BW__)
        for (int c = 0; 2 * c + 1 < count; c++) {
            const long k = (g * GROUP + 2 * c) * QBLOCK;
            __m512i wq[NR];
            for (int j = 0; j < nr; j++) wq[j] = pair_weight_ints(w + j * col_bytes + at, c, type);
            for (int i = 0; i < mr; i++) {
                const __m512i xq = _mm512_loadu_si512((const void *)(a->q + (row + i) * K + k));
                for (int j = 0; j < nr; j++) {
                    const __m512 scales = _mm512_insertf32x8(_mm512_set1_ps(scale[i][j][2 * c]),
                                                             _mm256_set1_ps(scale[i][j][2 * c + 1]), 1);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_dot(wq[j], xq, signed_w)), scales, acc[i][j]);
                }
            }
        }
        if (count % 2) { /* the last group's odd block out: the even lanes only */
            const long b = count - 1, k = (g * GROUP + b) * QBLOCK;
            __m256i wq[NR];
            for (int j = 0; j < nr; j++) wq[j] = weight_ints(w + j * col_bytes + at, b, type);
            for (int i = 0; i < mr; i++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + k));
                for (int j = 0; j < nr; j++)
                    acc[i][j] = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(_mm256_cvtepi32_ps(block_dot(wq[j], xq, signed_w))),
                                                      _mm512_set1_ps(scale[i][j][b]), acc[i][j], 0x00ff);
            }
        }
        if (!signed_w)
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++)
                    acc[i][j] = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(_mm256_loadu_ps(m[j])),
                                                      _mm512_castps256_ps512(_mm256_loadu_ps(a->s + (row + i) * a->slots + g * GROUP)),
                                                      acc[i][j], 0x00ff);
#else
        for (long b = 0; b < count; b++) {
            const long k = (g * GROUP + b) * QBLOCK;
#if defined(__AVX2__)
            __m256i wq[NR];
            for (int j = 0; j < nr; j++) wq[j] = weight_ints(w + j * col_bytes + at, b, type);
            for (int i = 0; i < mr; i++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(a->q + (row + i) * K + k));
                for (int j = 0; j < nr; j++) add_even_or_odd(&acc[i][j], &odd[i][j], b, wq[j], xq, signed_w, &scale[i][j][b]);
            }
#else
            int8_t wq[NR][QBLOCK];
            for (int j = 0; j < nr; j++) block_integers(type, w + j * col_bytes + at, b, wq[j]);
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    lanes *sum = b % 2 ? &odd[i][j] : &acc[i][j];
                    *sum = add_block(*sum, wq[j], a->q + (row + i) * K + k, &scale[i][j][b]);
                }
#endif
        }
        if (!signed_w)
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++)
                    acc[i][j] = add_products(acc[i][j], m[j], a->s + (row + i) * a->slots + g * GROUP);
#endif
        at += bytes;
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
#if defined(__AVX512BW__)
            const lanes total = _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
#else
            const lanes total = lanes_add(acc[i][j], odd[i][j]);
#endif
            store(lanes_total(total), bias, n0 + j, out, out_bf16, (row + i) * out_stride + n0 + j);
        }
}

#define TILE(MRV, NRV)                                                                   \
    if (is_k_quant(type)) k_tile(a, m, w, col, type, bias, n, out, out_bf16, out_stride, MRV, NRV); \
    else tile(a, m, w, col, type, bias, n, out, out_bf16, out_stride, MRV, NRV)
#define TILE_MR(NRV)              \
    switch (mr) {                 \
    case 1: TILE(1, NRV); break;  \
    case 2: TILE(2, NRV); break;  \
    case 3: TILE(3, NRV); break;  \
    default: TILE(4, NRV); break; \
    }

/* columns [n_begin, n_end) for every row: rows in chunks whose inputs stay in L2, a tile of columns at a
 * time over the chunk (its weights stay in L1); one row takes 4 columns per tile (more weight streams in
 * flight), more rows 4 x 2. Inlined once per type, so each tile is compiled for one type. */
static inline __attribute__((always_inline)) void columns(const Quantized *a, long M, const uint8_t *packed,
                                                          const int type, long col, const float *bias, void *out,
                                                          int out_bf16, long out_stride, long n_begin, long n_end) {
    for (long m0 = 0; m0 < M; m0 += ROW_CHUNK) {
        const long m_end = M - m0 < ROW_CHUNK ? M : m0 + ROW_CHUNK;
        const int width = m_end - m0 == 1 ? NR : is_k_quant(type) ? K_NR : 2;
        for (long n = n_begin; n < n_end; n += width) {
            const int nr = n_end - n < width ? (int)(n_end - n) : width;
            const uint8_t *w = packed + n * col;
            for (long m = m0; m < m_end; m += MR) {
                const int mr = m_end - m < MR ? (int)(m_end - m) : MR;
#if defined(__AVX2__) /* the full widths' tiles compiled for their shapes; a thread's last columns take any shape */
                if (nr == 4) TILE_MR(4)
                else if (nr == 2) TILE_MR(2)
                else TILE(mr, nr);
#else /* plain C: one tile for every shape (each shape compiled apart took minutes) */
                TILE(mr, nr);
#endif
            }
        }
    }
}
#undef TILE_MR
#undef TILE

/* columns for one type, out of line: one function per type, each compiled apart (all of them inlined in
 * quant_dot_linear's parallel region made one function of hundreds of KB, which took the compiler minutes) */
#define COLUMNS_OF(T)                                                                                              \
    static __attribute__((noinline)) void columns_##T(const Quantized *a, long M, const uint8_t *packed, long col, \
                                                      const float *bias, void *out, int out_bf16, long out_stride,  \
                                                      long n_begin, long n_end) {                                   \
        columns(a, M, packed, T, col, bias, out, out_bf16, out_stride, n_begin, n_end);                            \
    }
COLUMNS_OF(GGUF_Q4_0) COLUMNS_OF(GGUF_Q4_1) COLUMNS_OF(GGUF_Q5_0) COLUMNS_OF(GGUF_Q5_1) COLUMNS_OF(GGUF_Q8_0)
COLUMNS_OF(GGUF_Q4_K) COLUMNS_OF(GGUF_Q5_K) COLUMNS_OF(GGUF_Q6_K)
#undef COLUMNS_OF

/* out [M, N] (row stride out_stride, float32 or bf16) = x [M, K] (row stride x_stride, float32 or bf16)
 * @ W^T + bias (float32, or NULL). packed: quant_dot_pack's. Returns 0, or -1 when out of memory. */
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
/* quant_dot_linear's K-quant prefills on AMX tiles: each thread a run of whole 16-column tiles */
static int amx_linear(const Quantized *a, long M, long K, const uint8_t *packed, int type, long N, const float *bias,
                      void *out, int out_bf16, long out_stride, int threads) {
    AmxInputs v = {0};
    int status = amx_inputs(a, M, &v, threads);
    if (status == 0) {
        const long col = column_bytes(type, K), tiles = (N + AMX_COLS - 1) / AMX_COLS;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : status)
        {
            extern int omp_get_thread_num(void), omp_get_num_threads(void);
            const long t = omp_get_thread_num(), n = omp_get_num_threads();
            const long begin = AMX_COLS * (tiles * t / n), whole = AMX_COLS * (tiles * (t + 1) / n), end = whole < N ? whole : N;
            switch (type) { /* one copy of the pass per type */
            case GGUF_Q4_K: status |= amx_columns(&v, M, packed, GGUF_Q4_K, col, K, bias, out, out_bf16, out_stride, begin, end); break;
            case GGUF_Q5_K: status |= amx_columns(&v, M, packed, GGUF_Q5_K, col, K, bias, out, out_bf16, out_stride, begin, end); break;
            default: status |= amx_columns(&v, M, packed, GGUF_Q6_K, col, K, bias, out, out_bf16, out_stride, begin, end); break;
            }
        }
    }
    amx_inputs_free(&v);
    return status;
}
#endif

int quant_dot_linear(const void *x, int x_bf16, long M, long K, long x_stride, const uint8_t *packed, int type, long N,
                     const float *bias, void *out, int out_bf16, long out_stride, int num_threads) {
    const int threads = num_threads < 2 || M * N * K < QUANT_DOT_PARALLEL_MIN_WORK || N < 2 ? 1 : num_threads;
    Quantized a = {0};
    int status = 0;
    if (quantize(x, x_bf16, M, K, x_stride, is_k_quant(type), &a, M > 1 ? threads : 1) == 0) {
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
        if (is_k_quant(type) && M >= AMX_MIN_ROWS && amx_permitted()) {
            status = amx_linear(&a, M, K, packed, type, N, bias, out, out_bf16, out_stride, threads);
            free(a.q), free(a.d), free(a.s), free(a.bsums);
            return status;
        }
#endif
        const long col = column_bytes(type, K);
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            extern int omp_get_thread_num(void), omp_get_num_threads(void);
            const long t = omp_get_thread_num(), n = omp_get_num_threads();
            const long begin = N * t / n, end = N * (t + 1) / n;
#if defined(__AVX2__) && !defined(__AVX512BW__)
            if (is_k_quant(type) && M >= UNPACKED_MIN_ROWS) {
                int failed;
                switch (type) {
                case GGUF_Q4_K: failed = k_unpacked_columns(&a, M, packed, GGUF_Q4_K, col, bias, out, out_bf16, out_stride, begin, end); break;
                case GGUF_Q5_K: failed = k_unpacked_columns(&a, M, packed, GGUF_Q5_K, col, bias, out, out_bf16, out_stride, begin, end); break;
                default: failed = k_unpacked_columns(&a, M, packed, GGUF_Q6_K, col, bias, out, out_bf16, out_stride, begin, end); break;
                }
                if (failed) {
#pragma omp atomic write
                    status = -1;
                }
            } else if (is_k_quant(type) && M == 1) {
                switch (type) {
                case GGUF_Q4_K: k_row_columns(&a, packed, GGUF_Q4_K, col, bias, out, out_bf16, begin, end); break;
                case GGUF_Q5_K: k_row_columns(&a, packed, GGUF_Q5_K, col, bias, out, out_bf16, begin, end); break;
                default: k_row_columns(&a, packed, GGUF_Q6_K, col, bias, out, out_bf16, begin, end); break;
                }
            } else if (M == 1) {
                switch (type) {
#define ROW_CASE(T) case T: row_columns(&a, packed, T, col, bias, out, out_bf16, begin, end); break;
                    ROW_CASE(GGUF_Q4_0) ROW_CASE(GGUF_Q4_1) ROW_CASE(GGUF_Q5_0) ROW_CASE(GGUF_Q5_1)
#undef ROW_CASE
                default: row_columns(&a, packed, GGUF_Q8_0, col, bias, out, out_bf16, begin, end); break;
                }
            } else if (M >= UNPACKED_MIN_ROWS) {
                int failed;
                switch (type) {
#define UNPACKED_CASE(T) case T: failed = unpacked_columns(&a, M, packed, T, col, bias, out, out_bf16, out_stride, begin, end); break;
                    UNPACKED_CASE(GGUF_Q4_0) UNPACKED_CASE(GGUF_Q4_1) UNPACKED_CASE(GGUF_Q5_0) UNPACKED_CASE(GGUF_Q5_1)
#undef UNPACKED_CASE
                default: failed = unpacked_columns(&a, M, packed, GGUF_Q8_0, col, bias, out, out_bf16, out_stride, begin, end); break;
                }
                if (failed) {
#pragma omp atomic write
                    status = -1;
                }
            } else
#endif
            switch (type) { /* one copy of the tiles per type */
#define TYPE_CASE(T) case T: columns_##T(&a, M, packed, col, bias, out, out_bf16, out_stride, begin, end); break;
                TYPE_CASE(GGUF_Q4_0) TYPE_CASE(GGUF_Q4_1) TYPE_CASE(GGUF_Q5_0) TYPE_CASE(GGUF_Q5_1)
                TYPE_CASE(GGUF_Q4_K) TYPE_CASE(GGUF_Q5_K) TYPE_CASE(GGUF_Q6_K)
#undef TYPE_CASE
            default: columns_GGUF_Q8_0(&a, M, packed, col, bias, out, out_bf16, out_stride, begin, end); break;
            }
        }
    } else {
        status = -1;
    }
    free(a.q);
    free(a.d);
    free(a.s);
    free(a.bsums);
    return status;
}


/* quant_dot_linear with bf16 (or float32) inputs and outputs, in the argument order of quant_f32_linear: the
 * quantized linears of the decoder loops (decoder/loop_portable.c, built for float32 or bf16; loop_avx512_bf16.c) */
int quant_dot_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int type, long N,
                          const float *bias, bf16 *out, long out_stride, int num_threads) {
    return quant_dot_linear(x, 1, M, K, x_stride, packed, type, N, bias, out, 1, out_stride, num_threads);
}

int quant_dot_linear_f32(const float *x, long M, long K, long x_stride, const uint8_t *packed, int type, long N,
                         const float *bias, float *out, long out_stride, int num_threads) {
    return quant_dot_linear(x, 0, M, K, x_stride, packed, type, N, bias, out, 0, out_stride, num_threads);
}

/* columns ids of W dequantized (an embedding lookup): out[r] = the values of column ids[r], K of them, in
 * float32 or bf16: gguf-py's dequantized values (gguf_blocks.h's block_value) */
void quant_dot_rows(const uint8_t *packed, int type, long K, const int64_t *ids, long count, void *out, int out_bf16) {
    const long blocks = K / QBLOCK, col = column_bytes(type, K);
    for (long r = 0; r < count; r++) {
        const uint8_t *w = packed + ids[r] * col;
        long at = 0;
        for (long g = 0; g * GROUP < blocks; g++) {
            const long n = blocks - g * GROUP < GROUP ? blocks - g * GROUP : GROUP;
            float lo[GROUP], hi[GROUP], m[GROUP];
            group_scales(type, w + at, n, lo, hi, m);
            for (long b = 0; b < n; b++) {
                int8_t q[QBLOCK];
                block_integers(type, w + at, b, q);
                for (int k = 0; k < QBLOCK; k++) {
                    const float v = block_value(type, lo[b], hi[b], m[b], k, q[k]);
                    const long i = r * K + (g * GROUP + b) * QBLOCK + k;
                    if (out_bf16)
                        ((bf16 *)out)[i] = float_to_bf16(v);
                    else
                        ((float *)out)[i] = v;
                }
            }
            at += group_bytes(type, n);
        }
    }
}
