/* A vectorisable e^x for the C kernels (softmax, SiLU, log-sum-exp). */
#ifndef TGICTL_EXP_H
#define TGICTL_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^x for x <= 0 (softmax after subtracting the row maximum), within ~2 ulp of expf. Written out
 * so the loop over a row vectorises: libm's expf is a scalar call per element. */
static inline float exp_nonpositive(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    if (x < -87.0f) x = -87.0f; /* e^-87 ~ 1.6e-38: still a normal float; below that underflows */
    float n = floorf(x * log2e + 0.5f);
    float r = x - n * ln2_hi - n * ln2_lo; /* |r| <= ln2 / 2 */
    float p = 1.0f / 5040.0f;              /* Taylor series of e^r to r^7 */
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

#endif
