/* The many-row bf16 products that quantized formats share (gguf_linear.c, quant_linear.c): a format passes a
 * decoder that fills strip [rows][k] bf16 with its weight rows row0 .. row0 + rows (rows <= 32) of `source`
 * (the format's tensors); scratch: k floats of the calling thread's own. The weights stay quantized in memory,
 * each strip decoded once per call into a buffer of the thread's. With `decode` NULL, `weight` is read as
 * stored ([n, k] bf16).
 * AMX (amx_linear.c): any m, k a multiple of 32. AVX512-BF16 (dpbf16_linear.c): 1-32 rows, k a multiple of 4.
 * Each returns 0, or -1 where it cannot take the call (the caller tries the next). */
#ifndef TGICTL_DECODED_LINEAR_H
#define TGICTL_DECODED_LINEAR_H

#include <stdint.h>

typedef void (*tgictl_strip_decoder)(const void *source, int64_t row0, int rows, int64_t k, uint16_t *strip,
                                     float *scratch);
int tgictl_amx_decoded_linear(const uint16_t *x, const uint16_t *weight, tgictl_strip_decoder decode,
                              const void *source, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k,
                              int threads);
int tgictl_dpbf16_decoded_linear(const uint16_t *x, const uint16_t *weight, tgictl_strip_decoder decode,
                                 const void *source, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k,
                                 int threads);

#endif
