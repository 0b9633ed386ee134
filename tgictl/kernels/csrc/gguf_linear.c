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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"

#define ROWS_PER_CHUNK 16
#define QK 32
#define QK_K 256

typedef void (*decode_row_fn)(const uint8_t *src, float *dst, int64_t k);

static void decode_q4_0(const uint8_t *src, float *dst, int64_t k) {
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

/* Returns 0, -1 for an unknown type, -2 when scratch memory is refused (the caller falls back to torch). */
int tgictl_qlinear_gguf(int type, const float *x, const uint8_t *w, int64_t row_bytes, const float *bias, float *y,
                        int64_t m, int64_t n, int64_t k, int threads) {
    if (type < 0 || type >= NUM_TYPES) return -1;
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
