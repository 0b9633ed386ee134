/* bfloat16 <-> float32 for the C kernels: bf16 is the top half of a float32, held as uint16. */
#ifndef TGICTL_BF16_H
#define TGICTL_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (f != f) return (uint16_t)((bits >> 16) | 0x40); /* NaN stays a (quiet) NaN */
    bits += 0x7FFFu + ((bits >> 16) & 1u);              /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

static inline float load_f32(float x) { return x; }

/* Element `index` of an array that holds bf16 (uint16) or float32 values, as float32: the kernels that take
 * either for their inputs or scales. */
static inline float bf16_or_f32_at(const void *p, int is_bf16, int64_t index) {
    return is_bf16 ? bf16_to_float(((const uint16_t *)p)[index]) : ((const float *)p)[index];
}

#endif
