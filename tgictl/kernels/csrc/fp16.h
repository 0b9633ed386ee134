/* float16 -> float32 for the quantized kernels (GGUF block scales are float16). Exact either way: the
 * F16C instruction where the compiler targets it, else the bit-level conversion. */
#ifndef TGICTL_FP16_H
#define TGICTL_FP16_H

#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
static inline float fp16_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float fp16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1Fu) {
        bits = sign | 0x7F800000u | (mantissa << 13); /* inf, NaN */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign; /* signed zero */
    } else { /* subnormal: normalise */
        exponent = 113u;
        while ((mantissa & 0x400u) == 0) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#endif

static inline float load_fp16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return fp16_to_float(h);
}

#endif
