/* bfloat16 linear layers for AVX512-BF16 CPUs: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), fp32 sums.
 *
 * The weight is packed once (pack_weight_bf16) into panels of 16 output columns: for each pair of
 * input features k, k+1, the panel holds 16 columns x 2 values = 64 bytes, one AVX512 vector. One
 * vdpbf16ps then adds x[m][k] * W[n][k] + x[m][k+1] * W[n][k+1] into the fp32 sums of 16 columns
 * at once, with x's pair broadcast: no horizontal sums, and each weight byte is read once per tile
 * of up to MR rows.
 *
 * Fixed reduction order per row: every output is one fp32 sum that walks k = 0, 2, 4, ... in order,
 * whatever M, the tile a row falls in, or the thread that computes it. A row's result depends on
 * that row alone (batch invariant), and equals what the same row gives in a batch of one.
 *
 * Threads split the panels (output columns) evenly; each walks its columns in tiles of NR panels,
 * and within a tile the rows MR at a time, so a tile's weights (NR * 16 * K * 2 bytes, <= 200 KB for
 * K <= 1600) stay in L2 while every row passes over them. Small weights (decode of one token on few
 * columns) run on one thread: starting a parallel region costs more than the work.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

#define LANES 16 /* output columns per panel */
#define MR 6     /* rows per register tile: MR * NR accumulators + NR weight vectors <= 32 registers */
#define NR 4     /* panels per register tile */
#ifndef ROW_CHUNK_BYTES
#define ROW_CHUNK_BYTES (256 * 1024) /* inputs of the rows taken together (L2 is 1-2 MB) */
#endif
#define PARALLEL_MIN_WORK (1L << 20) /* M * N * K below this: one thread */

/* one panel: columns [n0, n0 + 16) of W (those at or past n_end are zeros) -> [K/2][16][2] */
static void pack_panel(const bf16 *w, long n0, long n_end, long K, long w_stride, bf16 *dst) {
    for (long c = 0; c < LANES; c++) {
        long n = n0 + c;
        for (long k = 0; k < K; k += 2) {
            bf16 *d = dst + (k / 2) * 2 * LANES + 2 * c;
            d[0] = n < n_end ? w[n * w_stride + k] : 0;
            d[1] = n < n_end ? w[n * w_stride + k + 1] : 0;
        }
    }
}

/* W [N, K] (row stride w_stride) -> panels [ceil(N/16)][K/2][16][2]; columns past N are zeros.
 * K must be even. */
void pack_weight_bf16(const bf16 *w, long N, long K, long w_stride, bf16 *packed) {
    long panels = (N + LANES - 1) / LANES;
    for (long p = 0; p < panels; p++) pack_panel(w, p * LANES, N, K, w_stride, packed + p * K * LANES);
}

/* A gate/up weight W [2I, K] (gate rows, then up rows; I a multiple of 32) -> panels in groups of
 * four: gate columns [32q, 32q + 32), then up columns [32q, 32q + 32). One register tile (NR = 4)
 * then holds a gate value and its up value side by side, and linear_silu_mul_bf16 stores
 * silu(gate) * up straight from the accumulators. */
void pack_gated_weight_bf16(const bf16 *w, long I, long K, long w_stride, bf16 *packed) {
    for (long p = 0; p < 2 * I / LANES; p++) {
        long q = p / NR, j = p % NR;
        long n0 = (j < 2 ? 0 : I) + q * 2 * LANES + (j % 2) * LANES;
        pack_panel(w, n0, 2 * I, K, w_stride, packed + p * K * LANES);
    }
}

static inline __m512bh broadcast_pair(const bf16 *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

/* fp32 -> bf16, nearest even (NaN stays NaN) */
static inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* 16 bf16 -> fp32 (exact) */
static inline __m512 widen(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

/* rows [m, m + mr) x panels [p, p + nr) over all of K; mr <= MR, nr <= NR are compile-time constants
 * where it is inlined, so the accumulators live in registers. With a silu table, a gated tile
 * (pack_gated_weight_bf16, nr == 4) whose 32 outputs are silu(gate) * up, from column n0 / 2. */
static inline __attribute__((always_inline)) void tile(const bf16 *x, long x_stride, const bf16 *panels, long K,
                                                       const float *bias, bf16 *out, long out_stride, long n0,
                                                       long N, const bf16 *silu, const int mr, const int nr) {
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    const long panel_size = K * LANES;
    for (long k = 0; k < K; k += 2) {
        __m512bh w[NR];
        for (int j = 0; j < nr; j++) w[j] = (__m512bh)_mm512_loadu_si512(panels + j * panel_size + k * LANES);
        for (int i = 0; i < mr; i++) {
            __m512bh a = broadcast_pair(x + i * x_stride + k);
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, w[j]);
        }
    }
    if (nr == NR && silu) { /* gated: panels 0, 1 are gate columns, 2, 3 the up columns of the same outputs */
        for (int j = 0; j < 2; j++) {
            const long n = n0 + j * LANES;
            const __m512 bg = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
            const __m512 bu = bias ? _mm512_loadu_ps(bias + n + 2 * LANES) : _mm512_setzero_ps();
            for (int i = 0; i < mr; i++) {
                const __m256i gate = to_bf16(_mm512_add_ps(acc[i][j], bg));
                const __m256i up = to_bf16(_mm512_add_ps(acc[i][j + 2], bu));
                /* silu of the bf16 gate from the table of torch's results (4-byte gathers at 2-byte
                 * steps: the low half is the entry; the table has one padding entry), times up,
                 * rounded once: what silu_and_mul (fused_torch_rounding.c) computes from the stored gate and up */
                const __m512i s = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(gate), (const void *)silu, 2);
                const __m512 product = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(s, 16)), widen(up));
                _mm256_storeu_si256((__m256i *)(out + i * out_stride + n0 / 2 + j * LANES), to_bf16(product));
            }
        }
        return;
    }
    for (int j = 0; j < nr; j++) {
        long n = n0 + j * LANES;
        __mmask16 mask = N - n >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (N - n)) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
        for (int i = 0; i < mr; i++)
            _mm256_mask_storeu_epi16(out + i * out_stride + n, mask, to_bf16(_mm512_add_ps(acc[i][j], b)));
    }
}

#define TILE(MRV, NRV) tile(x, x_stride, panels, K, bias, out, out_stride, n0, N, silu, MRV, NRV)
#define TILE_NR(MRV)          \
    switch (nr) {             \
    case 1: TILE(MRV, 1); break; \
    case 2: TILE(MRV, 2); break; \
    case 3: TILE(MRV, 3); break; \
    default: TILE(MRV, 4); break; \
    }

static void tile_any(const bf16 *x, long x_stride, const bf16 *panels, long K, const float *bias, bf16 *out,
                     long out_stride, long n0, long N, const bf16 *silu, int mr, int nr) {
    switch (mr) {
    case 1: TILE_NR(1); break;
    case 2: TILE_NR(2); break;
    case 3: TILE_NR(3); break;
    case 4: TILE_NR(4); break;
    case 5: TILE_NR(5); break;
    default: TILE_NR(6); break;
    }
}

/* the panels [p_begin, p_end) for every row: rows in chunks whose inputs stay in L2 while every tile of
 * panels passes over them (else a long prefill reads its inputs from L3 once per tile) */
static void columns(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                    bf16 *out, long out_stride, const bf16 *silu, long p_begin, long p_end) {
    long chunk = ROW_CHUNK_BYTES / (K * (long)sizeof(bf16)) / MR * MR;
    if (chunk < MR) chunk = MR;
    for (long m0 = 0; m0 < M; m0 += chunk) {
        const long m_end = M - m0 < chunk ? M : m0 + chunk;
        for (long p = p_begin; p < p_end; p += NR) {
            int nr = p_end - p < NR ? (int)(p_end - p) : NR;
            const bf16 *panels = packed + p * K * LANES;
            for (long m = m0; m < m_end; m += MR) {
                int mr = m_end - m < MR ? (int)(m_end - m) : MR;
                tile_any(x + m * x_stride, x_stride, panels, K, bias, out + m * out_stride, out_stride, p * LANES, N,
                         silu, mr, nr);
            }
        }
    }
}

/* the panels split among threads in units of `unit` panels (a gated tile's four stay together) */
static void run(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                bf16 *out, long out_stride, const bf16 *silu, long unit, int num_threads) {
    long units = (N + LANES * unit - 1) / (LANES * unit);
    if (num_threads < 2 || M * N * K < PARALLEL_MIN_WORK || units < 2) {
        columns(x, M, K, x_stride, packed, N, bias, out, out_stride, silu, 0, units * unit);
        return;
    }
    /* libgomp.so.1 is torch's, already loaded: these threads are torch's pool, not extra ones */
#pragma omp parallel num_threads(num_threads)
    {
        extern int omp_get_thread_num(void), omp_get_num_threads(void);
        long t = omp_get_thread_num(), n = omp_get_num_threads();
        columns(x, M, K, x_stride, packed, N, bias, out, out_stride, silu, units * t / n * unit,
                units * (t + 1) / n * unit);
    }
}

/* out [M, N] (row stride out_stride) = x [M, K] (row stride x_stride) @ W^T + bias (fp32, or NULL).
 * K even; x's and out's rows contiguous. */
void linear_bf16(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N, const float *bias,
                 bf16 *out, long out_stride, int num_threads) {
    run(x, M, K, x_stride, packed, N, bias, out, out_stride, NULL, 1, num_threads);
}

/* out [M, I] = silu(x @ gate^T + gate bias) * (x @ up^T + up bias), each matmul output rounded to
 * bf16 first, as the unfused linear and silu_and_mul do. packed: pack_gated_weight_bf16's panels;
 * bias (fp32, or NULL) in the packed column order; silu: 65536 (+1 padding) bf16 results of silu by
 * input bits. */
void linear_silu_mul_bf16(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long I,
                          const float *bias, bf16 *out, long out_stride, const bf16 *silu, int num_threads) {
    run(x, M, K, x_stride, packed, 2 * I, bias, out, out_stride, silu, NR, num_threads);
}
