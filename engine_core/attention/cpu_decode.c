/* Paged decode attention for CPUs with AVX512-BF16, bfloat16 caches: one query token per sequence,
 * keys and values read in place through the block table, online softmax in fp32.
 *
 * Why: a decode step on the CPU is bound by memory traffic. Gathering each sequence's keys and values
 * into a padded copy and then attending over the copy moves every cached byte three times; this reads
 * it once. Built at first use by cpu_decode_kernel.py (gcc -O3 -march=native) and called through
 * ctypes, which releases the GIL; its threads are torch's OpenMP pool. Layouts are those of
 * engine_core/attention/backend.py:
 *   q, out        [num_seqs, num_heads, head_dim] bf16, rows q_row / out_row elements apart
 *   k/v cache     [num_blocks, block_size, num_kv_heads, head_dim] bf16, contiguous
 *   block_tables  int32 [num_seqs, table_row]; seq_lens int32 [num_seqs]
 * Query head h belongs to KV head h / group. A work item is one (sequence, KV head): it reads that
 * head's keys and values once for all the group's query heads, 16 keys at a time.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 8
#define MAX_HEAD_DIM 256
#define TILE 16 /* keys per step: one vector of scores */

typedef struct {
    const uint16_t *q, *k_cache, *v_cache;
    uint16_t *out;
    const int32_t *block_tables, *seq_lens;
    long q_row, out_row, table_row;
    int num_heads, num_kv_heads, head_dim, block_size;
    float scale;
} Job;

/* e^x, about 1e-6 relative for x in [-80, 0], vectorized: 2^(x log2 e) as an integer power set in
 * the exponent bits times a polynomial for the fractional part */
static inline __m512 exp512(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
    const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, whole);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512i power = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(whole), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(power));
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

static inline __attribute__((always_inline)) void attend(const Job *j, int item, const int group, const int D) {
    const int seq = item / j->num_kv_heads, kv_head = item % j->num_kv_heads, pairs = D / 32;
    const int32_t *table = j->block_tables + seq * j->table_row;
    const int len = j->seq_lens[seq];
    const long head_offset = (long)kv_head * D, token_stride = (long)j->num_kv_heads * D;
    const uint16_t *q = j->q + seq * j->q_row + head_offset * group;
    __m512bh qv[MAX_GROUP][MAX_HEAD_DIM / 32];
    /* acc[g][2c], acc[g][2c + 1]: head dims 32c .. 32c + 31 in unpack order (undone at the end) */
    __m512 acc[MAX_GROUP][MAX_HEAD_DIM / 16];
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        for (int c = 0; c < pairs; c++) qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * D + c * 32);
        for (int c = 0; c < D / 16; c++) acc[g][c] = _mm512_setzero_ps();
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
    }
    /* the rows of this tile and of the next, whose keys are prefetched while this one is worked on:
     * blocks lie anywhere in the pool, so the hardware prefetchers cannot guess them */
    long tile_rows[2][TILE];
    int block = 0, offset = 0;
    const int first = len < TILE ? len : TILE;
    for (int t = 0; t < first; t++) {
        tile_rows[0][t] = ((long)table[block] * j->block_size + offset) * token_stride + head_offset;
        if (++offset == j->block_size) { offset = 0; block++; }
    }
    for (int start = 0, which = 0; start < len; start += TILE, which ^= 1) {
        const int n = len - start < TILE ? len - start : TILE;
        long *rows = tile_rows[which], *next = tile_rows[which ^ 1];
        for (int t = n; t < TILE; t++) rows[t] = rows[0]; /* past the end: scored, then masked out */
        for (int t = 0; t < n; t++)
            for (int c = 0; c < D; c += 32) _mm_prefetch((const char *)(j->v_cache + rows[t] + c), _MM_HINT_T0);
        for (int t = 0; t < TILE && start + TILE + t < len; t++) {
            next[t] = ((long)table[block] * j->block_size + offset) * token_stride + head_offset;
            if (++offset == j->block_size) { offset = 0; block++; }
            for (int c = 0; c < D; c += 32) _mm_prefetch((const char *)(j->k_cache + next[t] + c), _MM_HINT_T0);
        }
        const __mmask16 valid = (__mmask16)((1u << n) - 1);
        uint16_t probs[MAX_GROUP][TILE]; /* bf16, as the values they weigh */
        __m512 dots[MAX_GROUP][TILE]; /* per query head and key: 16 partial sums of q . k */
        for (int t = 0; t < TILE; t++) { /* each key row is loaded once for the whole group */
            __m512bh key[MAX_HEAD_DIM / 32];
            for (int c = 0; c < pairs; c++) key[c] = (__m512bh)_mm512_loadu_si512(j->k_cache + rows[t] + c * 32);
            for (int g = 0; g < group; g++) {
                __m512 dot = _mm512_setzero_ps();
                for (int c = 0; c < pairs; c++) dot = _mm512_dpbf16_ps(dot, qv[g][c], key[c]);
                dots[g][t] = dot;
            }
        }
        for (int g = 0; g < group; g++) {
            __m512 scores = _mm512_permutexvar_ps(reduce_inverse, sum16(dots[g]));
            scores = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(scores, _mm512_set1_ps(j->scale)));
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
            const uint16_t *v0 = j->v_cache + rows[t], *v1 = j->v_cache + rows[t + 1];
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
    }
    for (int g = 0; g < group; g++) {
        const float inv = running_sum[g] > 0.0f ? 1.0f / running_sum[g] : 0.0f; /* no keys: zeros */
        uint16_t *dst = j->out + seq * j->out_row + head_offset * group + (long)g * D;
        for (int c = 0; c < pairs; c++) {
            float lo[16], hi[16];
            _mm512_storeu_ps(lo, acc[g][2 * c]);
            _mm512_storeu_ps(hi, acc[g][2 * c + 1]);
            /* unpacklo/hi took, from each 128-bit lane l, dims 8l .. 8l + 3 and 8l + 4 .. 8l + 7 */
            for (int l = 0; l < 4; l++)
                for (int k = 0; k < 4; k++) {
                    dst[c * 32 + 8 * l + k] = to_bf16(lo[4 * l + k] * inv);
                    dst[c * 32 + 8 * l + 4 + k] = to_bf16(hi[4 * l + k] * inv);
                }
        }
    }
}

/* constant group sizes and head dims let the compiler unroll and keep q and the accumulators in
 * registers; other shapes take the general instance */
#define INSTANCE(G, HD) \
    static void attend_g##G##_d##HD(const Job *j, int item) { attend(j, item, G, HD); }
INSTANCE(1, 64) INSTANCE(2, 64) INSTANCE(3, 64) INSTANCE(4, 64) INSTANCE(8, 64)
INSTANCE(1, 128) INSTANCE(2, 128) INSTANCE(4, 128) INSTANCE(8, 128)
static void attend_any(const Job *j, int item) { attend(j, item, j->num_heads / j->num_kv_heads, j->head_dim); }

typedef void (*AttendFn)(const Job *, int);

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
                           int block_size, float scale, int nthreads) {
    if (head_dim % 32 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_GROUP)
        return -1;
    pthread_once(&order_once, find_reduce_order);
    const Job job = {q, k_cache, v_cache, out, block_tables, seq_lens, q_row, out_row, table_row,
                     num_heads, num_kv_heads, head_dim, block_size, scale};
    const AttendFn fn = pick(num_heads / num_kv_heads, head_dim);
    const int items = num_seqs * num_kv_heads;
    /* libgomp.so.1 is torch's, already loaded: these threads are torch's pool, not extra ones */
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int item = 0; item < items; item++) fn(&job, item);
    return 0;
}
