/* y = x W^T + b for int8 rows with one scale per row (tgictl/kernels/linear_methods/int8.py), on the CPU:
 *   y[i, n] = scale[n] * sum_k q[n, k] x[i, k] + b[n]
 * the float matmul on the dequantized weights up to the order of float additions (every product q x of a
 * bf16 or float32 x is exact in float32 for bf16 x; the sums are float32).
 *
 * Few rows (decode at small batch): a matrix-vector product whose speed is the weight stream. Each thread
 * reads one contiguous range of weight rows, eight rows at a time, and prefetches two such tiles ahead into
 * L2 (as small_linear.c does for bf16). A 64-byte line of a row holds 64 int8 columns; lane l of the line
 * read as 16 32-bit lanes holds columns 4l..4l+3, and shifts sign-extend each byte in place (no shuffle:
 * shuffles run on one port), so x is laid out once per call in four phases per 64 columns to match: phase b
 * holds columns 4l + b. The kernel this replaced took one row per OpenMP chunk of 16, the threads' chunks
 * interleaved, one sum at a time: SmolLM2's 120 projections streamed at 13 GB/s on 2 Zen 5 cores.
 * One input row (a one-client decode step, AVX-512 builds): one weight row at a time, read 16 columns at a
 * time by sign extension (int8_widen.h) into four sums per 64-byte line, x as given, each thread's rows one
 * stream prefetched 4 KiB ahead into L1 (as small_linear.c's). The int8 LM head of SmolLM2 (49152 x 576, 28 MB)
 * with caches cold, Zen 5, 2 threads: 744-748 us with the tiles of 8 above (38 GB/s), 655-663 with groups of 4
 * weight rows and one sum each (43 GB/s; 1 row and one sum: 29), and those groups prefetching into L1 rather
 * than L2 took an int8 one-row step 5.49 -> 5.31 ms; one row with four sums then 4.10-4.51 -> 3.98-4.39 ms.
 *
 * Many rows: strips of int8 rows decoded to bf16 for the AMX or VDPBF16PS products (decoded_linear.h).
 *
 * Layouts (contiguous, row-major): x [m, k] float32 (the caller converts the few input rows once); q [n, k]
 * int8 with scales [n] bf16 (uint16) or float32 (`scales_bf16` says which); bias [n] float32 or NULL;
 * y [m, n] float32. Parallel over output rows with OpenMP, `threads` wide. Written with GCC vector
 * extensions (vec16.h): AVX-512 where the CPU has it, AVX2 or SSE registers elsewhere.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "decoded_linear.h"
#include "bf16.h"
#include "int8_widen.h"
#include "thread_rows.h"
#include "vec16.h"

#define LINE 64       /* int8 columns per line: one 64-byte load per weight row */
#define TILE 8        /* weight rows per pass: x is loaded once per 8 rows (4: 1.4-1.8x slower at 1-4 rows) */
#define MAX_XROWS 4   /* input rows per pass over the weights */
#define PREFETCH_TILES 2
#define X1_PREFETCH_BYTES 4096 /* one input row: how far ahead of the row being read its stream is prefetched */

typedef int32_t v16i __attribute__((vector_size(64)));

/* Byte b of every 32-bit lane, sign-extended, as float32. */
static inline v16f byte_as_float(v16u u, int b) {
    const v16i shifted = (v16i)(u << (24 - 8 * b));
    return __builtin_convertvector(shifted >> 24, v16f);
}

/* Rows r..r+TILE-1 of q against M input rows. xs: [M][kv] x in phases; xt: [M][k] x as given (the columns
 * past kv). sums[i][t]: row r + t against input row i. M is a constant at each call site. */
static inline __attribute__((always_inline)) void tile_int8(const int8_t *q, const float *xs, const float *xt,
                                                            int64_t k, int64_t kv, int64_t r, int M,
                                                            float sums[MAX_XROWS][TILE]) {
    v16f acc[MAX_XROWS][TILE];
    for (int i = 0; i < M; i++)
        for (int t = 0; t < TILE; t++) acc[i][t] = (v16f){0};
    const int8_t *w0 = q + r * k, *ahead = w0 + PREFETCH_TILES * TILE * k;
    for (int64_t j = 0; j < kv; j += LINE) {
        for (int t = 0; t < TILE; t++) __builtin_prefetch(ahead + t * k + j, 0, 1);
        v16u u[TILE];
        for (int t = 0; t < TILE; t++) u[t] = load_v16u(w0 + t * k + j);
        for (int b = 0; b < 4; b++) {
            v16f w[TILE];
            for (int t = 0; t < TILE; t++) w[t] = byte_as_float(u[t], b);
            for (int i = 0; i < M; i++) {
                const v16f xb = load_v16f(xs + i * kv + j + 16 * b);
                for (int t = 0; t < TILE; t++) acc[i][t] += w[t] * xb;
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int t = 0; t < TILE; t++) {
            float s = sum_v16f(acc[i][t]);
            for (int64_t j = kv; j < k; j++) s += (float)w0[t * k + j] * xt[i * k + j];
            sums[i][t] = s;
        }
}

/* One weight row (the tail of a thread's range when it is not a multiple of TILE). */
static float row_int8(const int8_t *w, const float *xs, const float *xt, int64_t k, int64_t kv) {
    v16f acc = {0};
    for (int64_t j = 0; j < kv; j += LINE) {
        const v16u u = load_v16u(w + j);
        for (int b = 0; b < 4; b++) acc += byte_as_float(u, b) * load_v16f(xs + j + 16 * b);
    }
    float s = sum_v16f(acc);
    for (int64_t j = kv; j < k; j++) s += (float)w[j] * xt[j];
    return s;
}

#if defined(__AVX512F__)
/* One weight row against one input row: four sums, one per 16 columns of each 64-byte line (no chain of
 * dependent multiply-adds along the line), the thread's rows read as one stream prefetched X1_PREFETCH_BYTES
 * ahead into L1. */
static inline float row_x1(const int8_t *w, const float *x, int64_t k) {
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    const int64_t lines = k / LINE * LINE, kv = k / 16 * 16;
    for (int64_t j = 0; j < lines; j += LINE) {
        __builtin_prefetch(w + j + X1_PREFETCH_BYTES, 0, 3);
        for (int b = 0; b < 4; b++) acc[b] += widen_i8(w + j + 16 * b) * load_v16f(x + j + 16 * b);
    }
    for (int64_t j = lines; j < kv; j += 16) acc[0] += widen_i8(w + j) * load_v16f(x + j);
    float s = sum_v16f((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (int64_t j = kv; j < k; j++) s += (float)w[j] * x[j];
    return s;
}
#endif

/* Row r's output: its sum times its scale, plus its bias. */
static inline float scaled(float sum, const void *scales, int scales_bf16, const float *bias, int64_t r) {
    return sum * bf16_or_f32_at(scales, scales_bf16, r) + (bias != NULL ? bias[r] : 0.0f);
}

void tgictl_qlinear_int8(const float *x, const int8_t *q, const void *scales, int scales_bf16, const float *bias,
                         float *y, int64_t m, int64_t n, int64_t k, int threads) {
    const int64_t kv = k / LINE * LINE;
    float *xs = malloc(sizeof(float) * (size_t)(m * kv + 16));
    if (xs != NULL) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < kv; c += LINE)
                for (int b = 0; b < 4; b++)
                    for (int l = 0; l < 16; l++) xs[i * kv + c + 16 * b + l] = x[i * k + c + 4 * l + b];
    }
    const int64_t vector_k = xs != NULL ? kv : 0; /* refused scratch: every column on the scalar tail */
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        thread_rows(n, TILE, &lo, &hi);
#if defined(__AVX512F__)
        if (m == 1) /* every row of the range here; the loop below then has none left */
            for (; lo < hi; lo++) y[lo] = scaled(row_x1(q + lo * k, x, k), scales, scales_bf16, bias, lo);
#endif
        for (int64_t i0 = 0; i0 < m; i0 += MAX_XROWS) {
            const int64_t rows = m - i0 < MAX_XROWS ? m - i0 : MAX_XROWS;
            const float *xsi = xs + i0 * vector_k, *xti = x + i0 * k;
            int64_t r = lo;
            for (; r + TILE <= hi; r += TILE) {
                float sums[MAX_XROWS][TILE];
                switch (rows) { /* constant row counts: the accumulators stay in registers */
                case 1: tile_int8(q, xsi, xti, k, vector_k, r, 1, sums); break;
                case 2: tile_int8(q, xsi, xti, k, vector_k, r, 2, sums); break;
                case 3: tile_int8(q, xsi, xti, k, vector_k, r, 3, sums); break;
                default: tile_int8(q, xsi, xti, k, vector_k, r, 4, sums); break;
                }
                for (int64_t i = 0; i < rows; i++)
                    for (int t = 0; t < TILE; t++)
                        y[(i0 + i) * n + r + t] = scaled(sums[i][t], scales, scales_bf16, bias, r + t);
            }
            for (; r < hi; r++)
                for (int64_t i = 0; i < rows; i++)
                    y[(i0 + i) * n + r] = scaled(row_int8(q + r * k, xsi + i * vector_k, xti + i * k, k, vector_k),
                                                 scales, scales_bf16, bias, r);
        }
    }
    free(xs);
}
struct int8_rows {
    const int8_t *q;
    const uint16_t *scales; /* bf16 */
};

#if defined(__AVX512BF16__)
/* int8 rows times their scale, in bf16 (rounded to nearest even), for the many-row products. */
static void decode_int8_strip(const void *source, int64_t row0, int rows, int64_t k, uint16_t *strip, float *scratch) {
    const struct int8_rows *w = source;
    (void)scratch;
    for (int r = 0; r < rows; r++) {
        const int8_t *q = w->q + (row0 + r) * k;
        const __m512 s = _mm512_set1_ps(bf16_to_float(w->scales[row0 + r]));
        for (int64_t j = 0; j < k; j += 32) {
            const __m512 lo = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + j)))));
            const __m512 hi = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + j + 16)))));
            _mm512_storeu_si512(strip + r * k + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}
#endif

/* Rows per call of the AVX512-BF16 product, which takes up to 32. */
#define DPBF16_MAX_ROWS 32

/* Many bf16 rows on strips of int8 rows decoded to bf16 (decoded_linear.h: AMX, else AVX512-BF16 32 rows at a
 * time, the strips decoded again for every 32 rows: a prefill's 110 rows cost 4 decodings of the weights,
 * ~1 ms each for SmolLM2 on 2 Zen 5 cores, where decoding each whole matrix to a bf16 tensor first took ~100 ms);
 * x [m, k] bf16, scales [n] bf16, y [m, n] bf16; k a multiple of 32. A row's result does not depend on the
 * others (dpbf16_linear.c). Returns 0, or -1 where neither takes the call (the caller takes another backend). */
int tgictl_qlinear_int8_bf16(const uint16_t *x, const int8_t *q, const uint16_t *scales, const float *bias,
                             uint16_t *y, int64_t m, int64_t n, int64_t k, int threads) {
#if defined(__AVX512BF16__)
    if (k % 32 != 0) return -1;
    const struct int8_rows rows = {q, scales};
    if (tgictl_amx_decoded_linear(x, NULL, decode_int8_strip, &rows, bias, y, m, n, k, threads) == 0) return 0;
    for (int64_t i0 = 0; i0 < m; i0 += DPBF16_MAX_ROWS) {
        const int64_t part = m - i0 < DPBF16_MAX_ROWS ? m - i0 : DPBF16_MAX_ROWS;
        if (tgictl_dpbf16_decoded_linear(x + i0 * k, NULL, decode_int8_strip, &rows, bias, y + i0 * n, part, n, k,
                                         threads) != 0)
            return -1; /* memory refused: the caller's next backend computes every row again */
    }
    return 0;
#else
    (void)x, (void)q, (void)scales, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)threads;
    return -1;
#endif
}

