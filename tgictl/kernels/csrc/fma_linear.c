/* y = x W^T + b for bf16 x and weights of 5+ rows on CPUs where torch has no fast bf16 matmul: AVX2 with
 * FMA but neither AVX512-BW nor AVX-NE-CONVERT (oneDNN's bf16 kernels need one of them), e.g. AMD Zen 2/3.
 * There torch multiplies bf16 in a generic loop at ~15 GFLOP/s on 2 cores, whatever the row count (float32:
 * 70-120), and a bf16 decode step at batch 32 spent 96% of its time in it.
 *
 * The weight stays as stored ([n, k] bf16, no copy): one 32-byte load holds 8 pairs of a weight row; the
 * even elements widen by a shift (lane << 16), the odd ones by a mask, no shuffle. x is widened once per
 * call into float32 rows split the same way (its even columns, then its odd ones), so two FMAs multiply
 * 8 even and 8 odd weights by the matching x. Micro-tile: 4 input rows x 3 weight rows, 12 accumulators
 * over all of k, the 4 rows of x (at most 4 * k floats) in L1 while the weight rows stream from L2.
 * Tasks are blocks of 64 input rows x 48 weight rows, both L2-resident, handed out dynamically.
 * float32 sums, the bias added, rounded to bf16 once: torch's rounding of a bf16 linear, in another order.
 * Layouts: x [m, k] bf16, weight [n, k] bf16, bias [n] float32 or NULL, y [m, n] bf16; k a multiple of 16.
 * Returns 0, or -1 where this build has no such kernel, k is not a multiple of 16, or memory is refused.
 */
#include <stdint.h>
#include <stdlib.h>

#include "avx2.h"
#include "bf16.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512BW__) && !defined(__AVXNECONVERT__)
#define HAVE_FMA_LINEAR 1
#include <immintrin.h>
#endif

#define MR 4            /* input rows per micro-tile */
#define NR 3            /* weight rows per micro-tile */
#define ROW_BLOCK 64    /* input rows per task */
#define COL_BLOCK 48    /* weight rows per task (a multiple of NR) */

int tgictl_fma_linear_available(void) {
#if defined(HAVE_FMA_LINEAR)
    return 1;
#else
    return 0;
#endif
}

#if defined(HAVE_FMA_LINEAR)
/* out[a][b] = sum over k of x row a times weight row b, for mr x nr rows (constants where it is inlined). */
static inline __attribute__((always_inline)) void tile(const float *xs, const uint16_t *w, int64_t k, int mr,
                                                       int nr, float out[MR][NR]) {
    __m256 acc[MR][NR];
    for (int a = 0; a < mr; a++)
        for (int b = 0; b < nr; b++) acc[a][b] = _mm256_setzero_ps();
    const int64_t half = k / 2;
    const __m256i odd_mask = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int64_t j = 0; j < half; j += 8) {
        for (int b = 0; b < nr; b++) {
            const __m256i pairs = _mm256_loadu_si256((const __m256i *)(w + b * k + 2 * j));
            const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
            const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, odd_mask));
            for (int a = 0; a < mr; a++) {
                acc[a][b] = _mm256_fmadd_ps(even, _mm256_loadu_ps(xs + a * k + j), acc[a][b]);
                acc[a][b] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(xs + a * k + half + j), acc[a][b]);
            }
        }
    }
    for (int a = 0; a < mr; a++)
        for (int b = 0; b < nr; b++) out[a][b] = sum8(acc[a][b]);
}

#define TILE_CASE(R, C) \
    case (R) * 4 + (C): tile(xs, w, k, R, C, out); break;

static void tile_any(const float *xs, const uint16_t *w, int64_t k, int mr, int nr, float out[MR][NR]) {
    switch (mr * 4 + nr) {
        TILE_CASE(4, 3) TILE_CASE(4, 2) TILE_CASE(4, 1)
        TILE_CASE(3, 3) TILE_CASE(3, 2) TILE_CASE(3, 1)
        TILE_CASE(2, 3) TILE_CASE(2, 2) TILE_CASE(2, 1)
        TILE_CASE(1, 3) TILE_CASE(1, 2) TILE_CASE(1, 1)
        default: break;
    }
}

/* x row -> its even columns as float32, then its odd ones. */
static void widen_row(const uint16_t *x, int64_t k, float *xs) {
    const int64_t half = k / 2;
    for (int64_t j = 0; j < half; j++) {
        xs[j] = bf16_to_float(x[2 * j]);
        xs[half + j] = bf16_to_float(x[2 * j + 1]);
    }
}
#endif

int tgictl_fma_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                           int64_t n, int64_t k, int threads) {
#if defined(HAVE_FMA_LINEAR)
    if (k % 16 != 0 || m < 1 || n < 1) return -1;
    float *xs = malloc((size_t)(m * k) * sizeof(float));
    if (xs == NULL) return -1;
    const int64_t row_blocks = (m + ROW_BLOCK - 1) / ROW_BLOCK, col_blocks = (n + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) widen_row(x + i * k, k, xs + i * k);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t rb = 0; rb < row_blocks; rb++) {
            for (int64_t cb = 0; cb < col_blocks; cb++) {
                const int64_t row_end = rb * ROW_BLOCK + ROW_BLOCK < m ? rb * ROW_BLOCK + ROW_BLOCK : m;
                const int64_t col_end = cb * COL_BLOCK + COL_BLOCK < n ? cb * COL_BLOCK + COL_BLOCK : n;
                for (int64_t i0 = rb * ROW_BLOCK; i0 < row_end; i0 += MR) {
                    const int mr = row_end - i0 < MR ? (int)(row_end - i0) : MR;
                    for (int64_t n0 = cb * COL_BLOCK; n0 < col_end; n0 += NR) {
                        const int nr = col_end - n0 < NR ? (int)(col_end - n0) : NR;
                        float out[MR][NR];
                        tile_any(xs + i0 * k, weight + n0 * k, k, mr, nr, out);
                        for (int a = 0; a < mr; a++)
                            for (int b = 0; b < nr; b++)
                                y[(i0 + a) * n + n0 + b] =
                                    float_to_bf16(out[a][b] + (bias != NULL ? bias[n0 + b] : 0.0f));
                    }
                }
            }
        }
    }
    free(xs);
    return 0;
#else
    (void)x; (void)weight; (void)bias; (void)y; (void)m; (void)n; (void)k; (void)threads;
    return -1;
#endif
}
