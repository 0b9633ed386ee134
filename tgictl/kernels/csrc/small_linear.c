/* y = x W^T for a few rows of x (decode at small batch sizes), on the CPU.
 *
 * With one to a few input rows a linear layer is a matrix-vector product: every weight is read once
 * and used for a handful of multiply-adds, so its speed is the memory bandwidth. torch's bf16 matmul
 * reaches about a third of it at one row (5 GB/s on the 56 MB SmolLM2 LM head on this machine), so
 * batch-1 decode spent most of its time there. This kernel streams each weight row once, converts it
 * to float32 in registers, and takes the dot products with every input row while the row is in cache.
 *
 * Layouts (contiguous, row-major): x [m, k] float32 (the caller converts the few input rows);
 * weight [n, k] (torch's Linear layout) float32 or bf16 held as uint16; bias [n] float32 or NULL;
 * y [m, n] float32. Parallel over output features with OpenMP, `threads` wide. Accumulation is in
 * float32 in a different order than oneDNN's, so results differ from torch's by float rounding only.
 *
 * Built at run time by tgictl/kernels/native.py; loaded with ctypes.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* Output features per OpenMP chunk: enough rows to amortise scheduling, few enough to balance. */
#define ROWS_PER_CHUNK 64

#define DEFINE_SMALL_LINEAR(NAME, T, LOAD)                                                               \
    void NAME(const float *x, const T *weight, const float *bias, float *y, int64_t m, int64_t n,      \
              int64_t k, int threads) {                                                                  \
        _Pragma("omp parallel for num_threads(threads) schedule(static, ROWS_PER_CHUNK)")                \
        for (int64_t row = 0; row < n; row++) {                                                          \
            const T *w = weight + row * k;                                                               \
            const float b = bias != NULL ? bias[row] : 0.0f;                                             \
            for (int64_t i = 0; i < m; i++) {                                                            \
                const float *xi = x + i * k;                                                             \
                float dot = 0.0f;                                                                        \
                _Pragma("omp simd reduction(+ : dot)") for (int64_t j = 0; j < k; j++) dot += LOAD(w[j]) * xi[j]; \
                y[i * n + row] = dot + b;                                                                \
            }                                                                                            \
        }                                                                                                \
    }

DEFINE_SMALL_LINEAR(tgictl_small_linear_f32, float, load_f32)
DEFINE_SMALL_LINEAR(tgictl_small_linear_bf16, uint16_t, bf16_to_float)
