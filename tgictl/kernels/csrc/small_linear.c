/* y = x W^T for a few rows of x (decode at small batch sizes), on the CPU.
 *
 * With one to a few input rows a linear layer is a matrix-vector product: every weight is read once
 * and used for a handful of multiply-adds, so its speed is the memory bandwidth. torch's bf16 matmul
 * reaches about a third of it at one row, so batch-1 decode spent most of its time there.
 *
 * bf16 weights: each thread streams one contiguous range of output rows, four rows at a time (four
 * independent sums hide the multiply-add latency), and prefetches two tiles ahead into L2 (measured on
 * SmolLM2's shapes, Sapphire Rapids, 2 threads: 10-11 GB/s without, 15-18 with, against 18 for a bare
 * read). A bf16 pair in a 32-bit lane becomes two float32 values without a shuffle (vec16.h), so x is
 * laid out once per call as even|odd halves of every 32 columns to match. Products and sums
 * are float32; sums are in another order than oneDNN's, so results differ from torch's by float
 * rounding only. x and y are bf16 or float32 (flags), so the caller converts nothing.
 *
 * f32 weights: a plain per-row loop for the vectoriser (float32 is the exactness path, not the fast one).
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

/* Output features per OpenMP chunk of the f32 kernel: enough rows to amortise scheduling, few enough to balance. */
#define ROWS_PER_CHUNK 64

void tgictl_small_linear_f32(const float *x, const float *weight, const float *bias, float *y, int64_t m, int64_t n,
                             int64_t k, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static, ROWS_PER_CHUNK)
    for (int64_t row = 0; row < n; row++) {
        const float *w = weight + row * k;
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

#define CHUNK 32     /* columns per step: 16 bf16 pairs, one 64-byte line of a weight row */
#define TILE 4       /* weight rows per pass */
#define MAX_XROWS 4  /* input rows per pass over the weights */
#define PREFETCH_TILES 2

/* Rows r..r+TILE-1 of w against M input rows. xs: [M][kv] even|odd float32 halves; xt: [M][k] float32
 * (the columns past kv). sums[i][t]: row r + t of input row i. M is a constant at each call site. */
static inline __attribute__((always_inline)) void tile_bf16(const uint16_t *w, const float *xs, const float *xt,
                                                            int64_t k, int64_t kv, int64_t r, int M,
                                                            float sums[MAX_XROWS][TILE]) {
    v16f acc[MAX_XROWS][TILE];
    for (int i = 0; i < M; i++)
        for (int t = 0; t < TILE; t++) acc[i][t] = (v16f){0};
    const uint16_t *w0 = w + r * k, *ahead = w0 + PREFETCH_TILES * TILE * k;
    for (int64_t j = 0; j < kv; j += CHUNK) {
        for (int t = 0; t < TILE; t++) __builtin_prefetch(ahead + t * k + j, 0, 1);
        v16u u[TILE];
        for (int t = 0; t < TILE; t++) u[t] = load_v16u(w0 + t * k + j);
        for (int i = 0; i < M; i++) {
            const v16f even = load_v16f(xs + i * kv + j), odd = load_v16f(xs + i * kv + j + 16);
            for (int t = 0; t < TILE; t++) {
                acc[i][t] += bf16_even(u[t]) * even;
                acc[i][t] += bf16_odd(u[t]) * odd;
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int t = 0; t < TILE; t++) {
            float s = sum_v16f(acc[i][t]);
            for (int64_t j = kv; j < k; j++) s += bf16_to_float(w0[t * k + j]) * xt[i * k + j];
            sums[i][t] = s;
        }
}

/* One output row (the tail of a thread's range when it is not a multiple of TILE). */
static float row_bf16(const uint16_t *w, const float *xs, const float *xt, int64_t k, int64_t kv) {
    v16f acc = {0};
    for (int64_t j = 0; j < kv; j += CHUNK) {
        const v16u u = load_v16u(w + j);
        acc += bf16_even(u) * load_v16f(xs + j);
        acc += bf16_odd(u) * load_v16f(xs + j + 16);
    }
    float s = sum_v16f(acc);
    for (int64_t j = kv; j < k; j++) s += bf16_to_float(w[j]) * xt[j];
    return s;
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
        thread_rows(n, TILE, &lo, &hi);
        for (int64_t i0 = 0; i0 < m; i0 += MAX_XROWS) {
            const int64_t rows = m - i0 < MAX_XROWS ? m - i0 : MAX_XROWS;
            const float *xsi = xs + i0 * kv, *xti = xt + i0 * k;
            int64_t r = lo;
            for (; r + TILE <= hi; r += TILE) {
                float sums[MAX_XROWS][TILE];
                switch (rows) { /* constant row counts: the accumulators stay in registers */
                case 1: tile_bf16(weight, xsi, xti, k, kv, r, 1, sums); break;
                case 2: tile_bf16(weight, xsi, xti, k, kv, r, 2, sums); break;
                case 3: tile_bf16(weight, xsi, xti, k, kv, r, 3, sums); break;
                default: tile_bf16(weight, xsi, xti, k, kv, r, 4, sums); break;
                }
                for (int64_t i = 0; i < rows; i++)
                    for (int t = 0; t < TILE; t++)
                        store(y, y_bf16, (i0 + i) * n + r + t, sums[i][t] + (bias != NULL ? bias[r + t] : 0.0f));
            }
            for (; r < hi; r++)
                for (int64_t i = 0; i < rows; i++)
                    store(y, y_bf16, (i0 + i) * n + r,
                          row_bf16(weight + r * k, xsi + i * kv, xti + i * k, k, kv) + (bias != NULL ? bias[r] : 0.0f));
        }
    }
    free(xs);
    return 0;
}
