/* The per-row statistic of RMSNorm in a fixed order: scale[r] = 1 / sqrt(sum_k x[r][k]^2 / n + eps).
 *
 * Why not torch's x.pow(2).mean(-1): torch splits the reduction of ONE row across threads when the
 * step has fewer rows than threads and at least 32768 elements in all, and reduces each row on one
 * thread otherwise; the two sum in different orders. So with T rows and `threads` threads a row's
 * statistic depends on T wherever n >= 32768 / (threads - 1) (hidden 4096 on 16 threads; measured
 * at n = 40000 on 2 threads). Here each row's sum has one order: lane k % 16 of 16 running sums, in
 * k order, then a fixed pairwise tree; whatever the row count or the thread that takes the row.
 *
 * Built with -ffp-contract=off: the squares are rounded before they are added, in every copy.
 */
#include <math.h>

#define PART 16

/* sum_k x[k]^2 in the fixed order (squares: 1), or sum_k x[k] of squares already taken (squares: 0) */
static inline float fixed_order_sum(const float *x, long n, const int squares) {
    float part[PART] = {0};
    long k = 0;
    for (; k + PART <= n; k += PART)
        for (int l = 0; l < PART; l++) part[l] += squares ? x[k + l] * x[k + l] : x[k + l];
    for (int l = 0; k + l < n; l++) part[l] += squares ? x[k + l] * x[k + l] : x[k + l];
    for (int width = PART / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) part[l] += part[l + width];
    return part[0];
}

static float row_scale(const float *x, long n, float eps) {
    return 1.0f / sqrtf(fixed_order_sum(x, n, 1) / (float)n + eps);
}

/* scale[r] for rows r < rows of x (row stride x_stride floats, n values each) */
void rms_scale_f32(const float *x, long rows, long n, long x_stride, float eps, float *scale, int num_threads) {
    const int threads = rows * n < (1L << 16) ? 1 : num_threads; /* a parallel region costs more than small work */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) scale[r] = row_scale(x + r * x_stride, n, eps);
}
