/* GGUF's block layouts as quant_int8_rows.c reads them: for each group of 8 blocks of 32 inputs, the blocks'
 * weight scales and offsets as float32, and each block's 32 integers in input order.
 *
 * Q4_0, Q4_1, Q8_0 come repacked (quant_dot_pack: the group's scales first, then the blocks' integers);
 * Q5_0, Q5_1 and the K-quants stay as the file has them, so a group is 8 GGUF blocks (Q5_x: 22 or 24
 * bytes each) or one K-quant super-block of 256 inputs:
 *   Q4_K (144 bytes): d, dmin fp16; 12 bytes of 6-bit sub-block scales sc[8] and mins mn[8]; qs[128], 4 bits:
 *         bytes 32c..32c+31 hold block 2c in their low nibbles and block 2c+1 in their high ones.
 *   Q5_K (176 bytes): as Q4_K, then qh[32] before qs: bit b of qh[i] is input i of block b's fifth bit.
 *   Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8 (one per 16 inputs), d fp16;
 *         block b: ql bytes 64(b/4) + 32(b%2), nibble (b/2)%2; qh bytes 32(b/4), bits 2(b%4)..+1.
 * A block's value is d_w q + m_w, q its integer: Q4_K and Q5_K d_w = d sc[b], m_w = -dmin mn[b] (both exact in
 * fp32); Q5_0 m_w = -16 d, Q4_0 m_w = -8 d; Q5_1 and Q4_1 store m. Q8_0 and Q6_K have signed integers and no
 * offset (Q6_K's q - 32, with one d_w per 16 inputs: d scales[s]). gguf-py dequantizes to the same values.
 */
#ifndef NVLLM_GGUF_BLOCKS_H
#define NVLLM_GGUF_BLOCKS_H
#include <stdint.h>
#include <string.h>

#include "../bf16_scalar.h"
#include "prefetch_run.h"

enum { GGUF_Q4_0 = 2, GGUF_Q4_1 = 3, GGUF_Q5_0 = 6, GGUF_Q5_1 = 7, GGUF_Q8_0 = 8, GGUF_Q4_K = 12, GGUF_Q5_K = 13,
       GGUF_Q6_K = 14 };
#define QBLOCK 32
#define GROUP 8 /* blocks per group: one vector of 8 scales; a K-quant super-block */

static inline int known_type(int type) {
    return type == GGUF_Q4_0 || type == GGUF_Q4_1 || type == GGUF_Q5_0 || type == GGUF_Q5_1 || type == GGUF_Q8_0
           || type == GGUF_Q4_K || type == GGUF_Q5_K || type == GGUF_Q6_K;
}
static inline int is_k_quant(int type) { return type == GGUF_Q4_K || type == GGUF_Q5_K || type == GGUF_Q6_K; }
/* kept in the file's layout (else repacked by quant_dot_pack) */
static inline int as_in_file(int type) { return type == GGUF_Q5_0 || type == GGUF_Q5_1 || is_k_quant(type); }
/* signed integers and no offset */
static inline int is_signed(int type) { return type == GGUF_Q8_0 || type == GGUF_Q6_K; }

/* bytes of one GGUF block: 32 inputs, or 256 for the K-quants */
static inline long gguf_block_bytes(int type) {
    switch (type) {
    case GGUF_Q4_0: return 18;
    case GGUF_Q4_1: return 20;
    case GGUF_Q5_0: return 22;
    case GGUF_Q5_1: return 24;
    case GGUF_Q8_0: return 34;
    case GGUF_Q4_K: return 144;
    case GGUF_Q5_K: return 176;
    default: return 210; /* Q6_K */
    }
}

/* the repacked types: header (scales) bytes of a group, integer bytes of a block */
static inline int has_offset(int type) { return type == GGUF_Q4_1; }
static inline long block_ints(int type) { return type == GGUF_Q8_0 ? 32 : 16; }
static inline long header_bytes(int type) { return (has_offset(type) ? 2 : 1) * GROUP * 2; }

/* bytes of a group of `count` blocks (count < GROUP only for the last group of a column; never for K-quants) */
static inline long group_bytes(int type, long count) {
    if (is_k_quant(type)) return gguf_block_bytes(type);
    if (as_in_file(type)) return count * gguf_block_bytes(type);
    return header_bytes(type) + count * block_ints(type);
}

static inline uint16_t read_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* the 6-bit scales and mins of a Q4_K / Q5_K super-block's 12 scale bytes, a byte each, as two words:
 * scales[0] holds sc[0..3], scales[1] sc[4..7], mins likewise. The bytes are three words: a = sc[0..3] with the
 * high bits of sc[4..7] on top, b = mn[0..3] with the high bits of mn[4..7], c = the low nibbles of sc[4..7] and
 * mn[4..7]. */
static inline void k_scales_and_mins(const uint8_t *s, uint32_t scales[2], uint32_t mins[2]) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    scales[0] = a & 0x3f3f3f3fu, mins[0] = b & 0x3f3f3f3fu;
    scales[1] = (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4;
    mins[1] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4;
}

/* byte b (of 8) of two words */
static inline int word_byte(const uint32_t w[2], int b) { return (int)((w[b / 4] >> (8 * (b % 4))) & 255); }

/* the weight scales (lo: inputs 0..15 of each block, hi: 16..31) and offsets of a group of a type kept as in
 * the file; slots past `count` are zero */
static inline void file_group_scales(int type, const uint8_t *g, long count, float *lo, float *hi, float *m) {
    for (int b = 0; b < GROUP; b++) lo[b] = hi[b] = m[b] = 0.0f;
    if (type == GGUF_Q4_K || type == GGUF_Q5_K) {
        const float d = fp16_to_float(read_u16(g)), dmin = fp16_to_float(read_u16(g + 2));
        uint32_t scales[2], mins[2];
        k_scales_and_mins(g + 4, scales, mins);
        for (int b = 0; b < GROUP; b++) {
            lo[b] = hi[b] = d * (float)word_byte(scales, b);
            m[b] = -(dmin * (float)word_byte(mins, b));
        }
    } else if (type == GGUF_Q6_K) {
        const float d = fp16_to_float(read_u16(g + 208));
        const int8_t *scales = (const int8_t *)(g + 192);
        for (int b = 0; b < GROUP; b++) {
            lo[b] = d * (float)scales[2 * b];
            hi[b] = d * (float)scales[2 * b + 1];
        }
    } else { /* Q5_0, Q5_1 */
        const long bytes = gguf_block_bytes(type);
        for (long b = 0; b < count; b++) {
            const uint8_t *block = g + b * bytes;
            lo[b] = hi[b] = fp16_to_float(read_u16(block));
            m[b] = type == GGUF_Q5_1 ? fp16_to_float(read_u16(block + 2)) : -16.0f * lo[b];
        }
    }
}

/* the weight scales and offsets of any group (the tile reads the repacked types' scales 8 at once instead) */
static inline void group_scales(int type, const uint8_t *g, long count, float *lo, float *hi, float *m) {
    if (as_in_file(type)) {
        file_group_scales(type, g, count, lo, hi, m);
        return;
    }
    for (int b = 0; b < GROUP; b++) {
        lo[b] = hi[b] = fp16_to_float(read_u16(g + 2 * b));
        m[b] = type == GGUF_Q4_1   ? fp16_to_float(read_u16(g + 2 * (GROUP + b)))
               : type == GGUF_Q4_0 ? -8.0f * lo[b]
                                   : 0.0f;
    }
}

/* the 32 integers of block b of group g, in input order (unsigned, or signed where is_signed) */
static inline void block_integers(int type, const uint8_t *g, long b, int8_t q[QBLOCK]) {
    switch (type) {
    case GGUF_Q4_0:
    case GGUF_Q4_1: {
        const uint8_t *p = g + header_bytes(type) + b * 16;
        for (int k = 0; k < 16; k++) q[k] = (int8_t)(p[k] & 15), q[k + 16] = (int8_t)(p[k] >> 4);
        break;
    }
    case GGUF_Q8_0: memcpy(q, g + header_bytes(type) + b * 32, QBLOCK); break;
    case GGUF_Q5_0:
    case GGUF_Q5_1: {
        const uint8_t *block = g + b * gguf_block_bytes(type), *qh = block + (type == GGUF_Q5_1 ? 4 : 2);
        const uint8_t *qs = qh + 4;
        uint32_t high;
        memcpy(&high, qh, 4);
        for (int k = 0; k < 16; k++) {
            q[k] = (int8_t)((qs[k] & 15) | ((high >> k) & 1) << 4);
            q[k + 16] = (int8_t)((qs[k] >> 4) | ((high >> (k + 16)) & 1) << 4);
        }
        break;
    }
    case GGUF_Q4_K:
    case GGUF_Q5_K: {
        const int five = type == GGUF_Q5_K;
        const uint8_t *qs = g + 16 + (five ? 32 : 0) + 32 * (b / 2), *qh = g + 16;
        for (int k = 0; k < QBLOCK; k++)
            q[k] = (int8_t)(((qs[k] >> (4 * (b % 2))) & 15) | (five ? ((qh[k] >> b) & 1) << 4 : 0));
        break;
    }
    default: { /* Q6_K */
        const uint8_t *ql = g + 64 * (b / 4) + 32 * (b % 2), *qh = g + 128 + 32 * (b / 4);
        for (int k = 0; k < QBLOCK; k++)
            q[k] = (int8_t)((((ql[k] >> (4 * ((b / 2) % 2))) & 15) | ((qh[k] >> (2 * (b % 4))) & 3) << 4) - 32);
        break;
    }
    }
}

/* the dequantized value of input k of block b whose integer is q: gguf-py's float32 arithmetic */
static inline float block_value(int type, float lo, float hi, float m, int k, int q) {
    const float d = k < 16 ? lo : hi;
    switch (type) {
    case GGUF_Q4_0: return d * (float)(q - 8);
    case GGUF_Q5_0: return d * (float)(q - 16);
    case GGUF_Q8_0:
    case GGUF_Q6_K: return d * (float)q;
    default: return d * (float)q + m; /* Q4_1, Q5_1; Q4_K, Q5_K: d q - dmin mn, m = -(dmin mn) */
    }
}
#endif
