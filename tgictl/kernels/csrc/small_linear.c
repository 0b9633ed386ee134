/* y = x W^T for a few rows of x (decode at small batch sizes), on the CPU.
 *
 * With one to a few input rows a linear layer is a matrix-vector product: every weight is read once
 * and used for a handful of multiply-adds, so its speed is the memory bandwidth. torch's bf16 matmul
 * reaches about a third of it at one row, so batch-1 decode spent most of its time there.
 *
 * bf16 weights: each thread streams one contiguous range of output rows, one row at a time against up to
 * four input rows, and prefetches its stream 4 KiB ahead into L1. One row at a time keeps each thread's
 * reads one sequential stream: SmolLM2-135M's 120 projections, weights from memory, 2 Zen 5 threads, one
 * input row, 6.7-7.9 -> 5.1-5.5 ms (31 -> 40 GB/s; its LM head 1.7 -> 1.25 ms), 4 input rows 12.9 -> 9.6 ms,
 * against tiles of four rows each prefetched two tiles ahead into L2 (which had taken Sapphire Rapids from
 * 10-11 to 15-18 GB/s; 2 KiB, 8 KiB, into L2 or non-temporal: the same or slower). A bf16 pair in a 32-bit
 * lane becomes two float32 values without a shuffle (vec16.h), so x is laid out once per call as even|odd
 * halves of every 32 columns to match. Products and sums are float32, each row's in the same order whatever
 * the rows beside it (a row's result does not depend on the batch); sums are in another order than oneDNN's,
 * so results differ from torch's by float rounding only. x and y are bf16 or float32 (flags), so the caller
 * converts nothing.
 *
 * f32 weights: a plain per-row loop for the vectoriser (float32 is the exactness path, and the default on CPUs
 * without bf16 math), each thread's rows one stream prefetched the same way: SmolLM2's projections in float32,
 * 2 Zen 5 threads, 1 / 4 / 8 input rows 12.6 / 16.9 / 43.6 -> 11.3 / 13.5 / 27.8 ms against chunks of 64 rows
 * dealt out to the threads in turn with no prefetch. Each row's sum is the same loop either way.
 *
 * Layouts (contiguous, row-major): x [m, k]; weight [n, k] (torch's Linear layout), bf16 held as
 * uint16; bias [n] float32 or NULL; y [m, n]. Parallel over output features with OpenMP, `threads` wide.
 *
 * Built at run time by tgictl/kernels/native.py; loaded with ctypes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "thread_rows.h"
#include "vec16.h"

#define PREFETCH_BYTES 4096 /* how far ahead of the line being read a thread's stream is prefetched */
#define PREFETCH_HINT 3      /* into L1 (into L2: 43 against 48 GB/s for bf16 at one row) */

void tgictl_small_linear_f32(const float *x, const float *weight, const float *bias, float *y, int64_t m, int64_t n,
                             int64_t k, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        thread_rows(n, 1, &lo, &hi);
        for (int64_t row = lo; row < hi; row++) {
            const float *w = weight + row * k;
            for (int64_t j = 0; j < k; j += 16)
                __builtin_prefetch((const char *)(w + j) + PREFETCH_BYTES, 0, PREFETCH_HINT);
            const float b = bias != NULL ? bias[row] : 0.0f;
            for (int64_t i = 0; i < m; i++) {
                const float *xi = x + i * k;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t j = 0; j < k; j++) dot += w[j] * xi[j];
                y[i * n + row] = dot + b;
            }
        }
    }
}

#define CHUNK 32    /* columns per step: 16 bf16 pairs, one 64-byte line of a weight row */
#define MAX_XROWS 4 /* input rows per pass over the weights */

/* Weight row w against M input rows. xs: [M][kv] even|odd float32 halves; xt: [M][k] float32 (the columns
 * past kv). sums[i]: the row against input row i. M is a constant at each call site. */
static inline __attribute__((always_inline)) void row_bf16(const uint16_t *w, const float *xs, const float *xt,
                                                           int64_t k, int64_t kv, int M, float sums[MAX_XROWS]) {
    v16f acc[MAX_XROWS];
    for (int i = 0; i < M; i++) acc[i] = (v16f){0};
    for (int64_t j = 0; j < kv; j += CHUNK) {
        __builtin_prefetch((const char *)(w + j) + PREFETCH_BYTES, 0, PREFETCH_HINT);
        const v16u u = load_v16u(w + j);
        const v16f even = bf16_even(u), odd = bf16_odd(u);
        for (int i = 0; i < M; i++) {
            acc[i] += even * load_v16f(xs + i * kv + j);
            acc[i] += odd * load_v16f(xs + i * kv + j + 16);
        }
    }
    for (int i = 0; i < M; i++) {
        float s = sum_v16f(acc[i]);
        for (int64_t j = kv; j < k; j++) s += bf16_to_float(w[j]) * xt[i * k + j];
        sums[i] = s;
    }
}

static inline void store(void *y, int y_bf16, int64_t index, float value) {
    if (y_bf16)
        ((uint16_t *)y)[index] = float_to_bf16(value);
    else
        ((float *)y)[index] = value;
}

/* Returns 0, or -1 when scratch memory is refused (the caller falls back to torch). */
int tgictl_small_linear_bf16(const void *x, int x_bf16, const uint16_t *weight, const float *bias, void *y,
                             int y_bf16, int64_t m, int64_t n, int64_t k, int threads) {
    const int64_t kv = k / CHUNK * CHUNK;
    float *xs = malloc(sizeof(float) * (size_t)(m * kv + m * k + 16));
    if (xs == NULL) return -1;
    float *xt = xs + m * kv;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < k; j++) xt[i * k + j] = bf16_or_f32_at(x, x_bf16, i * k + j);
        for (int64_t c = 0; c < kv; c += CHUNK)
            for (int e = 0; e < 16; e++) {
                xs[i * kv + c + e] = xt[i * k + c + 2 * e];
                xs[i * kv + c + 16 + e] = xt[i * k + c + 2 * e + 1];
            }
    }
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        thread_rows(n, 1, &lo, &hi);
        for (int64_t i0 = 0; i0 < m; i0 += MAX_XROWS) {
            const int64_t rows = m - i0 < MAX_XROWS ? m - i0 : MAX_XROWS;
            const float *xsi = xs + i0 * kv, *xti = xt + i0 * k;
            for (int64_t r = lo; r < hi; r++) {
                float sums[MAX_XROWS];
                switch (rows) { /* constant row counts: the accumulators stay in registers */
                case 1: row_bf16(weight + r * k, xsi, xti, k, kv, 1, sums); break;
                case 2: row_bf16(weight + r * k, xsi, xti, k, kv, 2, sums); break;
                case 3: row_bf16(weight + r * k, xsi, xti, k, kv, 3, sums); break;
                default: row_bf16(weight + r * k, xsi, xti, k, kv, 4, sums); break;
                }
                for (int64_t i = 0; i < rows; i++)
                    store(y, y_bf16, (i0 + i) * n + r, sums[i] + (bias != NULL ? bias[r] : 0.0f));
            }
        }
    }
    free(xs);
    return 0;
}
