/* Paged attention for CPUs with AVX512-BF16, bfloat16 caches, keys and values read in place through the
 * block table, online softmax in fp32. Two kernels: paged_decode_attention (one query token per
 * sequence) and, further down, paged_attention (any number of query rows per sequence: prefill chunks).
 *
 * Why: a decode step on the CPU is bound by memory traffic. Gathering each sequence's keys and values
 * into a padded copy and then attending over the copy moves every cached byte three times; this reads
 * it once. Built at first use for its tier (engine_core/cpu_kernels/table.py) and called through
 * ctypes, which releases the GIL; its threads are torch's OpenMP pool. Layouts are those of
 * engine_core/attention/backend.py:
 *   q, out        [num_seqs, num_heads, head_dim] bf16, rows q_row / out_row elements apart
 *   k/v cache     [num_blocks, block_size, num_kv_heads, head_dim] bf16, contiguous
 *   block_tables  int32 [num_seqs, table_row]; seq_lens int32 [num_seqs]
 * A sliding window (window > 0) limits the query at position p to keys p - window + 1 .. p; the keys
 * before it are never read (the scheduler may have handed their blocks to another request).
 * Query head h belongs to KV head h / group. A work item is a sequence (or, with few sequences, one of
 * its KV heads): it reads each KV head's keys and values once for all the group's query heads, 16 keys
 * at a time.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../transpose16.h"
#include "paged_work_items.h"

#define MAX_GROUP 8
#define MAX_HEAD_DIM 256
#define TILE 16 /* keys per step: one vector of scores */
#define PREFETCH_KEYS 32 /* how far ahead the decode kernel prefetches (16..128 measured alike) */

typedef struct {
    const uint16_t *q, *k_cache, *v_cache;
    uint16_t *out;
    const int32_t *block_tables, *seq_lens;
    long q_row, out_row, table_row;
    int num_heads, num_kv_heads, head_dim, block_size;
    float scale;
    int window; /* keys a query sees back from its own position, itself included; 0: all */
} Job;

/* 2^t, about 3e-6 relative (far below the bf16 rounding of the probabilities): an integer power applied
 * with scalef (0 for t far below -126, so no clamp) times a degree-4 fit of 2^f on [-0.5, 0.5] */
static inline __m512 exp2_fast(__m512 t) {
    const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, whole);
    __m512 p = _mm512_set1_ps(9.570087306201458e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.591785907745361e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402474582195282e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931217908859253e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999992847442627e-1f));
    return _mm512_scalef_ps(p, whole);
}

/* e^x for x <= 0 (-inf included: clamped first, as 2^t of a -inf would be NaN) */
static inline __m512 exp512(__m512 x) {
    return exp2_fast(_mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f)));
}

/* s[i] = sum of the 16 lanes of v[i], for 16 vectors at once (a transpose-and-add tree: about 3
 * instructions a vector instead of a full horizontal reduction each). Lanes of the result come out
 * in a fixed order, which find_reduce_order works out once. */
static inline __m512 sum16(__m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x88), _mm512_shuffle_f32x4(a[i], a[i + 4], 0xDD));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[i], b[i + 2], 0x88), _mm512_shuffle_ps(b[i], b[i + 2], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

static __m512i reduce_inverse; /* lane i of permutexvar(reduce_inverse, sum16(v)) is the sum of v[i] */
static pthread_once_t order_once = PTHREAD_ONCE_INIT;

static void find_reduce_order(void) {
    __m512 v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_set1_ps((float)i / 16.0f);
    float sums[16];
    int order[16], inverse[16];
    _mm512_storeu_ps(sums, sum16(v));
    for (int j = 0; j < 16; j++) {
        order[j] = (int)lrintf(sums[j]);
        inverse[order[j]] = j;
    }
    reduce_inverse = _mm512_loadu_si512(inverse);
}

static inline uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* One work item: a sequence's KV heads [h_begin, h_end). Tiles of 16 keys are walked in order and each
 * tile is taken for every head of the item before the next tile: a key row's heads lie side by side
 * in the cache, so the item reads whole rows (all heads) front to back rather than one head's
 * 128-byte slices 384 bytes apart (about 5% faster on a cold cache here). Each head's running state
 * (fp32 sums, max, total) waits in `state` between tiles. Which item a head falls in changes nothing in how it is computed: a
 * (sequence, head)'s result is the same whatever the split. */
static inline __attribute__((always_inline)) void attend(const Job *j, int seq, int h_begin, int h_end,
                                                         float *state, const int group, const int D) {
    const int pairs = D / 32, heads = h_end - h_begin;
    const int32_t *table = j->block_tables + seq * j->table_row;
    const int len = j->seq_lens[seq];
    const int begin = j->window > 0 && len > j->window ? len - j->window : 0; /* the first key it sees */
    const long token_stride = (long)j->num_kv_heads * D;
    /* per head: acc [group][D] (in unpack order, undone at the end), then running max [group], sum [group] */
    const int head_state = group * D + 2 * group;
    for (int h = 0; h < heads; h++) {
        float *st = state + (long)h * head_state;
        memset(st, 0, sizeof(float) * group * D);
        for (int g = 0; g < group; g++) {
            st[group * D + g] = -INFINITY;
            st[group * D + group + g] = 0.0f;
        }
    }
    /* the rows (offsets of the key row, head 0) of this tile and of the next */
    long tile_rows[2][TILE];
    int block = begin / j->block_size, offset = begin % j->block_size;
    const int first = len - begin < TILE ? len - begin : TILE;
    for (int t = 0; t < first; t++) {
        tile_rows[0][t] = ((long)table[block] * j->block_size + offset) * token_stride;
        if (++offset == j->block_size) { offset = 0; block++; }
    }
    const long span_begin = (long)h_begin * D, span_end = (long)h_end * D; /* the item's part of a row */
    for (int start = begin, which = 0; start < len; start += TILE, which ^= 1) {
        const int n = len - start < TILE ? len - start : TILE;
        long *rows = tile_rows[which], *next = tile_rows[which ^ 1];
        for (int t = n; t < TILE; t++) rows[t] = rows[0]; /* past the end: scored, then masked out */
        for (int t = 0; t < TILE && start + TILE + t < len; t++) {
            next[t] = ((long)table[block] * j->block_size + offset) * token_stride;
            if (++offset == j->block_size) { offset = 0; block++; }
        }
        /* keys PREFETCH_KEYS ahead, into L2: blocks lie anywhere in the pool, so the hardware prefetchers
         * cannot guess them (prefetched into L1 instead, or one tile ahead, a cold-cache step was 1.3x
         * slower: the misses in flight fill L1's queue and stall the loads) */
        for (int t = start + PREFETCH_KEYS; t < start + PREFETCH_KEYS + TILE && t < len; t++) {
            const long row = ((long)table[t / j->block_size] * j->block_size + t % j->block_size) * token_stride;
            for (long c = span_begin; c < span_end; c += 32) {
                _mm_prefetch((const char *)(j->k_cache + row + c), _MM_HINT_T1);
                _mm_prefetch((const char *)(j->v_cache + row + c), _MM_HINT_T1);
            }
        }
        const __mmask16 valid = (__mmask16)((1u << n) - 1);
        for (int h = h_begin; h < h_end; h++) {
            const long head_offset = (long)h * D;
            float *st = state + (long)(h - h_begin) * head_state;
            float *running_max = st + group * D, *running_sum = running_max + group;
            const uint16_t *q = j->q + seq * j->q_row + head_offset * group;
            __m512bh qv[MAX_GROUP][MAX_HEAD_DIM / 32];
            /* acc[g][2c], acc[g][2c + 1]: head dims 32c .. 32c + 31 in unpack order */
            __m512 acc[MAX_GROUP][MAX_HEAD_DIM / 16];
            for (int g = 0; g < group; g++) {
                for (int c = 0; c < pairs; c++) qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * D + c * 32);
                for (int c = 0; c < D / 16; c++) acc[g][c] = _mm512_loadu_ps(st + g * D + c * 16);
            }
            uint16_t probs[MAX_GROUP][TILE]; /* bf16, as the values they weigh */
            __m512 dots[MAX_GROUP][TILE]; /* per query head and key: 16 partial sums of q . k */
            for (int t = 0; t < TILE; t++) { /* each key row is loaded once for the whole group */
                __m512bh key[MAX_HEAD_DIM / 32];
                for (int c = 0; c < pairs; c++)
                    key[c] = (__m512bh)_mm512_loadu_si512(j->k_cache + rows[t] + head_offset + c * 32);
                for (int g = 0; g < group; g++) {
                    __m512 dot = _mm512_setzero_ps();
                    for (int c = 0; c < pairs; c++) dot = _mm512_dpbf16_ps(dot, qv[g][c], key[c]);
                    dots[g][t] = dot;
                }
            }
            for (int g = 0; g < group; g++) {
                __m512 scores = _mm512_permutexvar_ps(reduce_inverse, sum16(dots[g]));
                scores = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY),
                                              _mm512_mul_ps(scores, _mm512_set1_ps(j->scale)));
                const float tile_max = fmaxf(running_max[g], _mm512_reduce_max_ps(scores));
                const __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(scores, _mm512_set1_ps(tile_max))));
                const float correction = expf(running_max[g] - tile_max);
                running_sum[g] = running_sum[g] * correction + _mm512_reduce_add_ps(p);
                running_max[g] = tile_max;
                for (int c = 0; c < D / 16; c++) acc[g][c] = _mm512_mul_ps(acc[g][c], _mm512_set1_ps(correction));
                _mm256_storeu_si256((__m256i *)probs[g], (__m256i)_mm512_cvtneps_pbh(p));
            }
            /* values two keys at a time: interleaved (key t, key t + 1) pairs of each head dim against the
             * pair of their probabilities, one vdpbf16ps per 16 dims and query head */
            for (int t = 0; t < n; t += 2) {
                const uint16_t *v0 = j->v_cache + rows[t] + head_offset, *v1 = j->v_cache + rows[t + 1] + head_offset;
                __m512bh weights[MAX_GROUP];
                for (int g = 0; g < group; g++) {
                    uint32_t pair;
                    memcpy(&pair, &probs[g][t], sizeof pair);
                    weights[g] = (__m512bh)_mm512_set1_epi32((int)pair);
                }
                for (int c = 0; c < pairs; c++) {
                    const __m512i a = _mm512_loadu_si512(v0 + c * 32), b = _mm512_loadu_si512(v1 + c * 32);
                    const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
                    for (int g = 0; g < group; g++) {
                        acc[g][2 * c] = _mm512_dpbf16_ps(acc[g][2 * c], weights[g], lo);
                        acc[g][2 * c + 1] = _mm512_dpbf16_ps(acc[g][2 * c + 1], weights[g], hi);
                    }
                }
            }
            for (int g = 0; g < group; g++)
                for (int c = 0; c < D / 16; c++) _mm512_storeu_ps(st + g * D + c * 16, acc[g][c]);
        }
    }
    for (int h = h_begin; h < h_end; h++) {
        const float *st = state + (long)(h - h_begin) * head_state;
        const float *running_sum = st + group * D + group;
        for (int g = 0; g < group; g++) {
            const float inv = running_sum[g] > 0.0f ? 1.0f / running_sum[g] : 0.0f; /* no keys: zeros */
            uint16_t *dst = j->out + seq * j->out_row + (long)h * D * group + (long)g * D;
            for (int c = 0; c < pairs; c++) {
                const float *lo = st + g * D + c * 32, *hi = lo + 16;
                /* unpacklo/hi took, from each 128-bit lane l, dims 8l .. 8l + 3 and 8l + 4 .. 8l + 7 */
                for (int l = 0; l < 4; l++)
                    for (int k = 0; k < 4; k++) {
                        dst[c * 32 + 8 * l + k] = to_bf16(lo[4 * l + k] * inv);
                        dst[c * 32 + 8 * l + 4 + k] = to_bf16(hi[4 * l + k] * inv);
                    }
            }
        }
    }
}

/* constant group sizes and head dims let the compiler unroll and keep q and the accumulators in
 * registers; other shapes take the general instance */
#define INSTANCE(G, HD)                                                                          \
    static void attend_g##G##_d##HD(const Job *j, int seq, int h0, int h1, float *state) {      \
        attend(j, seq, h0, h1, state, G, HD);                                                  \
    }
INSTANCE(1, 64) INSTANCE(2, 64) INSTANCE(3, 64) INSTANCE(4, 64) INSTANCE(8, 64)
INSTANCE(1, 128) INSTANCE(2, 128) INSTANCE(4, 128) INSTANCE(8, 128)
static void attend_any(const Job *j, int seq, int h0, int h1, float *state) {
    attend(j, seq, h0, h1, state, j->num_heads / j->num_kv_heads, j->head_dim);
}

typedef void (*AttendFn)(const Job *, int, int, int, float *);

static AttendFn pick(int group, int head_dim) {
#define CASE(G, HD) if (group == G && head_dim == HD) return attend_g##G##_d##HD;
    CASE(1, 64) CASE(2, 64) CASE(3, 64) CASE(4, 64) CASE(8, 64)
    CASE(1, 128) CASE(2, 128) CASE(4, 128) CASE(8, 128)
#undef CASE
    return attend_any;
}

/* 0 when done; -1 for shapes this kernel does not take (the caller then uses another path) */
int paged_decode_attention(const uint16_t *q, long q_row, const uint16_t *k_cache, const uint16_t *v_cache,
                           const int32_t *block_tables, long table_row, const int32_t *seq_lens, uint16_t *out,
                           long out_row, int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                           int block_size, float scale, int window, int nthreads) {
    if (head_dim % 32 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_GROUP
        || window < 0)
        return -1;
    pthread_once(&order_once, find_reduce_order);
    const Job job = {q, k_cache, v_cache, out, block_tables, seq_lens, q_row, out_row, table_row,
                     num_heads, num_kv_heads, head_dim, block_size, scale, window};
    const AttendFn fn = pick(num_heads / num_kv_heads, head_dim);
    /* whole sequences per item where there are enough of them to share among the threads, else one
     * KV head per item so that a few long sequences still use every thread */
    const int heads_per_item = num_seqs >= 2 * nthreads ? num_kv_heads : 1;
    const int splits = num_kv_heads / heads_per_item, items = num_seqs * splits;
    const int group = num_heads / num_kv_heads;
    const long state_floats = (long)heads_per_item * (group * head_dim + 2 * group);
    /* libgomp.so.1 is torch's, already loaded: these threads are torch's pool, not extra ones */
#pragma omp parallel num_threads(nthreads)
    {
        float state[state_floats];
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            const int h0 = (item % splits) * heads_per_item;
            fn(&job, item / splits, h0, h0 + heads_per_item, state);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * Paged causal attention for any number of new query tokens per sequence (prefill chunks, chunks that
 * follow cached blocks, decodes): keys and values are read in place through the block table, with no
 * gathered copy and no mask tensor.
 *
 * A work item is (sequence, KV head, up to ROWS consecutive query rows). It walks that head's keys in
 * tiles of CT = 64 (key positions 0-63, 64-127, ...) up to the diagonal of its last row and prepares each
 * tile once for all its rows and all the group's query heads, per 16 keys:
 *   kT[i]     16 lanes of the key pair (k[t][2i], k[t][2i + 1]): a query row's 16 scores are then D/2
 *             vdpbf16ps of a broadcast query pair against kT[i], with no horizontal sums;
 *   vP[k][.]  values of keys 2k and 2k + 1 interleaved per head dim (unpacklo/hi, as in the decode
 *             kernel): one vdpbf16ps adds two keys' weighted values to 16 output dims.
 * A row that sees the whole tile takes it in one step: 4 vectors of scores, one horizontal max, one
 * rescale (only when its running max grows), exp as 2^x (degree-4 fit, scalef), no masks. A row whose
 * own position falls inside the tile takes the tile's 16-key parts up to the one holding its position
 * in the same single step (the last part masked): one max, rescale and pass over the values however
 * many parts (1.04-1.12x the kernel's speed on 400-token prompts against taking them one by one).
 * The softmax state is fp32 per row (lane-wise sums, running max).
 * Row independence: which tiles and parts a row takes, in what order and with what arithmetic depends
 * on its position alone, whatever other rows share its item or its register block, however its prompt
 * was chunked and whether its prefix came from the cache. A row's result is therefore bit-identical in
 * all those cases; only which rows are computed together changes, never how. (Tiles are aligned to
 * absolute key positions; -ffp-contract=off keeps each instance's arithmetic the same.)
 * ------------------------------------------------------------------------------------------------- */

#ifndef ROWS
#define ROWS 32 /* query rows per work item: each prepared tile serves ROWS x group query vectors */
#endif
#define CT 64 /* keys per full tile: CT_PARTS vectors of 16 scores (diagonal_rows takes 1 to 4) */
#define CT_PARTS (CT / 16)
#define MAX_VECTORS 8 /* rows interleaved x query heads per KV head, at most (see CHUNK_INSTANCE) */

typedef struct {
    Job base;
    const int32_t *query_start_loc;
    float log2e_scale; /* scale / ln 2: e^(x scale) = 2^(x log2e_scale) */
} ChunkJob;


static inline __m512bh pair_at(const uint16_t *p) { /* two bf16 at p, broadcast to every lane */
    int32_t pair;
    memcpy(&pair, p, sizeof pair);
    return (__m512bh)_mm512_set1_epi32(pair);
}

/* Per-row state lives in the thread's scratch: acc[v][D] (head dims in unpack order, as in the decode
 * kernel), the lane-wise running sum sums[v] and the running max maxes[v], v = row * group + head. */
typedef struct {
    float *acc;
    __m512 *sums;
    float *maxes;
} RowState;


/* One query vector's online-softmax step over NH 16-key parts of a tile, from its raw scores s (q . k):
 * `visible` keys of the tile from its start up to the row's own position, the first `hidden` of them
 * before its sliding window (masked); the running max, the lane-wise running sum and the accumulated
 * values acc (rescaled where the max grows) move on, and probs gets the tile's probabilities in bf16, as
 * the values they weigh. Parts past what a row sees add exact zeros: taken or not, the row's bits are the same. */
static inline __attribute__((always_inline)) void softmax_step(const ChunkJob *j, __m512 *s, int visible, int hidden,
                                                               float *acc, float *running_max, __m512 *running_sum,
                                                               uint16_t *probs, const int D, const int NH) {
    const Job *b = &j->base;
    const __m512 c = _mm512_set1_ps(j->log2e_scale);
    /* keys of this tile before the row's sliding window: a tile wholly before it is all masked, which
     * changes nothing (it comes before the row's first seen key: sums, max and outputs stay 0, -inf, 0) */
    __mmask16 valid[CT_PARTS] = {0};
    const int diagonal = visible < 16 * NH || hidden > 0; /* masks only here */
    if (diagonal)
        for (int h = 0; h < NH; h++) {
            const int n = visible - 16 * h, before = hidden - 16 * h;
            const __mmask16 upto = n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
            const __mmask16 from = before <= 0 ? (__mmask16)0xffff : before >= 16 ? (__mmask16)0
                                                                                   : (__mmask16)(0xffffu << before);
            valid[h] = upto & from;
            s[h] = _mm512_mask_blend_ps(valid[h], _mm512_set1_ps(-INFINITY), s[h]);
        }
    __m512 m = s[0];
    for (int h = 1; h < NH; h++) m = _mm512_max_ps(m, s[h]);
    const float tile_max = _mm512_reduce_max_ps(m); /* raw scores: scale > 0 keeps the order */
    if (tile_max > *running_max) { /* rescale what came before; skipped (exactly) when the max holds */
        const __m512 correction = _mm512_set1_ps(expf((*running_max - tile_max) * b->scale));
        *running_max = tile_max;
        *running_sum = _mm512_mul_ps(*running_sum, correction);
        for (int k = 0; k < D; k += 16) _mm512_store_ps(acc + k, _mm512_mul_ps(_mm512_load_ps(acc + k), correction));
    }
    const __m512 shift = _mm512_set1_ps(*running_max * j->log2e_scale);
    __m512 p[CT_PARTS];
    for (int h = 0; h < NH; h++) {
        p[h] = exp2_fast(_mm512_fmsub_ps(s[h], c, shift)); /* e^((s - max) scale) */
        if (diagonal) p[h] = _mm512_maskz_mov_ps(valid[h], p[h]);
    }
    __m512 sum = *running_sum;
    for (int h = 0; h < NH; h++) sum = _mm512_add_ps(sum, p[h]);
    *running_sum = sum;
    for (int h = 0; h + 1 < NH; h += 2)
        _mm512_store_si512((__m512i *)(probs + 16 * h), (__m512i)_mm512_cvtne2ps_pbh(p[h + 1], p[h]));
    if (NH % 2) _mm256_store_si256((__m256i *)(probs + 16 * (NH - 1)), (__m256i)_mm512_cvtneps_pbh(p[NH - 1]));
}

/* One tile (16 NH keys from tile_start: NH vectors of 16 scores) for R consecutive rows (first row r,
 * position pos) and all G query heads: scores, online softmax update, values. The arithmetic of each row is the same for every
 * R (R only interleaves independent rows so the vdpbf16ps chains overlap), and which branch a row takes
 * (masked diagonal tile or full tile, rescale or not) depends only on its position and its own scores. */
static inline __attribute__((always_inline)) void tile_rows(const ChunkJob *j, const __m512bh *kT, const __m512bh *vP,
                                                            const uint16_t *q, int r, int pos, int tile_start,
                                                            RowState st, const int R, const int G, const int D,
                                                            const int NH) {
    const Job *b = &j->base;
    const int W = 16 * NH; /* keys in this tile */
    /* arrays of fixed size (R * G <= MAX_VECTORS, NH <= CT_PARTS), not variable-length ones, so that the
     * compiler keeps them in registers */
    const uint16_t *qv[MAX_VECTORS];
    for (int rr = 0; rr < R; rr++)
        for (int g = 0; g < G; g++) qv[rr * G + g] = q + (long)(r + rr) * b->q_row + (long)g * D;
    /* scores: one chain per row and 16 keys */
    __m512 s[MAX_VECTORS][CT_PARTS];
    for (int v = 0; v < R * G; v++)
        for (int h = 0; h < NH; h++) s[v][h] = _mm512_setzero_ps();
    for (int i = 0; i < D / 2; i++)
        for (int v = 0; v < R * G; v++) {
            const __m512bh qp = pair_at(qv[v] + 2 * i);
            for (int h = 0; h < NH; h++) s[v][h] = _mm512_dpbf16_ps(s[v][h], qp, kT[h * (D / 2) + i]);
        }
    uint16_t probs[MAX_VECTORS][CT] __attribute__((aligned(64))); /* bf16, as the values they weigh */
    for (int v = 0; v < R * G; v++) {
        const int row = r + v / G, visible = pos + v / G - tile_start + 1; /* keys of this tile it sees */
        const int hidden = b->window > 0 ? pos + v / G - b->window + 1 - tile_start : 0;
        const long at = (long)row * G + v % G;
        softmax_step(j, s[v], visible, hidden, st.acc + at * D, st.maxes + at, st.sums + at, probs[v], D, NH);
    }
    /* values: KS accumulators (16 output dims each) per row at a time, as many as the registers hold, the key
     * pairs in order, all rows interleaved; each probability pair is broadcast once per pass. Every
     * accumulator sees the same sequence of vdpbf16ps whatever KS is. */
    const int KS = (4 * R * G <= 24 && D % 64 == 0) ? 4 : 2;
    for (int k0 = 0; k0 < D / 16; k0 += KS) {
        __m512 a[MAX_VECTORS][4];
        for (int v = 0; v < R * G; v++) {
            const float *acc = st.acc + ((long)(r + v / G) * G + v % G) * D + k0 * 16;
            for (int x = 0; x < KS; x++) a[v][x] = _mm512_load_ps(acc + 16 * x);
        }
        for (int k = 0; k < W / 2; k++) {
            __m512bh values[4];
            for (int x = 0; x < KS; x++) values[x] = vP[k * (D / 16) + k0 + x];
            for (int v = 0; v < R * G; v++) {
                const __m512bh weights = pair_at(probs[v] + 2 * k);
                for (int x = 0; x < KS; x++) a[v][x] = _mm512_dpbf16_ps(a[v][x], weights, values[x]);
            }
        }
        for (int v = 0; v < R * G; v++) {
            float *acc = st.acc + ((long)(r + v / G) * G + v % G) * D + k0 * 16;
            for (int x = 0; x < KS; x++) _mm512_store_ps(acc + 16 * x, a[v][x]);
        }
    }
}

/* tile_rows over the first `parts` 16-key parts of a tile (parts a run-time value up to CT_PARTS) */
static inline __attribute__((always_inline)) void diagonal_rows(const ChunkJob *j, const __m512bh *kT,
                                                                const __m512bh *vP, const uint16_t *q, int r, int pos,
                                                                int tile_start, RowState st, const int R, const int G,
                                                                const int D, int parts) {
    switch (parts) {
    case 1: tile_rows(j, kT, vP, q, r, pos, tile_start, st, R, G, D, 1); break;
    case 2: tile_rows(j, kT, vP, q, r, pos, tile_start, st, R, G, D, 2); break;
    case 3: tile_rows(j, kT, vP, q, r, pos, tile_start, st, R, G, D, 3); break;
    default: tile_rows(j, kT, vP, q, r, pos, tile_start, st, R, G, D, CT_PARTS); break;
    }
}

/* An item's walk over its key tiles: where its rows lie, and the cache rows (offsets of each key's head slice)
 * of the tile being taken and of the next, prefetched meanwhile into L2 (into L1, as the decode kernel found,
 * the misses in flight stall the loads: decode rows took this kernel 1.5x the one-token kernel's time). */
typedef struct {
    const int32_t *table;
    long head_offset, token_stride;
    int q_first, rows, len;
    int pos0, last;   /* positions of the item's first and last row */
    int begin, start0; /* the first key the first row sees (its sliding window's start), and the tile holding it */
    int block, offset; /* the next key to place, in the block table */
    long at[2][CT];
} ItemWalk;

static inline __attribute__((always_inline)) void walk_begin(const ChunkJob *j, const WorkItem *item, ItemWalk *w,
                                                             const int D) {
    const Job *b = &j->base;
    const int seq = item->seq;
    w->q_first = j->query_start_loc[seq];
    const int q_len = j->query_start_loc[seq + 1] - w->q_first;
    w->len = b->seq_lens[seq];
    w->rows = q_len - item->row0 < ROWS ? q_len - item->row0 : ROWS;
    w->pos0 = w->len - q_len + item->row0;
    w->last = w->pos0 + w->rows - 1;
    w->begin = b->window > 0 && w->pos0 - b->window + 1 > 0 ? w->pos0 - b->window + 1 : 0;
    w->start0 = w->begin / CT * CT;
    w->table = b->block_tables + seq * b->table_row;
    w->head_offset = (long)item->kv_head * D;
    w->token_stride = (long)b->num_kv_heads * D;
    w->block = w->start0 / b->block_size;
    w->offset = w->start0 % b->block_size;
    for (int t = 0; t < CT && w->start0 + t < w->len; t++) {
        if (w->start0 + t >= w->begin) /* keys before every row's window are not read: their blocks may be reused */
            w->at[0][t] = ((long)w->table[w->block] * b->block_size + w->offset) * w->token_stride + w->head_offset;
        if (++w->offset == b->block_size) { w->offset = 0; w->block++; }
    }
    for (int t = 0; t < w->begin - w->start0; t++) w->at[0][t] = w->at[0][w->begin - w->start0]; /* masked */
}

/* The tile of CT keys from `start` (cache rows in w->at[which]) prepared for every row of the item: kT and vP
 * as described above, for the 16-key parts some row sees; returns how many parts that is. */
static inline __attribute__((always_inline)) int walk_tile(const ChunkJob *j, ItemWalk *w, int start, int which,
                                                           __m512bh *kT, __m512bh *vP, const int D) {
    const Job *b = &j->base;
    long *at = w->at[which], *next = w->at[which ^ 1];
    /* keys past the sequence's end (not written: anything, NaN included) read the tile's first key
     * instead; the mask gives them probability 0 */
    for (int t = w->len - start; t < CT; t++) at[t] = at[0];
    for (int t = 0; t < CT && start + CT + t < w->len && start + CT <= w->last; t++) {
        next[t] = ((long)w->table[w->block] * b->block_size + w->offset) * w->token_stride + w->head_offset;
        if (++w->offset == b->block_size) { w->offset = 0; w->block++; }
        for (int c = 0; c < D; c += 32) {
            _mm_prefetch((const char *)(b->k_cache + next[t] + c), _MM_HINT_T1);
            _mm_prefetch((const char *)(b->v_cache + next[t] + c), _MM_HINT_T1);
        }
    }
    /* only the 16-key parts some row of the item sees: up to the last row's own position (a decode's last
     * tile is mostly past it); which parts a row reads does not change */
    const int parts = w->last - start >= CT - 1 ? CT_PARTS : (w->last - start) / 16 + 1;
    for (int n = 0; n < parts; n++) /* kT[n * D / 2 + i]: key pair i of keys 16n .. 16n + 15 */
        for (int h = 0; h < D / 32; h++) {
            __m512i r[16], out[16];
            for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_si512(b->k_cache + at[16 * n + t] + h * 32);
            transpose16(r, out);
            for (int i = 0; i < 16; i++) kT[n * (D / 2) + h * 16 + i] = (__m512bh)out[i];
        }
    for (int k = 0; k < parts * 8; k++)
        for (int c = 0; c < D / 32; c++) {
            const __m512i x = _mm512_loadu_si512(b->v_cache + at[2 * k] + c * 32);
            const __m512i y = _mm512_loadu_si512(b->v_cache + at[2 * k + 1] + c * 32);
            vP[k * (D / 16) + 2 * c] = (__m512bh)_mm512_unpacklo_epi16(x, y);
            vP[k * (D / 16) + 2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
        }
    return parts;
}

/* every query vector of the item at its start: no keys seen, nothing summed */
static inline void clear_rows(RowState st, int vectors, const int D) {
    for (int v = 0; v < vectors; v++) {
        for (int c = 0; c < D; c += 16) _mm512_store_ps(st.acc + (long)v * D + c, _mm512_setzero_ps());
        st.sums[v] = _mm512_setzero_ps();
        st.maxes[v] = -INFINITY;
    }
}

/* the item's outputs: each query vector's sums over its running total, in bf16, head dims back in order */
static inline __attribute__((always_inline)) void write_rows(const ChunkJob *j, const ItemWalk *w, RowState st,
                                                             int row0, const int G, const int D) {
    const Job *b = &j->base;
    for (int v = 0; v < w->rows * G; v++) {
        const float total = _mm512_reduce_add_ps(st.sums[v]);
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        const float *acc = st.acc + (long)v * D;
        uint16_t *dst = b->out + (long)(w->q_first + row0 + v / G) * b->out_row + w->head_offset * G + (long)(v % G) * D;
        for (int c = 0; c < D / 32; c++)
            /* unpacklo/hi took, from each 128-bit lane l, dims 8l .. 8l + 3 and 8l + 4 .. 8l + 7 */
            for (int l = 0; l < 4; l++)
                for (int k = 0; k < 4; k++) {
                    dst[c * 32 + 8 * l + k] = to_bf16(acc[c * 32 + 4 * l + k] * inv);
                    dst[c * 32 + 8 * l + 4 + k] = to_bf16(acc[c * 32 + 16 + 4 * l + k] * inv);
                }
    }
}

static inline __attribute__((always_inline)) void attend_chunk(const ChunkJob *j, const WorkItem *item, float *scratch,
                                                               const int G, const int D, const int R) {
    const Job *b = &j->base;
    ItemWalk w;
    walk_begin(j, item, &w, D);
    const int rows = w.rows, pos0 = w.pos0;
    const uint16_t *q = b->q + (long)(w.q_first + item->row0) * b->q_row + w.head_offset * G;
    RowState st = {scratch, (__m512 *)(scratch + (long)ROWS * G * D), scratch + (long)ROWS * G * (D + 16)};
    clear_rows(st, rows * G, D);
    __m512bh kT[CT_PARTS * MAX_HEAD_DIM / 2], vP[CT / 2 * MAX_HEAD_DIM / 16];
    for (int start = w.start0, which = 0; start <= w.last; start += CT, which ^= 1) {
        walk_tile(j, &w, start, which, kT, vP, D);
        /* rows that see the whole tile take it at once, unmasked; a row whose diagonal falls inside it
         * takes its 16-key parts up to the one holding its own position, in one pass (masked in that
         * last part). Which way a row takes, and how many parts, depends on its position alone. */
        const int full = start + CT - 1 - pos0 > 0 ? start + CT - 1 - pos0 : 0; /* first row seeing it all */
        int r = full;
        for (; r + R <= rows; r += R) tile_rows(j, kT, vP, q, r, pos0 + r, start, st, R, G, D, CT_PARTS);
        for (; r < rows; r++) tile_rows(j, kT, vP, q, r, pos0 + r, start, st, 1, G, D, CT_PARTS);
        const int diagonal_end = full < rows ? full : rows;
        for (int n = 0; n < CT_PARTS; n++) { /* rows at positions start + 16n .. start + 16n + 15: n + 1 parts */
            const int first = start + 16 * n - pos0, end = first + 16 < diagonal_end ? first + 16 : diagonal_end;
            r = first > 0 ? first : 0;
            for (; r + R <= end; r += R) diagonal_rows(j, kT, vP, q, r, pos0 + r, start, st, R, G, D, n + 1);
            for (; r < end; r++) diagonal_rows(j, kT, vP, q, r, pos0 + r, start, st, 1, G, D, n + 1);
        }
    }
    write_rows(j, &w, st, item->row0, G, D);
}

/* R (rows interleaved) is chosen so that about 6-8 independent query vectors share each loaded tile
 * vector: enough vdpbf16ps chains in flight to hide their latency */
#ifndef R3
#define R3 2
#endif
#define CHUNK_INSTANCE(G, HD, R) \
    static void chunk_g##G##_d##HD(const ChunkJob *j, const WorkItem *item, float *s) { attend_chunk(j, item, s, G, HD, R); }
CHUNK_INSTANCE(1, 64, 8) CHUNK_INSTANCE(2, 64, 4) CHUNK_INSTANCE(3, 64, R3) CHUNK_INSTANCE(4, 64, 2) CHUNK_INSTANCE(8, 64, 1)
CHUNK_INSTANCE(1, 128, 8) CHUNK_INSTANCE(2, 128, 4) CHUNK_INSTANCE(4, 128, 2) CHUNK_INSTANCE(8, 128, 1)
static void chunk_any(const ChunkJob *j, const WorkItem *item, float *s) {
    attend_chunk(j, item, s, j->base.num_heads / j->base.num_kv_heads, j->base.head_dim, 1);
}

typedef void (*ChunkFn)(const ChunkJob *, const WorkItem *, float *);

static ChunkFn pick_chunk(int group, int head_dim) {
#define CASE(G, HD) if (group == G && head_dim == HD) return chunk_g##G##_d##HD;
    CASE(1, 64) CASE(2, 64) CASE(3, 64) CASE(4, 64) CASE(8, 64)
    CASE(1, 128) CASE(2, 128) CASE(4, 128) CASE(8, 128)
#undef CASE
    return chunk_any;
}

/* what paged_attention here and in amx_attention.c does first: refuses (NULL) the shapes these kernels do not
 * take, else returns the work items (*n of them; NULL also when out of memory) and fills the job they share */
static WorkItem *chunk_work(const uint16_t *q, long q_row, const uint16_t *k_cache, const uint16_t *v_cache,
                            const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                            const int32_t *query_start_loc, uint16_t *out, long out_row, int num_seqs,
                            int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int window,
                            ChunkJob *job, long *n) {
    if (head_dim % 32 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_GROUP ||
        !(scale > 0.0f) || window < 0) /* the running max is taken over unscaled scores */
        return NULL;
    *job = (ChunkJob){{q, k_cache, v_cache, out, block_tables, seq_lens, q_row, out_row, table_row, num_heads,
                       num_kv_heads, head_dim, block_size, scale, window}, query_start_loc,
                      scale * 1.44269504088896341f};
    return paged_work_items(query_start_loc, seq_lens, num_seqs, num_kv_heads, ROWS, n);
}

/* Attention of every query row of num_seqs sequences: sequence i owns rows query_start_loc[i] ..
 * query_start_loc[i + 1] - 1, the last of its seq_lens[i] cached tokens. 0 when done; -1 for shapes
 * this kernel does not take (the caller then uses another path). */
int paged_attention(const uint16_t *q, long q_row, const uint16_t *k_cache, const uint16_t *v_cache,
                    const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                    const int32_t *query_start_loc, uint16_t *out, long out_row, int num_seqs, int num_heads,
                    int num_kv_heads, int head_dim, int block_size, float scale, int window, int nthreads) {
    ChunkJob job;
    long n = 0;
    WorkItem *items = chunk_work(q, q_row, k_cache, v_cache, block_tables, table_row, seq_lens, query_start_loc, out,
                                 out_row, num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, window, &job,
                                 &n);
    if (!items) return -1;
    const int group = num_heads / num_kv_heads;
    const ChunkFn fn = pick_chunk(group, head_dim);
    const size_t scratch_bytes = sizeof(float) * ROWS * group * (head_dim + 16 + 1) + 64;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) nowait /* one barrier (the region's end), not two */
        for (long i = 0; i < n; i++)
            if (scratch) fn(&job, &items[i], scratch);
        free(scratch);
    }
    free(items);
    return failed ? -1 : 0;
}

