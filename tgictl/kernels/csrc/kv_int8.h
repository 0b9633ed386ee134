/* The int8 KV cache's row rule (kernels/kv_pages.py, docs/kv-cache.md), for the kernels that write it: one row x
 * (one token, one KV head, d values) becomes
 *     s = bf16(amax|x| / 127)            round to nearest even
 *     q = clamp(rint(x / s), -127, 127)  float32 division, ties to even; q = 0 where s is 0 (or NaN)
 * the same operations as quantize_int8's torch ops, so both write the same bytes. */
#ifndef TGICTL_KV_INT8_H
#define TGICTL_KV_INT8_H

#include <math.h>
#include <stdint.h>

#include "bf16.h"

/* x: d float32 values (already rounded to the model's dtype); q: d int8; *scale: the bf16 scale. */
static inline void quantize_row_int8(const float *x, int64_t d, int8_t *q, uint16_t *scale) {
    float amax = 0.0f;
    int nan = 0;
    for (int64_t j = 0; j < d; j++) {
        const float a = fabsf(x[j]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    const uint16_t s16 = float_to_bf16(nan ? NAN : amax / 127.0f);
    const float s = bf16_to_float(s16);
    for (int64_t j = 0; j < d; j++) {
        float v = s > 0.0f ? nearbyintf(x[j] / s) : 0.0f;
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[j] = (int8_t)v;
    }
    *scale = s16;
}

#endif
