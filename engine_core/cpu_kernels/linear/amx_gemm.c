/* bfloat16 linear layers on AMX tiles (TDPBF16PS), for the amx tier: out[M, N] = x[M, K] @ W[N, K]^T (+ bias).
 *
 * The weight is dense_bf16_dot.c's panels, packed by its functions at load: 32 inputs of a panel's 16 columns
 * ([16 input pairs][16 columns][2]) are one tile B of 1 KB, contiguous. Tile A is 16 rows of x by 32 inputs,
 * read where x lies (its row stride). One TDPBF16PS adds a 32-input step's products to 16 x 16 fp32 sums held
 * in tile C; the K loop walks the steps in order and the sums stay in the tile until the end.
 *
 * Fixed reduction order per row: a tile computes each row of C from that row of A alone, so a row's sums are
 * the same instruction sequence (the same steps, in the same order) whether its tile holds 1 row or 16, and
 * whichever thread runs it: a row's result does not depend on M (batch invariant). A one-row decode step runs
 * one-row tiles over the same weight tiles; it is bound by reading the weights, as the AVX512 panels are.
 * Threads split the columns, never K.
 *
 * Tiles: C 0-3 (row tiles 0, 1 x column tiles 0, 1), A 4-5, B 6-7: 32 rows x 32 columns per pass. A K that is
 * not a multiple of 32, and a process the OS refuses the tile state (amx_tiles.h), run dense_bf16_dot.c's kernel
 * instead: a choice by the layer's shape and the machine, never by the row count.
 */
#define linear_bf16 panel_linear_bf16
#define linear_silu_mul_bf16 panel_linear_silu_mul_bf16
#include "dense_bf16_dot.c"
#undef linear_bf16
#undef linear_silu_mul_bf16

#include "amx_panels.h"

/* the panels split among threads in units of `unit` panels (a gated group's four stay together) */
static void amx_run(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                    bf16 *out, long out_stride, const bf16 *silu, long unit, int num_threads) {
    const long units = (N + LANES * unit - 1) / (LANES * unit), panels = (N + LANES - 1) / LANES;
    if (num_threads < 2 || M * N * K < PARALLEL_MIN_WORK || units < 2) {
        amx_columns(x, M, K, x_stride, packed, N, bias, out, out_stride, silu, 0, panels);
        return;
    }
#pragma omp parallel num_threads(num_threads)
    {
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        const long t = omp_get_thread_num(), n = omp_get_num_threads();
        const long end = units * (t + 1) / n * unit;
        amx_columns(x, M, K, x_stride, packed, N, bias, out, out_stride, silu, units * t / n * unit,
                    end < panels ? end : panels);
    }
}

/* dense_bf16_dot.c's linear_bf16, on tiles */
void linear_bf16(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                 bf16 *out, long out_stride, int num_threads) {
    if (K % AMX_K || !amx_permitted()) {
        panel_linear_bf16(x, M, K, x_stride, packed, N, bias, out, out_stride, num_threads);
        return;
    }
    amx_run(x, M, K, x_stride, packed, N, bias, out, out_stride, NULL, 2, num_threads);
}

/* dense_bf16_dot.c's linear_silu_mul_bf16, on tiles: silu(gate) * up from pack_gated_weight_bf16's panels */
void linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long I,
                          const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    if (K % AMX_K || !amx_permitted()) {
        panel_linear_silu_mul_bf16(x, M, K, x_stride, packed, I, bias, out, out_stride, silu, num_threads);
        return;
    }
    amx_run(x, M, K, x_stride, packed, 2 * I, bias, out, out_stride, silu, NR, num_threads);
}
