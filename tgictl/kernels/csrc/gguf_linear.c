/* y = x W^T + b with W held in GGUF blocks (tgictl/kernels/linear_methods/gguf_types.py has the layouts), on
 * the CPU, straight from the blocks.
 *
 * Each output row is decoded once per call into a float32 row in the thread's scratch (it stays in L1:
 * a few KB), then dotted with every input row: the decode is paid once per weight however many rows the
 * batch has, and the dot products are plain vectorisable loops. The decoded values are the reference
 * dequantization (gguf_types.py, llama.cpp's dequantize_row_*) up to fused multiply-adds; the sums differ
 * from the reference matmul by the order of float additions only.
 *
 * Layouts: x [m, k] float32; w [n, row_bytes] uint8 (n rows of k / block_size blocks); bias [n] float32
 * or NULL; y [m, n] float32. `type` is the block type's number below (gguf_types.py BlockType.native_id).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "amx.h"
#include "avx2.h"
#include "fp16.h"
#include "int8_widen.h"
#include "vec16.h"

#define ROWS_PER_CHUNK 16
#define QK 32
#define QK_K 256

typedef void (*decode_row_fn)(const uint8_t *src, float *dst, int64_t k);

/* The decoders round as gguf_types.py's reference does, operation by operation (each product and sum rounded
 * on its own, in its order), so a decoded row is the reference's bit for bit: the build's fused multiply-adds
 * and reassociation are off here. An embedding lookup reads its rows through them. */
#if defined(__clang__)
#define EXACT_FLOAT_ORDER _Pragma("clang fp contract(off)") _Pragma("clang fp reassociate(off)")
#else
#define EXACT_FLOAT_ORDER
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off", "no-associative-math")
#endif

static void decode_q4_0(const uint8_t *src, float *dst, int64_t k) {
    EXACT_FLOAT_ORDER
    for (int64_t b = 0; b < k / QK; b++, src += 18, dst += QK) {
        const float d = load_fp16(src);
        const uint8_t *qs = src + 2;
        for (int j = 0; j < QK / 2; j++) {
            dst[j] = d * (float)((int)(qs[j] & 15) - 8);
            dst[j + QK / 2] = d * (float)((int)(qs[j] >> 4) - 8);
        }
    }
}

static void decode_q4_1(const uint8_t *src, float *dst, int64_t k) {
    EXACT_FLOAT_ORDER
    for (int64_t b = 0; b < k / QK; b++, src += 20, dst += QK) {
        const float d = load_fp16(src), m = load_fp16(src + 2);
        const uint8_t *qs = src + 4;
        for (int j = 0; j < QK / 2; j++) {
            dst[j] = d * (float)(qs[j] & 15) + m;
            dst[j + QK / 2] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

static void decode_q8_0(const uint8_t *src, float *dst, int64_t k) {
    EXACT_FLOAT_ORDER
    for (int64_t b = 0; b < k / QK; b++, src += 34, dst += QK) {
        const float d = load_fp16(src);
        const int8_t *qs = (const int8_t *)(src + 2);
        for (int j = 0; j < QK; j++) dst[j] = (float)qs[j] * d;
    }
}

/* Q4_K's 6-bit scale and min of sub-block j from its 12 scale bytes (llama.cpp's get_scale_min_k4). */
static inline void q4_k_scale_min(int j, const uint8_t *q, float *scale, float *min) {
    if (j < 4) {
        *scale = (float)(q[j] & 63);
        *min = (float)(q[j + 4] & 63);
    } else {
        *scale = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *min = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void decode_q4_k(const uint8_t *src, float *dst, int64_t k) {
    EXACT_FLOAT_ORDER
    for (int64_t b = 0; b < k / QK_K; b++, src += 144, dst += QK_K) {
        const float d = load_fp16(src), dmin = load_fp16(src + 2);
        const uint8_t *scales = src + 4, *qs = src + 16;
        for (int c = 0; c < 4; c++) { /* 64 weights: low nibbles sub-block 2c, high nibbles 2c + 1 */
            float sc_lo, m_lo, sc_hi, m_hi;
            q4_k_scale_min(2 * c, scales, &sc_lo, &m_lo);
            q4_k_scale_min(2 * c + 1, scales, &sc_hi, &m_hi);
            const float d_lo = d * sc_lo, o_lo = dmin * m_lo, d_hi = d * sc_hi, o_hi = dmin * m_hi;
            const uint8_t *q = qs + 32 * c;
            float *out = dst + 64 * c;
            for (int l = 0; l < 32; l++) {
                out[l] = d_lo * (float)(q[l] & 15) - o_lo;
                out[l + 32] = d_hi * (float)(q[l] >> 4) - o_hi;
            }
        }
    }
}

static void decode_q6_k(const uint8_t *src, float *dst, int64_t k) {
    EXACT_FLOAT_ORDER
    for (int64_t b = 0; b < k / QK_K; b++, src += 210, dst += QK_K) {
        const uint8_t *ql = src, *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        const float d = load_fp16(src + 208);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8) {
            float *out = dst + 128 * half;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * (float)sc[is] * (float)q1;
                out[l + 32] = d * (float)sc[is + 2] * (float)q2;
                out[l + 64] = d * (float)sc[is + 4] * (float)q3;
                out[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

#if !defined(__clang__)
#pragma GCC pop_options
#endif

static const decode_row_fn DECODERS[] = {decode_q4_0, decode_q4_1, decode_q8_0, decode_q4_k, decode_q6_k};
#define NUM_TYPES ((int)(sizeof DECODERS / sizeof DECODERS[0]))

/* Dequantize rows [0, n) into out [n, k] float32: the embedding lookup and tests use it. */
int tgictl_gguf_dequantize(int type, const uint8_t *w, int64_t row_bytes, float *out, int64_t n, int64_t k,
                           int threads) {
    if (type < 0 || type >= NUM_TYPES) return -1;
    const decode_row_fn decode = DECODERS[type];
#pragma omp parallel for num_threads(threads) schedule(static, ROWS_PER_CHUNK)
    for (int64_t row = 0; row < n; row++) decode(w + row * row_bytes, out + row * k, k);
    return 0;
}

/* Q8_0 straight from its blocks, without the float32 row: per block, 32 int8 weights widen to float32 in
 * registers, their products with each input row are summed as a vector, and the block's scale multiplies
 * that vector into the row's sums (no horizontal sum per block). Each thread streams one contiguous range
 * of rows and prefetches 4 KiB ahead. The LM head of the default GGUF (49152 x 576 Q8_0, 30 MB): 4.6 GB/s
 * through the float32 row, 15+ GB/s here (Sapphire Rapids, 2 threads); at one input row, with caches cold as
 * after a decode step's layers, 43-44 GB/s prefetching two rows (1.2 KB) ahead, 46-47 GB/s 4 KiB ahead in
 * groups of 4 weight rows (Zen 5, 2 threads; 8 KiB ahead the same). Products and sums are float32, in
 * another order than the reference matmul's, so results differ from it by float rounding only. */
#define Q8_0_BYTES 34
#define Q8_XROWS 4 /* input rows per pass over the weights */
#define Q8_PREFETCH_BYTES 4096

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* AVX2: the 16-float vectors above live in two registers each and went through memory on every widening (the
 * LM head at one row: 3.6 GB/s on Zen 3); here a block is four 8-float vectors, its products with an input row
 * summed in one register, scaled into the row's sums. */
static inline __attribute__((always_inline)) void q8_0_row(const uint8_t *w, const float *x, int64_t k, int M,
                                                            float out[Q8_XROWS]) {
    __m256 acc[Q8_XROWS];
    for (int i = 0; i < M; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / QK; b++) {
        const uint8_t *block = w + b * Q8_0_BYTES;
        __builtin_prefetch(block + Q8_PREFETCH_BYTES, 0, 1);
        __m256 q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(block + 2 + 8 * j))));
        const __m256 d = _mm256_set1_ps(load_fp16(block));
        for (int i = 0; i < M; i++) {
            const float *xb = x + i * k + b * QK;
            __m256 s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
            for (int j = 1; j < 4; j++) s = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(xb + 8 * j), s);
            acc[i] = _mm256_fmadd_ps(d, s, acc[i]);
        }
    }
    for (int i = 0; i < M; i++) out[i] = sum8(acc[i]);
}
#else
static inline __attribute__((always_inline)) void q8_0_row(const uint8_t *w, const float *x, int64_t k, int M,
                                                            float out[Q8_XROWS]) {
    v16f acc[Q8_XROWS];
    for (int i = 0; i < M; i++) acc[i] = (v16f){0};
    for (int64_t b = 0; b < k / QK; b++) {
        const uint8_t *block = w + b * Q8_0_BYTES;
        __builtin_prefetch(block + Q8_PREFETCH_BYTES, 0, 1);
        const v16f lo = widen_i8((const int8_t *)block + 2), hi = widen_i8((const int8_t *)block + 18);
        const float d = load_fp16(block);
        for (int i = 0; i < M; i++)
            acc[i] += d * (lo * load_v16f(x + i * k + b * QK) + hi * load_v16f(x + i * k + b * QK + 16));
    }
    for (int i = 0; i < M; i++) out[i] = sum_v16f(acc[i]);
}
#endif

#define Q8_WROWS 4 /* weight rows per pass at one input row */

/* One input row against Q8_WROWS consecutive weight rows: four independent sums in flight instead of one chain
 * per row, the input's two vectors loaded once per block for all four, and one prefetch stream over the group
 * (its rows are contiguous). Each row's products and sums are q8_0_row's, in its order (on the default GGUF's
 * LM head the same floats as one row at a time; the build may reassociate either). */
static inline __attribute__((always_inline)) void q8_0_rows_x1(const uint8_t *w, int64_t row_bytes, const float *x,
                                                                int64_t k, float out[Q8_WROWS]) {
    v16f acc[Q8_WROWS];
    for (int r = 0; r < Q8_WROWS; r++) acc[r] = (v16f){0};
    const uint8_t *ahead = w + Q8_PREFETCH_BYTES;
    const int64_t step = (Q8_WROWS * row_bytes + k / QK - 1) / (k / QK);  /* bytes of the group per block */
    for (int64_t b = 0; b < k / QK; b++) {
        __builtin_prefetch(ahead + b * step, 0, 1);
        __builtin_prefetch(ahead + b * step + 64, 0, 1);
        const v16f x_lo = load_v16f(x + b * QK), x_hi = load_v16f(x + b * QK + 16);
        for (int r = 0; r < Q8_WROWS; r++) {
            const uint8_t *block = w + r * row_bytes + b * Q8_0_BYTES;
            const v16f lo = widen_i8((const int8_t *)block + 2), hi = widen_i8((const int8_t *)block + 18);
            acc[r] += load_fp16(block) * (lo * x_lo + hi * x_hi);
        }
    }
    for (int r = 0; r < Q8_WROWS; r++) out[r] = sum_v16f(acc[r]);
}

static void qlinear_q8_0(const float *x, const uint8_t *w, int64_t row_bytes, const float *bias, float *y, int64_t m,
                         int64_t n, int64_t k, int threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
        const int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
        for (int64_t i0 = 0; i0 < m; i0 += Q8_XROWS) {
            const int64_t rows = m - i0 < Q8_XROWS ? m - i0 : Q8_XROWS;
            int64_t row = lo;
#if !(defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__))
            if (rows == 1) /* one token's decode step: groups of weight rows (the rest below, one by one) */
                for (; row + Q8_WROWS <= hi; row += Q8_WROWS) {
                    float out[Q8_WROWS];
                    q8_0_rows_x1(w + row * row_bytes, row_bytes, x + i0 * k, k, out);
                    for (int r = 0; r < Q8_WROWS; r++) y[i0 * n + row + r] = out[r] + (bias != NULL ? bias[row + r] : 0.0f);
                }
#endif
            for (; row < hi; row++) {
                float out[Q8_XROWS];
                const uint8_t *wr = w + row * row_bytes;
                switch (rows) { /* constant row counts: the sums stay in registers */
                case 1: q8_0_row(wr, x + i0 * k, k, 1, out); break;
                case 2: q8_0_row(wr, x + i0 * k, k, 2, out); break;
                case 3: q8_0_row(wr, x + i0 * k, k, 3, out); break;
                default: q8_0_row(wr, x + i0 * k, k, 4, out); break;
                }
                const float b = bias != NULL ? bias[row] : 0.0f;
                for (int64_t i = 0; i < rows; i++) y[(i0 + i) * n + row] = out[i] + b;
            }
        }
    }
}

/* Returns 0, -1 for an unknown type, -2 when scratch memory is refused (the caller falls back to torch). */
int tgictl_qlinear_gguf(int type, const float *x, const uint8_t *w, int64_t row_bytes, const float *bias, float *y,
                        int64_t m, int64_t n, int64_t k, int threads) {
    if (type < 0 || type >= NUM_TYPES) return -1;
    if (DECODERS[type] == decode_q8_0) {
        qlinear_q8_0(x, w, row_bytes, bias, y, m, n, k, threads);
        return 0;
    }
    const decode_row_fn decode = DECODERS[type];
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *row_values = aligned_alloc(64, ((sizeof(float) * (size_t)k + 63) / 64) * 64);
        if (row_values == NULL) failed = 1;
#pragma omp for schedule(static, ROWS_PER_CHUNK)
        for (int64_t row = 0; row < n; row++) {
            if (row_values == NULL) continue;
            decode(w + row * row_bytes, row_values, k);
            const float b = bias != NULL ? bias[row] : 0.0f;
            for (int64_t i = 0; i < m; i++) {
                const float *xi = x + i * k;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t j = 0; j < k; j++) dot += row_values[j] * xi[j];
                y[i * n + row] = dot + b;
            }
        }
        free(row_values);
    }
    return failed ? -2 : 0;
}

#if defined(__AVX512BF16__)
void tgictl_q6_k_decode_row_bf16(const uint8_t *src, uint16_t *dst, int64_t k); /* gguf_q6_k_rows.c */

/* One weight row as bf16 for the many-row products (decoded_linear.h): Q8_0 by vectors (32 int8 -> two
 * float32 vectors times the block scale -> 32 bf16), Q6_K by its vector decoder (gguf_q6_k_rows.c), the other
 * types through their float32 decoder and a vector rounding. Rounded to nearest even, as torch's bf16
 * conversion. */
static void decode_row_bf16(int type, const uint8_t *src, float *row_f32, uint16_t *dst, int64_t k) {
    if (DECODERS[type] == decode_q8_0) {
        for (int64_t b = 0; b < k / QK; b++, src += Q8_0_BYTES) {
            const __m512 d = _mm512_set1_ps(load_fp16(src));
            const __m512 lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 2)))));
            const __m512 hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 18)))));
            _mm512_storeu_si512(dst + b * QK, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        return;
    }
    if (DECODERS[type] == decode_q6_k) {
        tgictl_q6_k_decode_row_bf16(src, dst, k);
        return;
    }
    DECODERS[type](src, row_f32, k);
    for (int64_t j = 0; j < k; j += 32)
        _mm512_storeu_si512(dst + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row_f32 + j + 16), _mm512_loadu_ps(row_f32 + j)));
}
#endif

struct gguf_rows {
    int type;
    const uint8_t *w;
    int64_t row_bytes;
};

#if defined(__AVX512BF16__)
static void decode_gguf_strip(const void *source, int64_t row0, int rows, int64_t k, uint16_t *strip, float *scratch) {
    const struct gguf_rows *g = source;
    for (int r = 0; r < rows; r++) decode_row_bf16(g->type, g->w + (row0 + r) * g->row_bytes, scratch, strip + r * k, k);
}
#endif

/* Many bf16 rows (prefill, decode batches) by the many-row products (decoded_linear.h): AMX (any row count),
 * else AVX512-BF16 (1-32 rows); Q6_K's 1-4 rows by its own kernel (gguf_q6_k_rows.c). Each strip of weight
 * rows is decoded once per call into bf16 (the thread's buffer, in L2): the weights stay in their blocks in memory. x [m, k] bf16, y [m, n] bf16, bias [n] float32
 * or NULL; k a multiple of 32. Returns 0, or -1 where neither takes the call, the type is unknown or scratch
 * is refused. */
int tgictl_qlinear_q6_k_rows_bf16(const uint16_t *x, const uint8_t *w, int64_t row_bytes, const float *bias,
                                  uint16_t *y, int64_t m, int64_t n, int64_t k, int threads); /* gguf_q6_k_rows.c */

int tgictl_qlinear_gguf_bf16(int type, const uint16_t *x, const uint8_t *w, int64_t row_bytes, const float *bias,
                             uint16_t *y, int64_t m, int64_t n, int64_t k, int threads) {
#if defined(__AVX512BF16__)
    if (type < 0 || type >= NUM_TYPES || k % QK != 0) return -1;
    /* Q6_K at 1-4 rows: straight from the blocks, without the bf16 strip (gguf_q6_k_rows.c) */
    if (DECODERS[type] == decode_q6_k && tgictl_qlinear_q6_k_rows_bf16(x, w, row_bytes, bias, y, m, n, k, threads) == 0)
        return 0;
    const struct gguf_rows rows = {type, w, row_bytes};
    if (tgictl_amx_decoded_linear(x, NULL, decode_gguf_strip, &rows, bias, y, m, n, k, threads) == 0) return 0;
    return tgictl_dpbf16_decoded_linear(x, NULL, decode_gguf_strip, &rows, bias, y, m, n, k, threads);
#else
    (void)type, (void)x, (void)w, (void)row_bytes, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)threads;
    return -1;
#endif
}
