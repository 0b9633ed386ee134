/* One projection of any format the C loops multiply (kernels/decode_layers.py builds the descriptors): bf16 rows,
 * int4 tiles or int8 rows, by the kernel the Python layers' dispatch takes for that row count, so a loop that calls
 * linear_by_desc() computes what the Python layers compute (csrc/decode_layers.c: a decode step's dense layers;
 * csrc/moe_experts.c: an MoE layer's active experts). Internal to the library: static functions only.
 */
#ifndef TGICTL_LINEAR_DESC_H
#define TGICTL_LINEAR_DESC_H

#include <stdint.h>

#include "bf16.h"

/* The kernels of the other csrc/ files (one library, native.py builds them together). */
int tgictl_small_linear_bf16(const void *x, int x_bf16, const uint16_t *weight, const float *bias, void *y,
                             int y_bf16, int64_t m, int64_t n, int64_t k, int threads);
int tgictl_qlinear_int4(const float *x, const uint8_t *packed, const void *scales_zeros, int sz_form, int64_t group,
                        const float *bias, float *y, int64_t m, int64_t n, int64_t k, int64_t k_pad, int threads);
int tgictl_qlinear_int4_rows_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *scales_zeros,
                                  int sz_form, int64_t group, const float *bias, float *y, int64_t m, int64_t n,
                                  int64_t k, int64_t k_pad, int threads);
int tgictl_amx_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                           int64_t n, int64_t k, int threads);
int tgictl_qlinear_int4_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *scales_zeros, int sz_form,
                             int64_t group, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k_pad,
                             int threads);
int tgictl_fma_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                           int64_t n, int64_t k, int threads);
int tgictl_amx_linear_available(void);
int tgictl_dpbf16_linear_available(void);
int tgictl_dpbf16_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                              int64_t n, int64_t k, int threads);
void tgictl_qlinear_int8(const float *x, const int8_t *q, const void *scales, int scales_bf16, const float *bias,
                         float *y, int64_t m, int64_t n, int64_t k, int threads);
int tgictl_qlinear_int8_bf16(const uint16_t *x, const int8_t *q, const uint16_t *scales, const float *bias,
                             uint16_t *y, int64_t m, int64_t n, int64_t k, int threads);

/* Up to this many rows the matrix-vector kernels (kernels/linear.py's SMALL_LINEAR_MAX_ROWS for bf16); above,
 * the many-row kernels: AMX on bf16 rows, else VDPBF16PS, else FMA (AVX2 builds; kernels/linear.py tries them in
 * the same order), the bf16-tile kernel on int4 (whose input width is then k_pad), decoded strips on int8. */
#define MATRIX_VECTOR_MAX_ROWS 4

/* bf16 rows: kernels/linear.py's matrix_vector_max_rows (VDPBF16PS from 2 rows where the CPU has it and no AMX). */
static inline int64_t bf16_matrix_vector_max_rows(void) {
    return tgictl_dpbf16_linear_available() && !tgictl_amx_linear_available() ? 1 : MATRIX_VECTOR_MAX_ROWS;
}

/* One projection as the C loops multiply it (kernels/decode_layers.py builds these). */
typedef struct {
    const void *weight;       /* bf16 [n, k] rows, the int4 packed tiles, or int8 [n, k] rows */
    const void *scales_zeros; /* int4: bf16 as sz_form says (int4_scales.h); int8: [n] bf16; NULL for bf16 rows */
    int64_t group;            /* int4 group size; 0 for bf16 rows, INT8_ROWS for int8 rows */
    int64_t k_pad;            /* int4: the packed input width; 0 otherwise */
    int64_t sz_form;          /* int4: SZ_BF16, | SZ_ZERO where zeros are stored (not for Q4_0); 0 otherwise */
} linear_desc;

#define INT8_ROWS (-1)

/* y [m, n] bf16 = x [m, k] bf16 times the projection, plus bias [n] float32 (or NULL) added by the kernel, as on
 * the Python path (which hands the same kernel a float32 copy of the bias); y32 (and x32 where the CPU lacks
 * AVX512-BF16): float32 scratch for int4 tiles, whose kernels write float32 (the Python path, linear_methods/native.py's
 * int4_linear, takes the same kernel and converts the same way: y.to(bf16)). */
static inline int linear_by_desc(const linear_desc *w, const uint16_t *x, uint16_t *y, int64_t m, int64_t n,
                                 int64_t k, const float *bias, float *x32, float *y32, int threads) {
    if (w->group == INT8_ROWS) {
        if (m > MATRIX_VECTOR_MAX_ROWS)
            return tgictl_qlinear_int8_bf16(x, w->weight, w->scales_zeros, bias, y, m, n, k, threads);
        /* linear_methods/native.py's int8_linear: float32 rows in, float32 out, rounded to bf16 */
        for (int64_t i = 0; i < m * k; i++) x32[i] = bf16_to_float(x[i]);
        tgictl_qlinear_int8(x32, w->weight, w->scales_zeros, 1, bias, y32, m, n, k, threads);
        for (int64_t i = 0; i < m * n; i++) y[i] = float_to_bf16(y32[i]);
        return 0;
    }
    if (m > (w->group == 0 ? bf16_matrix_vector_max_rows() : MATRIX_VECTOR_MAX_ROWS)) {
        if (w->group == 0) { /* kernels/linear.py's order: each declines where its build or shape does not fit */
            const uint16_t *weight = w->weight;
            if (tgictl_amx_linear_bf16(x, weight, bias, y, m, n, k, threads) == 0) return 0;
            if (tgictl_dpbf16_linear_bf16(x, weight, bias, y, m, n, k, threads) == 0) return 0;
            return tgictl_fma_linear_bf16(x, weight, bias, y, m, n, k, threads);
        }
        return tgictl_qlinear_int4_bf16(x, (const uint8_t *)w->weight, w->scales_zeros, (int)w->sz_form, w->group,
                                        bias, y, m, n, w->k_pad, threads);
    }
    if (w->group == 0) return tgictl_small_linear_bf16(x, 1, (const uint16_t *)w->weight, bias, y, 1, m, n, k, threads);
    if (tgictl_qlinear_int4_rows_bf16(x, (const uint8_t *)w->weight, w->scales_zeros, (int)w->sz_form, w->group,
                                      bias, y32, m, n, k, w->k_pad, threads) != 0) {
        for (int64_t i = 0; i < m * k; i++) x32[i] = bf16_to_float(x[i]);
        if (tgictl_qlinear_int4(x32, (const uint8_t *)w->weight, w->scales_zeros, (int)w->sz_form, w->group, bias,
                                y32, m, n, k, w->k_pad, threads) != 0)
            return -1;
    }
    for (int64_t i = 0; i < m * n; i++) y[i] = float_to_bf16(y32[i]);
    return 0;
}

#endif
