/* Linear layers whose weights stay quantized in memory (GGUF Q4_0, Q4_1, Q8_0; per-channel int8),
 * for AVX512-BF16 CPUs: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and out in bf16.
 *
 * A decode step streams every weight once for a handful of rows, so its time is the weights' bytes
 * over the memory bandwidth: Q4 weights are 5 bits each, Q8 8.5, against bf16's 16.
 *
 * Small M (decode): the weights are never dequantized. A quantized block of 32 inputs of one column
 * holds small integers q and a scale d (Q4_1 also an offset m; Q4_0 is stored as Q4_1 with m = -8d):
 *     sum_k x_k (d q_k + m) = d * sum_k x_k q_k + m * sum_k x_k.
 * The integers go to bf16 with one bitwise op: the bf16 bits 0x4300 | q are the number 128 + q (q < 128),
 * so a vdpbf16ps on (0x4300 | q) pairs adds sum_k x_k (128 + q_k) to a per-block fp32 sum, exactly
 * (bf16 times an 8-bit integer is exact in fp32); at the block's end the column's total takes
 *     total += d * block + (m - 128 d) * sum_k x_k,
 * with sum_k x_k per row and block computed once per call. Q8_0's signed byte q (stored as u = q + 128)
 * is exact in bf16 itself (8 significant bits): u - 128 in 16-bit lanes, widened to fp32 and narrowed to
 * bf16 (exact), so one vdpbf16ps per input pair adds sum_k x_k q_k, and total += d * block.
 *
 * Large M (prefill): each thread dequantizes its columns into nvllm's bf16 panels (dense_bf16_dot.c), a slab
 * that stays in L2 at a time, and runs the bf16 kernel on it: the weights are then bf16(d q + m), the
 * dequantized model's weights bit for bit, and the rate is the bf16 GEMM's.
 *
 * Fixed reduction order per row within each path: a block's pairs in order, then blocks in order, in
 * fp32, whatever the tile, thread or M. The two paths round differently (the small-M path does not round
 * weights to bf16), so a row's bits depend on which path its step took (QUANT_LARGE_M).
 *
 * Batch-invariant (every_row_alike = 1, the engine's default): every M takes the small-M arithmetic, so a
 * row's result never depends on how many rows its step has. From QUANT_LARGE_M rows the weights' bf16
 * words (0x4300 | q ...) are unpacked once per slab of panels into memory that stays in L2 and every
 * tile of rows reads them there (unpacked_columns): the same vectors qtile makes on the fly, in the
 * same order, so the same bits, without unpacking each weight again for every 6 rows.
 *
 * Packed layout, panels of 16 output columns, each a run of blocks of 32 inputs:
 *   Q4 block (320 bytes): d[16], m[16] (fp16), then 4 groups of 32 words; word 2c+p of group g holds in
 *     its nibble i the q of column c, input k = 2 (4 g + i) + p.
 *   Q8 block (544 bytes): d[16] (fp16), then 8 groups of 32 words; word 2c+p of group g holds in its low
 *     byte u of column c, input 2 (2 g) + p, and in its high byte that of input 2 (2 g + 1) + p.
 * Columns past N have d = m = 0. A gated (gate/up) weight's panels alternate 16 gate and 16 up columns.
 */
#include "dense_bf16_dot.c"

#include <stdlib.h>

#include "gguf_q4_q8_block.h"

enum { FORMAT_Q4 = 0, FORMAT_Q8 = 1 };
#define QBLOCK 32
#define Q4_BLOCK_BYTES 320
#define Q8_BLOCK_BYTES 544
#define SMALL_MR 6 /* rows per tile of the small-M path */
#define SMALL_NR 8 /* panels per tile of one row (more streams of weights in flight) */
#define UNPACKED_NR 2 /* panels per tile of the unpacked path (utile): 6 x 2 block sums and totals in registers */
#ifndef QUANT_LARGE_M
#define QUANT_LARGE_M 16 /* from this many rows, dequantize to bf16 panels and run the bf16 kernel */
#endif
#define SLAB_BYTES (512 * 1024) /* bf16 panels one thread dequantizes at a time */
#ifndef QUANT_PARALLEL_MIN_WORK
#define QUANT_PARALLEL_MIN_WORK (1L << 16) /* M * N * K below this: one thread */
#endif


/* nearest even, as torch's float -> bfloat16 (the values here are finite) */
static inline bf16 float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (bf16)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static long block_bytes(int format) { return format == FORMAT_Q4 ? Q4_BLOCK_BYTES : Q8_BLOCK_BYTES; }

/* bytes of a packed weight of N columns and K inputs (K a multiple of 32) */
long quant_packed_bytes(int format, long N, long K) {
    return (N + LANES - 1) / LANES * (K / QBLOCK) * block_bytes(format);
}

/* ---- packing from GGUF rows ---------------------------------------------------------------------- */

/* GGUF rows of a [N, K] weight (type GGUF_Q4_0, GGUF_Q4_1 or GGUF_Q8_0; row_bytes apart) -> packed panels.
 * With gated = 1 the rows are a gate/up weight [2I, K] (I a multiple of 16) and the panels alternate gate
 * and up columns. Returns 0, or -1 for a type this file does not take. */
int quant_pack(const uint8_t *rows, long row_bytes, int type, long N, long K, int gated, uint8_t *packed) {
    if (type != GGUF_Q4_0 && type != GGUF_Q4_1 && type != GGUF_Q8_0) return -1;
    const int format = type == GGUF_Q8_0 ? FORMAT_Q8 : FORMAT_Q4;
    const long blocks = K / QBLOCK, panels = (N + LANES - 1) / LANES, bb = block_bytes(format);
    uint16_t d, m;
    uint8_t q[QBLOCK];
    for (long p = 0; p < panels; p++) {
        /* which rows this panel's columns are: gated panels take 16 gate, then 16 up columns */
        const long first = gated ? (p % 2) * (N / 2) + (p / 2) * LANES : p * LANES;
        for (long b = 0; b < blocks; b++) {
            uint8_t *dst = packed + (p * blocks + b) * bb;
            uint16_t *ds = (uint16_t *)dst, *ms = ds + LANES;
            uint16_t *words = (uint16_t *)(dst + (format == FORMAT_Q4 ? 64 : 32));
            memset(dst, 0, bb);
            for (long c = 0; c < LANES; c++) {
                const long n = first + c;
                if (p * LANES + c >= N) continue; /* padding column: zeros */
                read_block(rows, row_bytes, type, n, b, &d, &m, q);
                ds[c] = d;
                if (format == FORMAT_Q4) {
                    ms[c] = m;
                    for (int k = 0; k < QBLOCK; k++) { /* k = 2 (4 g + i) + p */
                        const int pair = k / 2, g = pair / 4, i = pair % 4;
                        words[g * 32 + 2 * c + k % 2] |= (uint16_t)(q[k] << (4 * i));
                    }
                } else {
                    for (int k = 0; k < QBLOCK; k++) { /* k = 2 (2 g + h) + p */
                        const int pair = k / 2, g = pair / 2, h = pair % 2;
                        words[g * 32 + 2 * c + k % 2] |= (uint16_t)(q[k] << (8 * h));
                    }
                }
            }
        }
    }
    return 0;
}

/* ---- small M: blocks summed on the quantized integers ---------------------------------------------- */

/* per row and block: the sum of the block's 32 inputs, fp32, in one fixed order */
static void block_sums(const bf16 *x, long M, long K, long x_stride, float *sums) {
    const long blocks = K / QBLOCK;
    for (long i = 0; i < M; i++)
        for (long b = 0; b < blocks; b++) {
            const bf16 *p = x + i * x_stride + b * QBLOCK;
            const __m512 lo = widen(_mm256_loadu_si256((const __m256i *)p));
            const __m512 hi = widen(_mm256_loadu_si256((const __m256i *)(p + 16)));
            sums[i * blocks + b] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
        }
}

/* (z >> shift) & 15 | exponent: a nibble of every word as the bf16 number exponent's value + q */
static inline __m512bh nibble(__m512i z, int shift, int exponent) {
    const __m512i s = _mm512_srli_epi16(z, shift);
    return (__m512bh)_mm512_ternarylogic_epi32(s, _mm512_set1_epi16(15), _mm512_set1_epi16(exponent), 0xEA);
}

/* bf16 weight vectors (16 columns x one input pair, or one nibble part of it) per block: Q4 one per input
 * pair, Q8 two (its low and high nibbles), in the order qtile consumes them */
static inline long unpacked_vectors(int format) { (void)format; return QBLOCK / 2; }

/* the byte at `shift` (0 or 8) of every word of a Q8 group, u = q + 128, as the bf16 number q (exact:
 * |q| <= 128); the words keep their order */
static inline __m512bh signed_bytes(__m512i z, int shift) {
    const __m512i q = _mm512_sub_epi16(_mm512_and_si512(_mm512_srli_epi16(z, shift), _mm512_set1_epi16(255)),
                                       _mm512_set1_epi16(128));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(q)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(q, 1)));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* the output columns' epilogue, shared with dense_bf16_dot.c's: bias (fp32) added, rounded to bf16, stored;
 * gated (store_gated): panels j, j + 1 are the gate and up columns of 16 outputs */
static inline __attribute__((always_inline)) void store_columns(__m512 acc, const float *bias, bf16 *out, long n,
                                                                long N) {
    const __mmask16 mask = N - n >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (N - n)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
    _mm256_mask_storeu_epi16(out + n, mask, to_bf16(_mm512_add_ps(acc, b)));
}

/* o: the first of 16 outputs; the bias is in dense_bf16_dot.c's gated order (groups of 32 gate, then 32 up) */
static inline __attribute__((always_inline)) void store_gated(__m512 gate_acc, __m512 up_acc, const float *bias,
                                                              long o, bf16 *out, const bf16 *silu) {
    const long g = (o / 32) * 64 + o % 32;
    const __m512 bg = bias ? _mm512_loadu_ps(bias + g) : _mm512_setzero_ps();
    const __m512 bu = bias ? _mm512_loadu_ps(bias + g + 32) : _mm512_setzero_ps();
    const __m256i gate = to_bf16(_mm512_add_ps(gate_acc, bg));
    const __m256i up = to_bf16(_mm512_add_ps(up_acc, bu));
    const __m512i s = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(gate), (const void *)silu, 2);
    const __m512 product = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(s, 16)), widen(up));
    _mm256_storeu_si256((__m256i *)(out + o), to_bf16(product));
}

/* a block's sums folded into the running totals of rows [0, mr) x panels [0, nr): total += d * block, and
 * for Q4 + (m - 128 d) * (the sum of the block's inputs); qtile and utile share it, so their bits agree */
static inline __attribute__((always_inline)) void fold_block(__m512 total[SMALL_MR][SMALL_NR],
                                                             __m512 blk[SMALL_MR][SMALL_NR], const uint8_t *panels,
                                                             long panel_bytes, long b, long bb, const float *sums,
                                                             long blocks, const int q4, const int mr, const int nr) {
    for (int j = 0; j < nr; j++) {
        const uint8_t *head = panels + j * panel_bytes + b * bb;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
        for (int i = 0; i < mr; i++) total[i][j] = _mm512_fmadd_ps(d, blk[i][j], total[i][j]);
        if (q4) {
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32)));
            const __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), d, m);
            for (int i = 0; i < mr; i++)
                total[i][j] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[i * blocks + b]), total[i][j]);
        }
    }
}

/* the totals of a tile (row i's panel j at total[i * row + j]) to its outputs (gated: panel pairs j, j + 1 are gate
 * and up); amx_quant.c's integer tiles share it */
static inline __attribute__((always_inline)) void store_tile(const __m512 *total, const int row, const float *bias,
                                                             bf16 *out, long out_stride, long n0, long N,
                                                             const bf16 *silu, const int mr, const int nr) {
    for (int i = 0; i < mr; i++) {
        if (silu) {
            for (int j = 0; j + 1 < nr; j += 2)
                store_gated(total[i * row + j], total[i * row + j + 1], bias, (n0 + j * LANES) / 2,
                            out + i * out_stride, silu);
        } else {
            for (int j = 0; j < nr; j++)
                store_columns(total[i * row + j], bias, out + i * out_stride, n0 + j * LANES, N);
        }
    }
}

/* rows [0, mr) x panels [0, nr) over all of K, from the packed blocks; mr, nr compile-time where inlined */
static inline __attribute__((always_inline)) void qtile(const bf16 *x, long x_stride, const float *sums,
                                                        const uint8_t *panels, long K, int format,
                                                        const float *bias, bf16 *out, long out_stride, long n0,
                                                        long N, const bf16 *silu, const int mr, const int nr) {
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    const int header = format == FORMAT_Q4 ? 64 : 32;
    __m512 total[SMALL_MR][SMALL_NR], blk[SMALL_MR][SMALL_NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) total[i][j] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) blk[i][j] = _mm512_setzero_ps();
        const bf16 *xb = x + b * QBLOCK;
        if (format == FORMAT_Q4) {
            for (int g = 0; g < 4; g++) {
                __m512i z[SMALL_NR];
                for (int j = 0; j < nr; j++)
                    z[j] = _mm512_loadu_si512(panels + j * panel_bytes + b * bb + header + g * 64);
                for (int s = 0; s < 4; s++) {
                    __m512bh w[SMALL_NR];
                    for (int j = 0; j < nr; j++) w[j] = nibble(z[j], 4 * s, 0x4300);
                    for (int i = 0; i < mr; i++) {
                        const __m512bh a = broadcast_pair(xb + i * x_stride + 2 * (4 * g + s));
                        for (int j = 0; j < nr; j++) blk[i][j] = _mm512_dpbf16_ps(blk[i][j], a, w[j]);
                    }
                }
            }
        } else {
            for (int g = 0; g < 8; g++) {
                __m512i z[SMALL_NR];
                for (int j = 0; j < nr; j++)
                    z[j] = _mm512_loadu_si512(panels + j * panel_bytes + b * bb + header + g * 64);
                for (int h = 0; h < 2; h++) { /* the low byte: inputs of pair 2g; the high byte: pair 2g + 1 */
                    __m512bh w[SMALL_NR];
                    for (int j = 0; j < nr; j++) w[j] = signed_bytes(z[j], 8 * h);
                    for (int i = 0; i < mr; i++) {
                        const __m512bh a = broadcast_pair(xb + i * x_stride + 2 * (2 * g + h));
                        for (int j = 0; j < nr; j++) blk[i][j] = _mm512_dpbf16_ps(blk[i][j], a, w[j]);
                    }
                }
            }
        }
        fold_block(total, blk, panels, panel_bytes, b, bb, sums, blocks, format == FORMAT_Q4, mr, nr);
    }
    store_tile(&total[0][0], SMALL_NR, bias, out, out_stride, n0, N, silu, mr, nr);
}

#define QTILE(MRV, NRV) \
    qtile(x + m * x_stride, x_stride, sums + m * blocks, panels, K, format, bias, out + m * out_stride, out_stride, \
          n0, N, silu, MRV, NRV)

/* panels [p_begin, p_end) for every row; panel tiles of 8 for one row (more weight streams in flight: 1.1x
 * per decode step than 4), 4 for two, 2 for 3-6 rows (the block sums and totals of mr x nr tiles live in
 * registers). Up to 6 rows share one pass over the weights, so a step verifying 4 proposed tokens (5 rows)
 * unpacks each weight once: its matmuls took 0.77x the time of a 4 + 1 row split. A row's sums run in the
 * same order whatever the tile: its result does not depend on M. */
static void small_columns(const bf16 *x, long M, long K, long x_stride, const float *sums, const uint8_t *packed,
                          int format, long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                          long p_begin, long p_end) {
    const long blocks = K / QBLOCK, panel_bytes = blocks * block_bytes(format);
    for (long m = 0; m < M; m += SMALL_MR) {
        const long mr = M - m < SMALL_MR ? M - m : SMALL_MR;
        const int width = mr == 1 ? SMALL_NR : mr == 2 ? 4 : 2;
        for (long p = p_begin; p < p_end; p += width) {
            const int nr = p_end - p < width ? (int)(p_end - p) : width;
            const uint8_t *panels = packed + p * panel_bytes;
            const long n0 = p * LANES;
            switch (mr * 16 + nr) {
            case 16 + 1: QTILE(1, 1); break;
            case 16 + 2: QTILE(1, 2); break;
            case 16 + 3: QTILE(1, 3); break;
            case 16 + 4: QTILE(1, 4); break;
            case 16 + 5: QTILE(1, 5); break;
            case 16 + 6: QTILE(1, 6); break;
            case 16 + 7: QTILE(1, 7); break;
            case 16 + 8: QTILE(1, 8); break;
            case 32 + 1: QTILE(2, 1); break;
            case 32 + 2: QTILE(2, 2); break;
            case 32 + 3: QTILE(2, 3); break;
            case 32 + 4: QTILE(2, 4); break;
            case 48 + 1: QTILE(3, 1); break;
            case 48 + 2: QTILE(3, 2); break;
            case 64 + 1: QTILE(4, 1); break;
            case 64 + 2: QTILE(4, 2); break;
            case 80 + 1: QTILE(5, 1); break;
            case 80 + 2: QTILE(5, 2); break;
            case 96 + 1: QTILE(6, 1); break;
            default: QTILE(6, 2); break;
            }
        }
    }
}

/* ---- large M, every row alike: qtile's weight vectors unpacked once per slab ------------------------ */

/* a block's bf16 words, as qtile makes them (nibble, signed_bytes): unpacked_vectors(format) vectors, vector v
 * the 16 columns' words of input pair v; words: the block's packed words (past its scales) */
static inline void unpack_block(const uint8_t *words, int format, __m512bh *dst) {
    if (format == FORMAT_Q4) {
        for (int g = 0; g < 4; g++) {
            const __m512i z = _mm512_loadu_si512(words + g * 64);
            for (int s = 0; s < 4; s++) *dst++ = nibble(z, 4 * s, 0x4300);
        }
    } else {
        for (int g = 0; g < 8; g++) {
            const __m512i z = _mm512_loadu_si512(words + g * 64);
            for (int h = 0; h < 2; h++) *dst++ = signed_bytes(z, 8 * h);
        }
    }
}

/* panel p's bf16 words, block after block: unpacked_vectors(format) per block */
static void unpack_panel(const uint8_t *panel, long K, int format, __m512bh *dst) {
    const long blocks = K / QBLOCK, bb = block_bytes(format), vectors = unpacked_vectors(format);
    const int header = format == FORMAT_Q4 ? 64 : 32;
    for (long b = 0; b < blocks; b++) unpack_block(panel + b * bb + header, format, dst + b * vectors);
}

/* rows [0, mr) x panels [0, nr) from unpacked words, with qtile's arithmetic step for step: per block the
 * sums of its vectors, folded into running totals, both in registers (6 x 2: 24 of the 32; a 6 x 4 tile
 * with its totals waiting in L1 took 1.1x the time, their loads and stores once per block). The fold is
 * the price of every row alike: 1 (Q8) or 2 (Q4) multiply-adds per 16 vdpbf16ps, so 1.06x and 1.14x the
 * dequantized path's time at 512-2048 rows. Vector v of a block is input pair v. */
static inline __attribute__((always_inline)) void utile(const bf16 *x, long x_stride, const float *sums,
                                                        const uint8_t *panels, long K, const __m512bh *slab,
                                                        const float *bias, bf16 *out, long out_stride, long n0, long N,
                                                        const bf16 *silu, const int q8, const int mr, const int nr) {
    const int format = q8 ? FORMAT_Q8 : FORMAT_Q4;
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    const long vectors = unpacked_vectors(format), slab_panel = blocks * vectors;
    __m512 total[SMALL_MR][SMALL_NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) total[i][j] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        __m512 blk[SMALL_MR][SMALL_NR];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) blk[i][j] = _mm512_setzero_ps();
        const bf16 *xb = x + b * QBLOCK;
        const __m512bh *wb = slab + b * vectors;
        for (long v = 0; v < vectors; v++) {
            __m512bh w[UNPACKED_NR];
            for (int j = 0; j < nr; j++) w[j] = wb[j * slab_panel + v];
            for (int i = 0; i < mr; i++) {
                const __m512bh a = broadcast_pair(xb + i * x_stride + 2 * v);
                for (int j = 0; j < nr; j++) blk[i][j] = _mm512_dpbf16_ps(blk[i][j], a, w[j]);
            }
        }
        fold_block(total, blk, panels, panel_bytes, b, bb, sums, blocks, !q8, mr, nr);
    }
    store_tile(&total[0][0], SMALL_NR, bias, out, out_stride, n0, N, silu, mr, nr);
}

#define UTILE(Q8, MRV, NRV)                                                                                 \
    utile(x + m * x_stride, x_stride, sums + m * blocks, panels, K, w, bias, out + m * out_stride, out_stride, n0, \
          N, silu, Q8, MRV, NRV)
#define UTILE_NR(Q8, MRV)                  \
    if (nr == 1)                           \
        UTILE(Q8, MRV, 1);                 \
    else                                   \
        UTILE(Q8, MRV, UNPACKED_NR);
#define UTILE_MR(Q8)                 \
    switch (mr) {                    \
    case 1: UTILE_NR(Q8, 1); break;  \
    case 2: UTILE_NR(Q8, 2); break;  \
    case 3: UTILE_NR(Q8, 3); break;  \
    case 4: UTILE_NR(Q8, 4); break;  \
    case 5: UTILE_NR(Q8, 5); break;  \
    default: UTILE_NR(Q8, 6); break; \
    }

/* panels [p_begin, p_end) for every row, with qtile's arithmetic: a slab of panels unpacked at a time, then
 * rows in chunks whose inputs stay in L2, 6 rows x UNPACKED_NR panels per tile (whole gate/up pairs) */
static void unpacked_columns(const bf16 *x, long M, long K, long x_stride, const float *sums, const uint8_t *packed,
                             int format, long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                             long p_begin, long p_end, long slab, __m512bh *buffer) {
    const long blocks = K / QBLOCK, panel_bytes = blocks * block_bytes(format);
    const long slab_panel = blocks * unpacked_vectors(format);
    long chunk = ROW_CHUNK_BYTES / (K * (long)sizeof(bf16)) / SMALL_MR * SMALL_MR;
    if (chunk < SMALL_MR) chunk = SMALL_MR;
    for (long s = p_begin; s < p_end; s += slab) {
        const long count = p_end - s < slab ? p_end - s : slab;
        for (long p = 0; p < count; p++) unpack_panel(packed + (s + p) * panel_bytes, K, format, buffer + p * slab_panel);
        for (long m0 = 0; m0 < M; m0 += chunk) {
            const long m_end = M - m0 < chunk ? M : m0 + chunk;
            for (long p = 0; p < count; p += UNPACKED_NR) {
                const int nr = count - p < UNPACKED_NR ? (int)(count - p) : UNPACKED_NR;
                const uint8_t *panels = packed + (s + p) * panel_bytes;
                const __m512bh *w = buffer + p * slab_panel;
                const long n0 = (s + p) * LANES;
                for (long m = m0; m < m_end; m += SMALL_MR) {
                    const int mr = m_end - m < SMALL_MR ? (int)(m_end - m) : SMALL_MR;
                    if (format == FORMAT_Q8) {
                        UTILE_MR(1)
                    } else {
                        UTILE_MR(0)
                    }
                }
            }
        }
    }
}
#undef UTILE_MR
#undef UTILE_NR
#undef UTILE

/* ---- large M: dequantized per slab into bf16 panels ----------------------------------------------- */

/* panel p of the packed weight -> dense_bf16_dot.c's bf16 panel [K/2][16][2] of bf16(d q + m) */
static void dequantize_panel(const uint8_t *panel, long K, int format, bf16 *dst) {
    const long blocks = K / QBLOCK, bb = block_bytes(format);
    const int header = format == FORMAT_Q4 ? 64 : 32;
    for (long b = 0; b < blocks; b++) {
        const uint8_t *head = panel + b * bb;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
        const __m512 m = format == FORMAT_Q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32)))
                                             : _mm512_setzero_ps();
        for (int pair = 0; pair < QBLOCK / 2; pair++) {
            __m512i words; /* 32 words: q of (column c, input 2 pair + p) at word 2c + p */
            if (format == FORMAT_Q4) {
                const __m512i z = _mm512_loadu_si512(head + header + (pair / 4) * 64);
                words = _mm512_and_si512(_mm512_srli_epi16(z, 4 * (pair % 4)), _mm512_set1_epi16(15));
            } else { /* u = q + 128 in the low or high byte: back to the signed q */
                const __m512i z = _mm512_loadu_si512(head + header + (pair / 2) * 64);
                const __m512i u = _mm512_and_si512(_mm512_srli_epi16(z, 8 * (pair % 2)), _mm512_set1_epi16(255));
                words = _mm512_sub_epi16(u, _mm512_set1_epi16(128));
            }
            /* even inputs in the low words, odd in the high: each to fp32, d q + m (one rounding), bf16 */
            const __m512 even = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(words, 16), 16));
            const __m512 odd = _mm512_cvtepi32_ps(_mm512_srai_epi32(words, 16));
            const __m512i lo = _mm512_cvtepu16_epi32(to_bf16(_mm512_fmadd_ps(d, even, m)));
            const __m512i hi = _mm512_cvtepu16_epi32(to_bf16(_mm512_fmadd_ps(d, odd, m)));
            _mm512_storeu_si512(dst + (b * QBLOCK / 2 + pair) * 2 * LANES, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* panels [p_begin, p_end) for every row, through bf16 slabs of `slab` panels multiplied by bf16_columns (dense_bf16_dot.c's
 * columns, or amx_panels.h's amx_columns); a gated weight's panel pairs (gate, up) are reordered into dense_bf16_dot.c's
 * gated groups (gate 32, up 32) */
typedef void (*PanelColumns)(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N,
                             const float *bias, bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end);
/* panel p of a weight kept in `format` -> its bf16 panel (N: the weight's columns) */
typedef void (*PanelSource)(const uint8_t *weights, int format, long p, long K, long N, bf16 *dst);

/* this file's packed panels as a PanelSource */
static void packed_panel(const uint8_t *packed, int format, long p, long K, long N, bf16 *dst) {
    (void)N;
    dequantize_panel(packed + p * (K / QBLOCK * block_bytes(format)), K, format, dst);
}

static void large_columns(const bf16 *x, long M, long K, long x_stride, const uint8_t *weights, int format,
                          PanelSource source, long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                          long p_begin, long p_end, long slab, bf16 *buffer, PanelColumns bf16_columns) {
    for (long s = p_begin; s < p_end; s += slab) {
        const long count = p_end - s < slab ? p_end - s : slab;
        for (long p = 0; p < count; p++) {
            /* gated: panels g0 u0 g1 u1 -> g0 g1 u0 u1 */
            const long at = silu ? (p / 4) * 4 + (p % 2) * 2 + (p % 4) / 2 : p;
            source(weights, format, s + p, K, N, buffer + at * K * LANES);
        }
        if (silu) {
            /* columns() takes gated groups of 32 gate + 32 up outputs: their bias follows the same order */
            bf16_columns(x, M, K, x_stride, buffer, count * LANES, bias ? bias + s * LANES : NULL,
                         out + s * LANES / 2, out_stride, silu, 0, count);
        } else {
            bf16_columns(x, M, K, x_stride, buffer, N - s * LANES, bias ? bias + s * LANES : NULL, out + s * LANES,
                         out_stride, NULL, 0, count);
        }
    }
}

/* ---- entry points ---------------------------------------------------------------------------------- */

/* this thread's scratch of at least `bytes` (64-byte aligned), kept for its next call: a fresh slab per call
 * was mapped and faulted in by the OS each time (the buffers pass malloc's mmap threshold), which cost a
 * one-row call more than its arithmetic. NULL when out of memory. */
static void *thread_scratch(long bytes) {
    static __thread void *scratch;
    static __thread long held;
    if (bytes > held) {
        free(scratch);
        scratch = aligned_alloc(64, (bytes + 63) / 64 * 64);
        held = scratch ? bytes : 0;
    }
    return scratch;
}

/* How a call's panels split among threads: in units of `unit` panels (a gated weight's groups of 4 stay together);
 * one thread for a call too small to share (QUANT_PARALLEL_MIN_WORK) */
typedef struct {
    long panels, unit, units;
    int threads;
} PanelSplit;

static PanelSplit panel_split(long M, long N, long K, int gated, int num_threads) {
    PanelSplit s = {(N + LANES - 1) / LANES, gated ? NR : 1, 0, 1};
    s.units = (s.panels + s.unit - 1) / s.unit;
    s.threads = num_threads < 2 || M * N * K < QUANT_PARALLEL_MIN_WORK || s.units < 2 ? 1 : num_threads;
    return s;
}

/* the calling thread's panels [*begin, *end) (in a parallel region of split->threads) */
static void thread_panels(const PanelSplit *split, long *begin, long *end) {
    extern int omp_get_thread_num(void), omp_get_num_threads(void);
    const long t = omp_get_thread_num(), n = omp_get_num_threads(), e = split->units * (t + 1) / n * split->unit;
    *begin = split->units * t / n * split->unit;
    *end = e < split->panels ? e : split->panels;
}

/* thread_scratch, or NULL with *failed set */
static void *scratch_or_fail(long bytes, int *failed) {
    void *scratch = thread_scratch(bytes);
    if (!scratch) {
#pragma omp atomic write
        *failed = 1;
    }
    return scratch;
}

/* every row through bf16 panels dequantized per slab (the dequantized model's weights), multiplied by
 * bf16_columns; each thread dequantizes its own columns */
static int dequantized_run(const bf16 *x, long M, long K, long x_stride, const uint8_t *weights, int format,
                           PanelSource source, long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                           PanelColumns bf16_columns, int num_threads) {
    const PanelSplit split = panel_split(M, N, K, silu != NULL, num_threads);
    long slab = SLAB_BYTES / (K * LANES * (long)sizeof(bf16)) / NR * NR;
    if (slab < NR) slab = NR;
    int failed = 0;
#pragma omp parallel num_threads(split.threads) if (split.threads > 1)
    {
        long begin, end;
        thread_panels(&split, &begin, &end);
        bf16 *buffer = scratch_or_fail(slab * K * LANES * sizeof(bf16), &failed);
        if (buffer)
            large_columns(x, M, K, x_stride, weights, format, source, N, bias, out, out_stride, silu, begin, end, slab,
                          buffer, bf16_columns);
    }
    return failed ? -1 : 0;
}

static int quant_run(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                     const float *bias, bf16 *out, long out_stride, const bf16 *silu, int every_row_alike,
                     int num_threads) {
    const int large = M >= QUANT_LARGE_M;
    if (large && !every_row_alike)
        return dequantized_run(x, M, K, x_stride, packed, format, packed_panel, N, bias, out, out_stride, silu, columns,
                               num_threads);
    const PanelSplit split = panel_split(M, N, K, silu != NULL, num_threads);
    float *sums = malloc(sizeof(float) * M * (K / QBLOCK));
    if (!sums) return -1;
    block_sums(x, M, K, x_stride, sums);
    /* unpacked words: as many bytes as bf16 panels; slabs of whole gate/up pairs */
    const long unpacked_panel_bytes = K / QBLOCK * unpacked_vectors(format) * 64;
    long unpacked_slab = SLAB_BYTES / unpacked_panel_bytes / NR * NR;
    if (unpacked_slab < NR) unpacked_slab = NR;
    int failed = 0;
#pragma omp parallel num_threads(split.threads) if (split.threads > 1)
    {
        long begin, end;
        thread_panels(&split, &begin, &end);
        if (!large) {
            small_columns(x, M, K, x_stride, sums, packed, format, N, bias, out, out_stride, silu, begin, end);
        } else {
            __m512bh *buffer = scratch_or_fail(unpacked_slab * unpacked_panel_bytes, &failed);
            if (buffer)
                unpacked_columns(x, M, K, x_stride, sums, packed, format, N, bias, out, out_stride, silu, begin, end,
                                 unpacked_slab, buffer);
        }
    }
    free(sums);
    return failed ? -1 : 0;
}

/* out [M, N] = x [M, K] @ W^T + bias (fp32 in column order, or NULL); format FORMAT_Q4 / FORMAT_Q8;
 * every_row_alike: 1 for the small-M arithmetic at every M (batch-invariant), 0 to dequantize from
 * QUANT_LARGE_M rows. Returns 0, or -1 when out of memory. */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    return quant_run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, every_row_alike, num_threads);
}

/* out [M, I] = silu(x @ gate^T + gate bias) * (x @ up^T + up bias), each rounded to bf16 first (as
 * dense_bf16_dot.c's linear_silu_mul_bf16). packed: quant_pack(gated = 1); bias in dense_bf16_dot.c's gated column
 * order (groups of 32 gate, 32 up) or NULL; silu: fused_ops.py's table. */
int quant_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format,
                               long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                               int every_row_alike, int num_threads) {
    return quant_run(x, M, K, x_stride, packed, format, 2 * I, bias, out, out_stride, silu, every_row_alike,
                     num_threads);
}

/* rows of a packed weight's columns, dequantized (an embedding lookup): out[r] = column ids[r] of W as
 * bf16(d q + m), K values each */
void quant_rows_bf16(const uint8_t *packed, int format, long K, const int64_t *ids, long count, bf16 *out) {
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    const int header = format == FORMAT_Q4 ? 64 : 32;
    for (long r = 0; r < count; r++) {
        const long c = ids[r] % LANES;
        const uint8_t *panel = packed + ids[r] / LANES * panel_bytes;
        for (long b = 0; b < blocks; b++) {
            const uint8_t *head = panel + b * bb;
            const float d = half_to_float(((const uint16_t *)head)[c]);
            const float m = format == FORMAT_Q4 ? half_to_float(((const uint16_t *)head)[LANES + c]) : 0.0f;
            const uint16_t *words = (const uint16_t *)(head + header);
            for (int k = 0; k < QBLOCK; k++) {
                const int pair = k / 2, p = k % 2;
                float q;
                if (format == FORMAT_Q4)
                    q = (float)((words[(pair / 4) * 32 + 2 * c + p] >> (4 * (pair % 4))) & 15);
                else
                    q = (float)((int)((words[(pair / 2) * 32 + 2 * c + p] >> (8 * (pair % 2))) & 255) - 128);
                out[r * K + b * QBLOCK + k] = float_to_bf16(__builtin_fmaf(d, q, m));
            }
        }
    }
}
