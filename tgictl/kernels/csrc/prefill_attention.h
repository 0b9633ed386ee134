/* The arguments the causal prefill attention kernels share (prefill_attention_bf16.c, prefill_attention_amx.c):
 * one signature, and its casts to void in a build that lacks a kernel's instructions. window: a sliding window's
 * positions (query row r sees keys cache_len + r - window + 1 .. cache_len + r; kernels/window.py), 0 for none. */
#ifndef TGICTL_PREFILL_ATTENTION_H
#define TGICTL_PREFILL_ATTENTION_H

#include <stdint.h>

#define PREFILL_ATTENTION_ARGS                                                                                  \
    const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache, const int64_t *slots,        \
        int64_t cache_len, int64_t new_len, int64_t heads, int64_t kv_heads, int64_t d, float scale, int64_t window, \
        uint16_t *out, int threads

#define PREFILL_ATTENTION_UNUSED_ARGS()                                                                         \
    ((void)query, (void)key_cache, (void)value_cache, (void)slots, (void)cache_len, (void)new_len, (void)heads, \
     (void)kv_heads, (void)d, (void)scale, (void)window, (void)out, (void)threads)

#endif
