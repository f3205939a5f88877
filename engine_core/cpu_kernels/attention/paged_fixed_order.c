/* Batch-invariant paged attention for any x86-64 CPU, float32 or bfloat16 caches, any head dim.
 *
 * What paged_avx512_bf16.c does not take (float32; bf16 head dims that are not a multiple of 32, more than 8
 * query heads per KV head; CPUs without AVX512-BF16) comes here when batch invariance is on.
 *
 * Layouts: q [T, H, D] (row stride q_row elements, heads contiguous), caches [blocks, block_size, Hkv,
 * D] contiguous, block_tables [num_seqs, table_row] int32, seq_lens [num_seqs] int32 (cached tokens
 * after this step, the new ones already written), query_start_loc [num_seqs + 1] int32: sequence s
 * owns rows query_start_loc[s] .. query_start_loc[s + 1] - 1, its last q_len tokens; the row at
 * position p sees keys 0..p, or with a sliding window w > 0 keys p - w + 1 .. p (keys before the window
 * are never read: their blocks may belong to another request by now). out like q (row stride out_row).
 *
 * Invariant: a row's result depends only on its query, its position p and the keys/values it sees. Each
 * (row, query head) walks the keys in tiles of TILE aligned to absolute key positions (tile t holds
 * keys [t * TILE, t * TILE + TILE), the last one cut at p, the first at the window's start), in order, with an
 * online softmax in fp32:
 * per tile the scores (one fixed-order dot product each; soft-capped, where the layer caps, by softcap_f32.h's
 * lane-independent tanh), the tile's max, the rescale of the running
 * sum and output, then the values added key by key. Decodes, prefill chunks and chunks after cached
 * blocks run this same code; how rows are grouped into work items, which thread runs an item, and
 * which other rows share a tile change nothing in any row's arithmetic.
 *
 * Plain C: fmaf and ordinary adds round the same whether gcc vectorizes a loop or not; built with
 * -ffp-contract=off so no a * b + c is fused in one inlined copy and not in another. The softmax's
 * exponentials are the project's own (exp_f32.h): eight at a time where AVX2 runs, one at a time in the
 * same operations elsewhere, so a score's probability does not depend on the lane it fell in.
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "../bf16_scalar.h"
#include "../exp_f32.h"
#include "../softcap_f32.h"
#include "paged_work_items.h"

#define TILE 32  /* keys per tile, aligned to absolute positions */
#define ROWS 16  /* query rows per work item */
#define PART 16  /* partial sums of a dot product */



typedef struct {
    const void *q, *k_cache, *v_cache;
    void *out;
    const int32_t *block_tables, *seq_lens, *query_start_loc;
    long q_row, out_row, table_row;
    int num_heads, num_kv_heads, head_dim, block_size, is_bf16;
    int window; /* keys a row sees back from its own position, itself included; 0: all */
    float scale;
    float softcap; /* scores s become softcap * tanh(s / softcap) before the softmax; 0: no cap */
} Job;

/* n values of a row of q or a cache (fp32 or bf16, element offset `at`) into dst as fp32 */
static inline void load_row(const void *src, long at, int is_bf16, int n, float *dst) {
    if (is_bf16) {
        const bf16 *s = (const bf16 *)src + at;
        for (int d = 0; d < n; d++) dst[d] = bf16_to_float(s[d]);
    } else {
        memcpy(dst, (const float *)src + at, sizeof(float) * n);
    }
}

/* the largest of scores[0..m): max is exact, so the order the lanes meet in changes nothing (a -0 against a
 * +0 may come out with either sign, and e^(s - max) and e^(run_max - max) are the same for both); NaNs
 * are passed over as the scalar comparison passes over them */
static inline float max_of(const float *scores, int m) {
    float max = -INFINITY;
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (m >= 8) {
        __m256 lanes = _mm256_set1_ps(-INFINITY);
        for (; j + 8 <= m; j += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(scores + j), lanes);
        float each[8];
        _mm256_storeu_ps(each, lanes);
        for (int l = 0; l < 8; l++) max = each[l] > max ? each[l] : max;
    }
#endif
    for (; j < m; j++) max = scores[j] > max ? scores[j] : max;
    return max;
}

/* probs[j] = e^(scores[j] - max) for j < m */
static inline void exp_shifted(const float *scores, int m, float max, float *probs) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; j + 8 <= m; j += 8)
        _mm256_storeu_ps(probs + j, exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(max))));
#endif
    for (; j < m; j++) probs[j] = exp_nonpositive(scores[j] - max);
}

/* sums[g] += probs[g][j] for j = 0, 1, ... m - 1 in order, for each of the group's heads: each head's sum
 * is one chain of adds; the heads' chains are interleaved so that their latencies overlap */
static inline void add_probs(float *sums, const float *probs, int group, int m) {
    int g = 0;
    for (; g + 4 <= group; g += 4) {
        float s0 = sums[g], s1 = sums[g + 1], s2 = sums[g + 2], s3 = sums[g + 3];
        for (int j = 0; j < m; j++)
            s0 += probs[g * TILE + j], s1 += probs[(g + 1) * TILE + j], s2 += probs[(g + 2) * TILE + j],
            s3 += probs[(g + 3) * TILE + j];
        sums[g] = s0, sums[g + 1] = s1, sums[g + 2] = s2, sums[g + 3] = s3;
    }
    for (; g + 2 <= group; g += 2) {
        float s0 = sums[g], s1 = sums[g + 1];
        for (int j = 0; j < m; j++) s0 += probs[g * TILE + j], s1 += probs[(g + 1) * TILE + j];
        sums[g] = s0, sums[g + 1] = s1;
    }
    for (; g < group; g++)
        for (int j = 0; j < m; j++) sums[g] += probs[g * TILE + j];
}

/* sum of a[d] * b[d]: PART running sums (lane d % PART), then a fixed pairwise tree */
static inline float dot(const float *a, const float *b, int n) {
#if defined(__AVX2__) && defined(__FMA__)
    if (n % PART == 0) { /* the same sums and the same tree in registers (a stack array stalls on store forwarding) */
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(); /* lanes 0-7, 8-15 */
        for (int d = 0; d < n; d += PART) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), hi);
        }
        const __m256 eight = _mm256_add_ps(lo, hi);                                            /* l + (l + 8) */
        const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1)); /* + 4 */
        const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));                       /* l + (l + 2) */
        return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));                   /* 0 + 1 */
    }
#endif
    float part[PART] = {0};
    int d = 0;
    for (; d + PART <= n; d += PART)
        for (int l = 0; l < PART; l++) part[l] = fmaf(a[d + l], b[d + l], part[l]);
    for (int l = 0; d + l < n; l++) part[l] = fmaf(a[d + l], b[d + l], part[l]);
    for (int width = PART / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) part[l] += part[l + width];
    return part[0];
}

/* scores[j] = dot(a, rows[j], n) * scale for j < m: where dot() vectorizes, four keys at a time, each with
 * dot()'s own sums and tree (the four trees' adds done side by side in shuffled lanes: the same pairs) */
static inline void scaled_dots(const float *a, const float *const *rows, int m, int n, float scale, float *scores) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (n % PART == 0)
        for (; j + 4 <= m; j += 4) {
            __m256 lo[4], hi[4];
            for (int k = 0; k < 4; k++) lo[k] = hi[k] = _mm256_setzero_ps();
            for (int d = 0; d < n; d += PART) {
                const __m256 a_lo = _mm256_loadu_ps(a + d), a_hi = _mm256_loadu_ps(a + d + 8);
                for (int k = 0; k < 4; k++) {
                    lo[k] = _mm256_fmadd_ps(a_lo, _mm256_loadu_ps(rows[j + k] + d), lo[k]);
                    hi[k] = _mm256_fmadd_ps(a_hi, _mm256_loadu_ps(rows[j + k] + d + 8), hi[k]);
                }
            }
            __m256 e[4];
            for (int k = 0; k < 4; k++) e[k] = _mm256_add_ps(lo[k], hi[k]); /* l + (l + 8) */
            /* [f0 | f1], [f2 | f3]: f[l] = e[l] + e[l + 4] */
            const __m256 f01 = _mm256_add_ps(_mm256_permute2f128_ps(e[0], e[1], 0x20), _mm256_permute2f128_ps(e[0], e[1], 0x31));
            const __m256 f23 = _mm256_add_ps(_mm256_permute2f128_ps(e[2], e[3], 0x20), _mm256_permute2f128_ps(e[2], e[3], 0x31));
            /* [t0[0], t0[1], t2[0], t2[1] | t1[0], t1[1], t3[0], t3[1]]: t[l] = f[l] + f[l + 2] */
            const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(f01, f23, _MM_SHUFFLE(1, 0, 1, 0)),
                                           _mm256_shuffle_ps(f01, f23, _MM_SHUFFLE(3, 2, 3, 2)));
            /* [r0, r2, r0, r2 | r1, r3, r1, r3]: r = t[0] + t[1] */
            const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(t, t, _MM_SHUFFLE(2, 0, 2, 0)),
                                           _mm256_shuffle_ps(t, t, _MM_SHUFFLE(3, 1, 3, 1)));
            float lanes[8];
            _mm256_storeu_ps(lanes, r);
            scores[j] = lanes[0] * scale, scores[j + 1] = lanes[4] * scale;
            scores[j + 2] = lanes[1] * scale, scores[j + 3] = lanes[5] * scale;
        }
#endif
    for (; j < m; j++) scores[j] = dot(a, rows[j], n) * scale;
}

/* o[d] = fmaf(probs[j], v_j[d], o[d]) for keys j in order: each output element's chain of fused multiply-adds */
static inline void add_values(float *o, const float *probs, const float *const *value_rows, int m, int D) {
    int d0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; d0 + 64 <= D; d0 += 64) { /* 64 outputs held in registers across the keys, the same fused adds */
        __m256 out[8];
        for (int k = 0; k < 8; k++) out[k] = _mm256_loadu_ps(o + d0 + 8 * k);
        for (int j = 0; j < m; j++) {
            const __m256 p = _mm256_set1_ps(probs[j]);
            for (int k = 0; k < 8; k++) out[k] = _mm256_fmadd_ps(p, _mm256_loadu_ps(value_rows[j] + d0 + 8 * k), out[k]);
        }
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(o + d0 + 8 * k, out[k]);
    }
#endif
    for (int j = 0; j < m; j++)
        for (int d = d0; d < D; d++) o[d] = fmaf(probs[j], value_rows[j][d], o[d]);
}

/* one item: rows [row0, row0 + ROWS) of a sequence, the query heads of one KV head.
 * scratch: keys and values of a tile, the rows' queries, their running max / sum / output, one row's scores,
 * probabilities and sums */
static void run_item(const Job *job, const WorkItem *item, float *scratch) {
    const int D = job->head_dim, group = job->num_heads / job->num_kv_heads, s = item->seq, h = item->kv_head;
    const int first = job->query_start_loc[s], q_len = job->query_start_loc[s + 1] - first;
    const int rows = q_len - item->row0 < ROWS ? q_len - item->row0 : ROWS;
    const int pos0 = job->seq_lens[s] - q_len + item->row0; /* position of the item's first row */
    const int lanes = rows * group;                       /* (row, head) pairs, row-major */
    float *keys = scratch, *values = keys + TILE * D, *queries = values + TILE * D;
    float *acc = queries + (long)lanes * D, *run_max = acc + (long)lanes * D, *run_sum = run_max + lanes;
    float *scores = run_sum + lanes, *probs = scores + group * TILE, *sums = probs + group * TILE; /* one row's */
    const float *key_rows[TILE], *value_rows[TILE]; /* float32 caches are read in place; bf16 rows widened */
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < group; g++) {
            const long at = (long)(first + item->row0 + r) * job->q_row + (long)(h * group + g) * D;
            load_row(job->q, at, job->is_bf16, D, queries + (long)(r * group + g) * D);
        }
    memset(acc, 0, sizeof(float) * lanes * D);
    for (int i = 0; i < lanes; i++) run_max[i] = -INFINITY, run_sum[i] = 0.0f;
    const int32_t *table = job->block_tables + (long)s * job->table_row;
    const int end = pos0 + rows; /* keys the last row sees */
    const int w = job->window;
    const int begin = w > 0 && pos0 - w + 1 > 0 ? pos0 - w + 1 : 0; /* the first key the first row sees */
    for (int t0 = begin / TILE * TILE; t0 < end; t0 += TILE) {
        const int n = end - t0 < TILE ? end - t0 : TILE;
        for (int j = begin > t0 ? begin - t0 : 0; j < n; j++) { /* keys before every row's window: not read */
            const int key = t0 + j;
            const long at = (((long)table[key / job->block_size] * job->block_size + key % job->block_size)
                             * job->num_kv_heads + h) * D;
            if (job->is_bf16) {
                load_row(job->k_cache, at, 1, D, keys + (long)j * D);
                load_row(job->v_cache, at, 1, D, values + (long)j * D);
                key_rows[j] = keys + (long)j * D, value_rows[j] = values + (long)j * D;
            } else {
                key_rows[j] = (const float *)job->k_cache + at, value_rows[j] = (const float *)job->v_cache + at;
            }
        }
        for (int r = 0; r < rows; r++) {
            /* keys lo .. lo + m - 1 of this tile the row sees: the tile cut at its position and its window */
            const int seen = pos0 + r + 1 - t0;
            const int lo = w > 0 && pos0 + r - w + 1 - t0 > 0 ? pos0 + r - w + 1 - t0 : 0;
            const int m = (seen < n ? seen : n) - lo;
            if (m <= 0) continue;
            const float *const *tile_keys = key_rows + lo, *const *tile_values = value_rows + lo;
            /* the row's heads one stage at a time: the same operations per head, the sums' chains side by side */
            for (int g = 0; g < group; g++) {
                const int lane = r * group + g;
                float *head_scores = scores + g * TILE;
                scaled_dots(queries + (long)lane * D, tile_keys, m, D, job->scale, head_scores);
                if (job->softcap > 0.0f) soft_cap_scores(head_scores, m, job->softcap);
                const float tile_max = max_of(head_scores, m);
                const float new_max = tile_max > run_max[lane] ? tile_max : run_max[lane];
                const float correction = exp_nonpositive(run_max[lane] - new_max); /* 0 on the first tile */
                float *o = acc + (long)lane * D;
                for (int d = 0; d < D; d++) o[d] *= correction;
                exp_shifted(head_scores, m, new_max, probs + g * TILE);
                run_max[lane] = new_max;
                sums[g] = run_sum[lane] * correction;
            }
            add_probs(sums, probs, group, m);
            for (int g = 0; g < group; g++) {
                const int lane = r * group + g;
                add_values(acc + (long)lane * D, probs + g * TILE, tile_values, m, D);
                run_sum[lane] = sums[g];
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < group; g++) {
            const int lane = r * group + g;
            const float *o = acc + (long)lane * D;
            const float inv = 1.0f / run_sum[lane];
            const long at = (long)(first + item->row0 + r) * job->out_row + (long)(h * group + g) * D;
            if (job->is_bf16)
                for (int d = 0; d < D; d++) ((bf16 *)job->out)[at + d] = float_to_bf16(o[d] * inv);
            else
                for (int d = 0; d < D; d++) ((float *)job->out)[at + d] = o[d] * inv;
        }
}

/* Causal attention of every row of q into out (see the top of the file); is_bf16: q, caches and out
 * are bfloat16, else float32; window: a sliding window's keys (0: none); softcap: the scores' soft cap (0: none). Returns 0, or -1 where the arguments do not fit (out untouched) or memory
 * ran out (out partly written). */
int generic_paged_attention(const void *q, long q_row, const void *k_cache, const void *v_cache,
                            const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                            const int32_t *query_start_loc, void *out, long out_row, int num_seqs, int num_heads,
                            int num_kv_heads, int head_dim, int block_size, float scale, int is_bf16, int window,
                            float softcap, int nthreads) {
    if (head_dim < 1 || num_kv_heads < 1 || num_heads % num_kv_heads || block_size < 1 || window < 0
        || !(softcap >= 0.0f))
        return -1;
    const int group = num_heads / num_kv_heads;
    long n = 0;
    WorkItem *items = paged_work_items(query_start_loc, seq_lens, num_seqs, num_kv_heads, ROWS, &n);
    if (!items) return -1;
    const Job job = {q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, q_row, out_row, table_row,
                     num_heads, num_kv_heads, head_dim, block_size, is_bf16, window, scale, softcap};
    const size_t scratch_floats = (size_t)2 * TILE * head_dim + (size_t)ROWS * group * (2 * head_dim + 2)
                                  + (size_t)group * (2 * TILE + 1);
    int failed = 0;
    /* libgomp.so.1 is torch's, already loaded: these threads are torch's pool */
#pragma omp parallel num_threads(n > 1 ? nthreads : 1)
    {
        float *scratch = malloc(sizeof(float) * scratch_floats);
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (long i = 0; i < n; i++)
            if (scratch) run_item(&job, &items[i], scratch);
        free(scratch);
    }
    free(items);
    return failed ? -1 : 0;
}
