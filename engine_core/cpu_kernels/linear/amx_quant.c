/* Linear layers whose weights stay quantized in memory (cpu_quant.c's packed GGUF Q4_0, Q4_1, Q8_0 blocks and
 * per-channel int8), on AMX tiles (TDPBF16PS), for the amx tier.
 *
 * cpu_quant.c's arithmetic with its products on tiles: a block of 32 inputs is one tile step, so a tile B is one
 * block of one panel's weights as the bf16 words cpu_quant.c unpacks them (0x4300 | q, the number 128 + q, for Q4;
 * q itself for Q8: exact), and one TDPBF16PS gives 16 rows x 16 columns of the block's sums. Those leave the tile
 * every block, because each column's scale multiplies its own block's sum:
 *     total += d * block (+ (m - 128 d) * the sum of the block's inputs, for Q4),
 * in fp32, blocks in order. The weights are never rounded to bf16.
 *
 * Every M runs this same sequence (a one-row decode step has one-row tiles over the same words): a row's result
 * does not depend on M, the slab, the tile or the thread (batch invariant). Its bits are not cpu_quant.c's
 * (TDPBF16PS adds a step's 32 products in its own order). Where the OS refuses the tile state, cpu_quant.c's AVX512
 * kernels serve with their own arithmetic.
 *
 * Tiles: C 0-3 (row tiles 0, 1 x panels 0, 1), A 4-5, B 6-7: 32 rows x 2 panels per pass, one block at a time.
 */
#include "amx_tiles.h"

#define quant_linear_bf16 vector_quant_linear_bf16
#define quant_linear_silu_mul_bf16 vector_quant_linear_silu_mul_bf16
#include "cpu_quant.c"
#undef quant_linear_bf16
#undef quant_linear_silu_mul_bf16

#define TILE_ROWS 16
#define PASS_ROWS 32

/* 1 where the tiles may be used here: the loader asks once, and logs a refusal */
int amx_ready(void) { return amx_permitted(); }

/* a tile's block sums (rows x 16) folded into its totals: total = d * block + total, then for Q4
 * + offset * (the row's sum of the block's inputs), as cpu_quant.c's fold_block */
static inline void fold_tile(float *total, const float *block, int rows, __m512 d, __m512 offset,
                             const float *input_sums, long blocks, int q4) {
    for (int i = 0; i < rows; i++) {
        __m512 t = _mm512_fmadd_ps(d, _mm512_load_ps(block + i * LANES), _mm512_load_ps(total + i * LANES));
        if (q4) t = _mm512_fmadd_ps(offset, _mm512_set1_ps(input_sums[i * blocks]), t);
        _mm512_store_ps(total + i * LANES, t);
    }
}

/* rows [0, r0 + r1) x panels w0 (and w1 where not NULL) over every block, into totals [2 row tiles][2 panels][16
 * x 16]; w: a panel's unpacked words (16 vectors per block), head: its packed blocks (their d, m) */
static void block_pass(const bf16 *x, long x_stride, int r0, int r1, const __m512bh *w0, const __m512bh *w1,
                       const uint8_t *head0, const uint8_t *head1, long blocks, long bb, const float *sums, int q4,
                       float totals[2][2][TILE_ROWS * LANES]) {
    float block[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));
    const long stride = x_stride * (long)sizeof(bf16);
    const bf16 *x1 = x + TILE_ROWS * x_stride;
    const uint8_t *heads[2] = {head0, head1};
    memset(totals, 0, sizeof(float) * 2 * 2 * TILE_ROWS * LANES);
    for (long b = 0; b < blocks; b++) {
        _tile_zero(0);
        _tile_loadd(4, x + b * QBLOCK, stride);
        _tile_loadd(6, w0 + b * (QBLOCK / 2), 64);
        _tile_dpbf16ps(0, 4, 6);
        if (w1) {
            _tile_zero(1);
            _tile_loadd(7, w1 + b * (QBLOCK / 2), 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (r1) {
            _tile_zero(2);
            _tile_loadd(5, x1 + b * QBLOCK, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (w1) {
                _tile_zero(3);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, block[0][0], 64);
        if (w1) _tile_stored(1, block[0][1], 64);
        if (r1) {
            _tile_stored(2, block[1][0], 64);
            if (w1) _tile_stored(3, block[1][1], 64);
        }
        for (int j = 0; j < (w1 ? 2 : 1); j++) {
            const uint8_t *head = heads[j] + b * bb;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
            const __m512 offset = q4 ? _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), d,
                                                        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32))))
                                     : _mm512_setzero_ps();
            fold_tile(totals[0][j], block[0][j], r0, d, offset, sums + b, blocks, q4);
            if (r1) fold_tile(totals[1][j], block[1][j], r1, d, offset, sums + TILE_ROWS * blocks + b, blocks, q4);
        }
    }
}

/* cpu_quant.c's unpacked_columns on tiles: panels [p_begin, p_end) for every row, a slab of panels unpacked at a
 * time, rows in chunks whose inputs stay in L2, 32 rows x a pair of panels (gated: a gate and its up panel) per
 * pass */
static void tile_columns(const bf16 *x, long M, long K, long x_stride, const float *sums, const uint8_t *packed,
                         int format, long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                         long p_begin, long p_end, long slab, __m512bh *buffer) {
    float totals[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));
    const long blocks = K / QBLOCK, bb = block_bytes(format), panel_bytes = blocks * bb;
    const long slab_panel = blocks * unpacked_vectors(format);
    long chunk = ROW_CHUNK_BYTES / (K * (long)sizeof(bf16)) / PASS_ROWS * PASS_ROWS;
    if (chunk < PASS_ROWS) chunk = PASS_ROWS;
    int configured = -1;
    for (long s = p_begin; s < p_end; s += slab) {
        const long count = p_end - s < slab ? p_end - s : slab;
        for (long p = 0; p < count; p++) unpack_panel(packed + (s + p) * panel_bytes, K, format, buffer + p * slab_panel);
        for (long m0 = 0; m0 < M; m0 += chunk) {
            const long m_end = M - m0 < chunk ? M : m0 + chunk;
            for (long p = 0; p < count; p += 2) {
                const int pair = count - p >= 2;
                const uint8_t *head = packed + (s + p) * panel_bytes;
                const long n0 = (s + p) * LANES;
                for (long m = m0; m < m_end; m += PASS_ROWS) {
                    const int rows = m_end - m < PASS_ROWS ? (int)(m_end - m) : PASS_ROWS;
                    const int r0 = rows < TILE_ROWS ? rows : TILE_ROWS, r1 = rows - r0;
                    if (r0 * 32 + r1 != configured) amx_configure_pass(r0, r1), configured = r0 * 32 + r1;
                    block_pass(x + m * x_stride, x_stride, r0, r1, buffer + p * slab_panel,
                               pair ? buffer + (p + 1) * slab_panel : NULL, head, pair ? head + panel_bytes : NULL,
                               blocks, bb, sums + m * blocks, format == FORMAT_Q4, totals);
                    for (int i = 0; i < rows; i++) {
                        const float *t0 = totals[i / TILE_ROWS][0] + i % TILE_ROWS * LANES;
                        const float *t1 = totals[i / TILE_ROWS][1] + i % TILE_ROWS * LANES;
                        bf16 *o = out + (m + i) * out_stride;
                        if (silu) {
                            store_gated(_mm512_load_ps(t0), _mm512_load_ps(t1), bias, n0 / 2, o, silu);
                        } else {
                            store_columns(_mm512_load_ps(t0), bias, o, n0, N);
                            if (pair) store_columns(_mm512_load_ps(t1), bias, o, n0 + LANES, N);
                        }
                    }
                }
            }
        }
    }
    if (configured >= 0) _tile_release();
}

/* cpu_quant.c's quant_linear_bf16, on tiles */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    return quant_run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, every_row_alike, num_threads,
                     amx_permitted() ? tile_columns : NULL);
}

/* cpu_quant.c's quant_linear_silu_mul_bf16, on tiles */
int quant_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format,
                               long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                               int every_row_alike, int num_threads) {
    return quant_run(x, M, K, x_stride, packed, format, 2 * I, bias, out, out_stride, silu, every_row_alike,
                     num_threads, amx_permitted() ? tile_columns : NULL);
}
