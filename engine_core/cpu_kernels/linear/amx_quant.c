/* Linear layers whose weights stay quantized (GGUF Q4_0, Q4_1, Q8_0; per-channel int8) on AMX tiles, for the amx
 * tier: cpu_quant.c's packed panels, dequantized a panel pair at a time into cpu_gemm.c's bf16 panels
 * (dequantize_panel: bf16(d q + m), the dequantized model's weights bit for bit), which amx_gemm.c's tile pass
 * multiplies.
 *
 * The bits: a row's result is amx_gemm.c's on the dequantized weights, the same fixed order per row at every
 * row count (1 to 16 rows a tile, two tiles a pass) and on every thread, so batch invariant; and the same as
 * the dense bf16 model's on this tier. A pair's bf16 panels (2 x K x 32 bytes) stay in L2 while every chunk of
 * rows passes over them, so a prefill dequantizes each weight once per chunk of rows; a decode step reads
 * 5 (Q4) or 8.5 (Q8) bits per weight from memory.
 *
 * A process the OS refuses the tile state runs cpu_quant.c's kernels (amx_tiles.h).
 */
#define quant_linear_bf16 panel_quant_linear_bf16
#define quant_linear_silu_mul_bf16 panel_quant_linear_silu_mul_bf16
#include "cpu_quant.c"
#undef quant_linear_bf16
#undef quant_linear_silu_mul_bf16

#include "amx_panels.h"

#define AMX_ROW_CHUNK_BYTES (1L << 20) /* inputs of the rows one dequantized panel pair serves before the next */

/* panels [p_begin, p_end) in pairs (gated: gate and up panels alternate) for every row */
static void amx_quant_columns(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                              const float *bias, bf16 *out, long out_stride, const bf16 *silu, long p_begin,
                              long p_end, bf16 *w) {
    float sums[2][2][TILE_ROWS * LANES] __attribute__((aligned(64)));
    const long panel_bytes = K / QBLOCK * block_bytes(format);
    long chunk = AMX_ROW_CHUNK_BYTES / (K * (long)sizeof(bf16)) / PASS_ROWS * PASS_ROWS;
    if (chunk < PASS_ROWS) chunk = PASS_ROWS;
    int configured = -1;
    for (long m0 = 0; m0 < M; m0 += chunk) {
        const long m_end = M - m0 < chunk ? M : m0 + chunk;
        for (long p = p_begin; p < p_end; p += 2) {
            const int two = p + 1 < p_end;
            dequantize_panel(packed + p * panel_bytes, K, format, w);
            if (two) dequantize_panel(packed + (p + 1) * panel_bytes, K, format, w + K * LANES);
            for (long m = m0; m < m_end; m += PASS_ROWS) {
                const int rows = m_end - m < PASS_ROWS ? (int)(m_end - m) : PASS_ROWS;
                const int r0 = rows < TILE_ROWS ? rows : TILE_ROWS, r1 = rows - r0;
                if (r0 * 32 + r1 != configured) amx_configure_pass(r0, r1), configured = r0 * 32 + r1;
                pass(x + m * x_stride, x_stride, r1, w, two ? w + K * LANES : NULL, K, sums);
                for (int h = 0; h < 2; h++) {
                    const int hr = h ? r1 : r0;
                    bf16 *o = out + (m + h * TILE_ROWS) * out_stride;
                    if (!hr) continue;
                    if (silu) { /* the bias in cpu_gemm.c's gated order: groups of 32 gate, then 32 up */
                        const long at = p / 2 * LANES, gate_at = at / 32 * 64 + at % 32;
                        store_gated_tile(sums[h][0], sums[h][1], hr, bias, gate_at, gate_at + 32, o, out_stride, at,
                                         silu);
                    } else {
                        store_plain(sums[h][0], hr, bias, o, out_stride, p * LANES, N);
                        if (two) store_plain(sums[h][1], hr, bias, o, out_stride, (p + 1) * LANES, N);
                    }
                }
            }
        }
    }
    if (configured >= 0) _tile_release();
}

static int amx_quant_run(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                         const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    const long panels = (N + LANES - 1) / LANES, units = (panels + 1) / 2; /* pairs of panels */
    const int threads = num_threads < 2 || M * N * K < QUANT_PARALLEL_MIN_WORK || units < 2 ? 1 : num_threads;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        const long t = omp_get_thread_num(), n = omp_get_num_threads();
        const long begin = units * t / n * 2, end = units * (t + 1) / n * 2;
        bf16 *w = aligned_alloc(64, 2 * K * LANES * sizeof(bf16));
        if (!w) {
#pragma omp atomic write
            failed = 1;
        } else {
            amx_quant_columns(x, M, K, x_stride, packed, format, N, bias, out, out_stride, silu, begin,
                              end < panels ? end : panels, w);
        }
        free(w);
    }
    return failed ? -1 : 0;
}

/* cpu_quant.c's quant_linear_bf16 on tiles (one arithmetic at every M: every_row_alike changes nothing) */
int quant_linear_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format, long N,
                      const float *bias, bf16 *out, long out_stride, int every_row_alike, int num_threads) {
    if (!amx_permitted())
        return panel_quant_linear_bf16(x, M, K, x_stride, packed, format, N, bias, out, out_stride, every_row_alike,
                                       num_threads);
    return amx_quant_run(x, M, K, x_stride, packed, format, N, bias, out, out_stride, NULL, num_threads);
}

/* cpu_quant.c's quant_linear_silu_mul_bf16 on tiles */
int quant_linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const uint8_t *packed, int format,
                               long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                               int every_row_alike, int num_threads) {
    if (!amx_permitted())
        return panel_quant_linear_silu_mul_bf16(x, M, K, x_stride, packed, format, I, bias, out, out_stride, silu,
                                                every_row_alike, num_threads);
    return amx_quant_run(x, M, K, x_stride, packed, format, 2 * I, bias, out, out_stride, silu, num_threads);
}
