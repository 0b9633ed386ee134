/* How the AVX-512 decode attention kernels (decode_attention_bf16.c on bf16 caches, decode_attention_q8.c on int8
 * ones) share the work: a task is one chunk of consecutive positions of one sequence with every head, its result
 * per head {maximum, sum, value sums} (flash decoding); the chunks of a sequence are merged by their maxima and
 * sums in float32 and written once. The split follows the sequence's own length only, never the batch, so a row's
 * result is the same bits in any batch (--batch-invariant needs nothing more here).
 *
 * CHUNK_KEYS: keys per task, unless a sequence would then have more than MAX_CHUNKS (64: 14 ms at batch 32 and
 * 256 cached tokens, 30 layers; 128: 13.3; fewer cold starts per row). MAX_CHUNKS caps the partial results'
 * memory: n * MAX_CHUNKS * heads * (d + 2) floats. */
#ifndef TGICTL_DECODE_TASKS_H
#define TGICTL_DECODE_TASKS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define CHUNK_KEYS 128
#define MAX_CHUNKS 16
#define KEY_BLOCK 16 /* keys a kernel scores together; chunks are multiples of it */

/* Keys per chunk of a sequence of `len` keys: half of it (a multiple of 16) up to CHUNK_KEYS, so a short lone
 * sequence of a one-client decode step is two tasks for two cores (one row at 128 cached tokens, 30 layers,
 * cold: 0.45 -> 0.37 ms, Zen 5; at batch 32 and 64-160 keys ~3% slower, within the host's noise), then
 * CHUNK_KEYS (two halves of 129-256 keys measured the same as 128 + the rest), or more for long ones. */
static inline int64_t chunk_keys(int64_t len) {
    if (len <= CHUNK_KEYS) {
        const int64_t half = ((len + 1) / 2 + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
        return half > KEY_BLOCK ? half : KEY_BLOCK;
    }
    if (len <= CHUNK_KEYS * MAX_CHUNKS) return CHUNK_KEYS;
    const int64_t per = (len + MAX_CHUNKS - 1) / MAX_CHUNKS;
    return (per + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
}

/* One query head's output from a sequence's `chunks` partials (stride heads * (d + 2) floats): bf16 or float32. */
static inline void merge_chunks(const float *partial, int64_t chunks, int64_t heads, int64_t d, void *out,
                                int out_bf16) {
    const int64_t stride = heads * (d + 2);
    float max = partial[0];
    for (int64_t c = 1; c < chunks; c++) max = partial[c * stride] > max ? partial[c * stride] : max;
    float acc[256] = {0}, sum = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
        const float *part = partial + c * stride;
        const float w = expf(part[0] - max);
        sum += w * part[1];
        for (int64_t j = 0; j < d; j++) acc[j] += w * part[2 + j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < d; j++) {
        if (out_bf16)
            ((uint16_t *)out)[j] = float_to_bf16(acc[j] * inv);
        else
            ((float *)out)[j] = acc[j] * inv;
    }
}

/* The chunk computation of a kernel: every head of sequence `seq` over its keys t0 .. t0 + len - 1; writes
 * out [heads][d + 2] = {maximum, sum, value sums in natural order}. scratch: the floats the kernel asked for. */
typedef void (*decode_chunk_fn)(const void *args, int64_t seq, int64_t t0, int64_t len, float *scratch, float *out);

/* Every sequence's chunks as tasks over `threads`, then the merge into out [n, heads, d] (bf16 or float32).
 * d <= 256. Returns 0, or -1 when memory is refused. */
static inline int decode_in_chunks(const int64_t *context_lens, int64_t n, int64_t heads, int64_t d,
                                   int64_t scratch_floats, decode_chunk_fn chunk, const void *args, void *out,
                                   int out_bf16, int threads) {
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1)); /* each sequence's first task */
    if (first == NULL) return -1;
    first[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t keys = chunk_keys(context_lens[i]);
        first[i + 1] = first[i] + (context_lens[i] + keys - 1) / keys;
    }
    const int64_t tasks = first[n], part_floats = heads * (d + 2);
    float *partial = malloc(sizeof(float) * (size_t)(tasks * part_floats + 1));
    if (partial == NULL) {
        free(first);
        return -1;
    }
    const size_t elem = out_bf16 ? sizeof(uint16_t) : sizeof(float);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scratch = malloc(sizeof(float) * (size_t)scratch_floats);
        failed |= scratch == NULL; /* every thread still meets both loops */
        int64_t i = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            while (first[i + 1] <= task) i++; /* a thread's tasks come in increasing order */
            if (scratch == NULL) continue;
            const int64_t keys = chunk_keys(context_lens[i]), t0 = (task - first[i]) * keys;
            const int64_t t1 = t0 + keys < context_lens[i] ? t0 + keys : context_lens[i];
            chunk(args, i, t0, t1 - t0, scratch, partial + task * part_floats);
        }
#pragma omp for schedule(static)
        for (int64_t x = 0; x < n * heads; x++) {
            const int64_t seq = x / heads;
            char *o = (char *)out + (size_t)(x * d) * elem;
            if (first[seq + 1] > first[seq])
                merge_chunks(partial + first[seq] * part_floats + x % heads * (d + 2), first[seq + 1] - first[seq],
                             heads, d, o, out_bf16);
            else
                memset(o, 0, elem * (size_t)d); /* no context: nothing to attend to */
        }
        free(scratch);
    }
    free(partial);
    free(first);
    return failed ? -1 : 0;
}

#endif
