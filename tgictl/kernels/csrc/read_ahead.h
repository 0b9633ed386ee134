/* Reading a window of K and V rows ahead of the arithmetic, for the AVX-512 decode attention kernels
 * (decode_attention_bf16.c, decode_attention_q8.c). Include after <immintrin.h>, inside their AVX-512 sections.
 *
 * Why: a kernel's block loop, with its own loads and one-block-ahead prefetches, kept only a few lines in flight
 * (a few keys' arithmetic fills the reorder window), so its reads of the cache and its arithmetic took turns: at
 * batch 32 and 256 cached tokens (SmolLM2, 2 Zen 5 cores) 12-15 ms for 30 layers, where the arithmetic alone on
 * cache-resident rows takes 4-5 ms and a bare read of the same rows in the same order 5-6 ms. Reading each window
 * first, in a loop of independent loads: 7.2-9.2 ms. */
#ifndef TGICTL_READ_AHEAD_H
#define TGICTL_READ_AHEAD_H

#include <stdint.h>

#define READ_AHEAD_BYTES (96 << 10) /* K and V bytes read ahead of the arithmetic */

/* Reads every 64-byte line of the K and V rows (row_bytes each, a multiple of 64) of `count` keys once; the
 * values read are not used. */
static inline void read_ahead(const void *key_cache, const void *value_cache, const int64_t *slots, int64_t count,
                              int64_t row_bytes) {
    const char *keys = key_cache, *values = value_cache;
    __m512i seen = _mm512_setzero_si512();
    for (int64_t t = 0; t < count; t++) {
        const char *k = keys + slots[t] * row_bytes, *v = values + slots[t] * row_bytes;
        for (int64_t c = 0; c < row_bytes; c += 64)
            seen = _mm512_or_si512(seen, _mm512_or_si512(_mm512_loadu_si512(k + c), _mm512_loadu_si512(v + c)));
    }
    __asm__ volatile("" : : "v"(seen)); /* keeps the loads */
}

/* Keys per read_ahead window: READ_AHEAD_BYTES of K and V together (whole key blocks of `block` keys, at least
 * one), so the window stays in L2 while the block loop works through it. */
static inline int64_t read_ahead_keys(int64_t row_bytes, int64_t block) {
    const int64_t keys = READ_AHEAD_BYTES / (2 * row_bytes) / block * block;
    return keys > block ? keys : block;
}

#endif
