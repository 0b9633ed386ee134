/* Decode attention over a paged bf16 KV cache with the bf16 dot-product instruction (AVX512-BF16: AMD Zen 4
 * and later, Intel Sapphire Rapids and later), head sizes 64 and 128, up to 8 query heads per KV head.
 *
 * Why not paged_decode.c's loop (which stays for other CPUs and shapes): it widened every cached element to
 * float32 before multiplying, summed each key's score across the lanes on its own, and took one (sequence,
 * KV head) per task, reading a third of each cached row (a slot holds every KV head side by side) and giving
 * one sequence three tasks for two cores. On SmolLM2 at batch 32 and 256 cached tokens it took ~20 of the
 * step's ~45 ms on 2 AMD Zen 5 cores, reading the KV cache at ~9 GB/s.
 *
 * Here a task is one chunk of consecutive positions of one sequence with every head (decode_tasks.h: the split, which
 * depends on the sequence's own length only, and the merge). Per block of 16 keys: the scores of every query head, reading each
 * cached row once and whole (all its KV heads), by VDPBF16PS on the stored bf16 values (the query's own
 * bf16 values, the scale applied to the score), summed across lanes for the 16 keys together (a transposing
 * tree instead of 16 horizontal sums); then each head's running maximum and sum (flash decoding); then p v
 * in float32 per KV head, its group's value sums in registers, its rows now in L1/L2. The next block's rows
 * are asked for while this one computes, and each 96 KiB window of the chunk's rows is read once in a tight
 * loop before its blocks are computed (read_ahead).
 *
 * Layouts (paged_decode.c's): query, out [n, heads, d] bf16; caches [num_slots, kv_heads, d] bf16; slots
 * [n, max_len] int64; context_lens [n] int64. Returns 0; -1 when scratch memory is refused; -2 when this
 * build (no AVX512-BF16) or shape (head size, group) is not served here (the caller takes paged_decode.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "decode_tasks.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "exp512.h"
#include "read_ahead.h"

#define MAX_GROUP 8   /* query heads per KV head served here */

/* Lane j of the result: the sum of the 16 lanes of v[j]. Four levels; each adds two vectors' lanes pairwise
 * across two inputs, halving the vectors and doubling the inputs each lane covers. */
static const int32_t LEVEL_INDEX[3][2][16] = {
    {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
    {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
    {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
};

/* Lanes of two vectors (even dims, odd dims) in dimension order: the first 16 dims, then the next 16. */
static const int32_t INTERLEAVE_INDEX[2][16] = {
    {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23},
    {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31},
};

static inline __m512 sum_lanes_16(const __m512 v[KEY_BLOCK]) {
    __m512 x[KEY_BLOCK];
    for (int i = 0; i < KEY_BLOCK; i++) x[i] = v[i];
    for (int level = 0, count = KEY_BLOCK; level < 3; level++, count /= 2) {
        const __m512i lo = _mm512_loadu_si512(LEVEL_INDEX[level][0]), hi = _mm512_loadu_si512(LEVEL_INDEX[level][1]);
        for (int i = 0; i < count / 2; i++)
            x[i] = _mm512_add_ps(_mm512_permutex2var_ps(x[2 * i], lo, x[2 * i + 1]),
                                 _mm512_permutex2var_ps(x[2 * i], hi, x[2 * i + 1]));
    }
    /* x[0]: lanes 0-7 and 8-15 each hold v[0..7]'s two half sums, x[1] the same for v[8..15] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Asks for a cached row's lines (all KV heads) to be brought into L2 ahead of use. */
static inline void prefetch_row(const uint16_t *row, int64_t row_bytes) {
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T1);
}

/* Every query head of a sequence over `len` keys (slots) of a chunk, G query heads per KV head.
 * query: [kv_heads G][d] bf16 as given; scratch: chunk_scratch_floats() floats; out: [heads][d + 2] = {maximum,
 * sum, value sums in natural order}. V: d / 16, the float32 vectors of a row.
 * Per block of 16 keys: scores with the rows read in order, every KV head of a row together (the rows of a
 * block lie side by side, so the reads stream), the next block's rows asked for meanwhile; then each head's
 * softmax step; then p v per KV head, its rows now in L2. */
static inline __attribute__((always_inline)) void chunk_heads(
    const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache, const int64_t *slots, int64_t len,
    int64_t kv_heads, float scale, float softcap, float *scratch, float *out, const int G, const int V) {
    const int P = V / 2; /* 512-bit vectors of 32 bf16 per head's row */
    const int64_t d = 16 * V, heads = kv_heads * G, row_stride = kv_heads * d, row_bytes = row_stride * 2;
    float *dots = scratch;                                  /* [heads][16 keys][16 lanes] */
    float *sums = dots + heads * KEY_BLOCK * 16;            /* [heads][V][16]: value sums, even|odd order */
    float *m = sums + heads * V * 16, *l = m + heads;       /* [heads] each */
    float *p = l + heads;                                   /* [heads][16]: the block's e^(s - m) */
    memset(sums, 0, sizeof(float) * (size_t)(heads * V * 16));
    for (int64_t x = 0; x < heads; x++) {
        m[x] = -INFINITY;
        l[x] = 0.0f;
    }
    for (int64_t t = 0; t < len && t < KEY_BLOCK; t++) {
        prefetch_row(key_cache + slots[t] * row_stride, row_bytes);
        prefetch_row(value_cache + slots[t] * row_stride, row_bytes);
    }
    const int64_t window = read_ahead_keys(row_bytes, KEY_BLOCK);
    for (int64_t t0 = 0; t0 < len; t0 += KEY_BLOCK) {
        if (t0 % window == 0)
            read_ahead(key_cache, value_cache, slots + t0, len - t0 < window ? len - t0 : window, row_bytes);
        const int n = len - t0 < KEY_BLOCK ? (int)(len - t0) : KEY_BLOCK;
        const int next = len - t0 - n < KEY_BLOCK ? (int)(len - t0 - n) : KEY_BLOCK;
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        for (int j = 0; j < KEY_BLOCK; j++) { /* keys past the end read key t0 again; their p is 0 */
            const uint16_t *krow = key_cache + slots[t0 + (j < n ? j : 0)] * row_stride;
            if (j < next) prefetch_row(key_cache + slots[t0 + n + j] * row_stride, row_bytes);
            for (int64_t h = 0; h < kv_heads; h++) {
                __m512bh k[4];
                for (int c = 0; c < P; c++) k[c] = (__m512bh)_mm512_loadu_si512(krow + h * d + 32 * c);
                for (int g = 0; g < G; g++) {
                    const uint16_t *qg = query + (h * G + g) * d;
                    __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(qg), k[0]);
                    for (int c = 1; c < P; c++)
                        dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(qg + 32 * c), k[c]);
                    _mm512_storeu_ps(dots + ((h * G + g) * KEY_BLOCK + j) * 16, dot);
                }
            }
        }
        for (int64_t x = 0; x < heads; x++) {
            __m512 block[KEY_BLOCK];
            for (int j = 0; j < KEY_BLOCK; j++) block[j] = _mm512_loadu_ps(dots + (x * KEY_BLOCK + j) * 16);
            __m512 s = _mm512_mul_ps(sum_lanes_16(block), _mm512_set1_ps(scale));
            if (softcap > 0.0f) {
                float lanes[KEY_BLOCK];
                _mm512_storeu_ps(lanes, s);
                for (int j = 0; j < KEY_BLOCK; j++) lanes[j] = tanhf(lanes[j] / softcap) * softcap;
                s = _mm512_loadu_ps(lanes);
            }
            const float block_max = _mm512_mask_reduce_max_ps(valid, s);
            const float top = block_max > m[x] ? block_max : m[x];
            const float rescale = running_rescale(m[x], top);
            const __m512 probs = _mm512_maskz_mov_ps(valid, exp_nonpositive_v(_mm512_sub_ps(s, _mm512_set1_ps(top))));
            l[x] = l[x] * rescale + _mm512_reduce_add_ps(probs);
            m[x] = top;
            if (rescale != 1.0f)
                for (int c = 0; c < V; c++)
                    _mm512_storeu_ps(sums + (x * V + c) * 16,
                                     _mm512_mul_ps(_mm512_loadu_ps(sums + (x * V + c) * 16), _mm512_set1_ps(rescale)));
            _mm512_storeu_ps(p + x * KEY_BLOCK, probs);
        }
        for (int64_t h = 0; h < kv_heads; h++) {
            __m512 acc[MAX_GROUP][8];
            for (int g = 0; g < G; g++)
                for (int c = 0; c < V; c++) acc[g][c] = _mm512_loadu_ps(sums + ((h * G + g) * V + c) * 16);
            for (int j = 0; j < n; j++) {
                const uint16_t *row = value_cache + slots[t0 + j] * row_stride + h * d;
                if (h == 0 && j < next) prefetch_row(value_cache + slots[t0 + n + j] * row_stride, row_bytes);
                __m512 v[8];
                for (int c = 0; c < P; c++) { /* bf16 pairs widened without a shuffle: even|odd order */
                    const __m512i u = _mm512_loadu_si512(row + 32 * c);
                    v[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
                    v[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
                }
                for (int g = 0; g < G; g++) {
                    const __m512 pj = _mm512_set1_ps(p[(h * G + g) * KEY_BLOCK + j]);
                    for (int c = 0; c < V; c++) acc[g][c] = _mm512_fmadd_ps(pj, v[c], acc[g][c]);
                }
            }
            for (int g = 0; g < G; g++)
                for (int c = 0; c < V; c++) _mm512_storeu_ps(sums + ((h * G + g) * V + c) * 16, acc[g][c]);
        }
    }
    for (int64_t x = 0; x < heads; x++) {
        float *o = out + x * (d + 2);
        o[0] = m[x];
        o[1] = l[x];
        /* even|odd order: per 32 dims, the 16 even ones then the 16 odd ones; interleaved back by two
         * permutes (element by element, the index arithmetic took ~12% of the kernel at batch 32) */
        const float *acc = sums + x * V * 16;
        const __m512i lo = _mm512_loadu_si512(INTERLEAVE_INDEX[0]), hi = _mm512_loadu_si512(INTERLEAVE_INDEX[1]);
        for (int c = 0; c < V / 2; c++) {
            const __m512 even = _mm512_loadu_ps(acc + 32 * c), odd = _mm512_loadu_ps(acc + 32 * c + 16);
            _mm512_storeu_ps(o + 2 + 32 * c, _mm512_permutex2var_ps(even, lo, odd));
            _mm512_storeu_ps(o + 2 + 32 * c + 16, _mm512_permutex2var_ps(even, hi, odd));
        }
    }
}

static int64_t chunk_scratch_floats(int64_t heads, int64_t d) { return heads * (KEY_BLOCK * 16 + d + 2 + KEY_BLOCK); }

#define CHUNK_CASE(G_, V_)                                                                                     \
    case G_:                                                                                                   \
        chunk_heads(query, key_cache, value_cache, slots, len, kv_heads, scale, softcap, scratch, out, G_, V_); \
        break;

/* What every task of one call reads (decode_tasks.h's chunk function gets it as `args`). */
typedef struct {
    const uint16_t *query, *key_cache, *value_cache;
    const int64_t *slots;
    int64_t max_len, heads, kv_heads, d;
    float scale, softcap;
} bf16_call;

/* The group size as a constant (1-8) in every loop bound, so a KV head's value sums stay in registers. */
static void chunk_task(const void *call_args, int64_t seq, int64_t t0, int64_t len, float *scratch, float *out) {
    const bf16_call *a = call_args;
    const uint16_t *query = a->query + seq * a->heads * a->d, *key_cache = a->key_cache, *value_cache = a->value_cache;
    const int64_t *slots = a->slots + seq * a->max_len + t0, kv_heads = a->kv_heads, group = a->heads / a->kv_heads;
    const float scale = a->scale, softcap = a->softcap;
    if (a->d == 64) {
        switch (group) { CHUNK_CASE(1, 4) CHUNK_CASE(2, 4) CHUNK_CASE(3, 4) CHUNK_CASE(4, 4) CHUNK_CASE(5, 4)
                         CHUNK_CASE(6, 4) CHUNK_CASE(7, 4) CHUNK_CASE(8, 4) }
    } else {
        switch (group) { CHUNK_CASE(1, 8) CHUNK_CASE(2, 8) CHUNK_CASE(3, 8) CHUNK_CASE(4, 8) CHUNK_CASE(5, 8)
                         CHUNK_CASE(6, 8) CHUNK_CASE(7, 8) CHUNK_CASE(8, 8) }
    }
}
#endif

int tgictl_decode_attention_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                                 const int64_t *slots, const int64_t *context_lens, int64_t n, int64_t max_len,
                                 int64_t heads, int64_t kv_heads, int64_t d, float scale, float softcap, uint16_t *out,
                                 int threads) {
#if defined(__AVX512BF16__)
    if ((d != 64 && d != 128) || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP) return -2;
    const bf16_call call = {query, key_cache, value_cache, slots, max_len, heads, kv_heads, d, scale, softcap};
    return decode_in_chunks(context_lens, n, heads, d, chunk_scratch_floats(heads, d), chunk_task, &call, out, 1,
                            threads);
#else
    (void)query, (void)key_cache, (void)value_cache, (void)slots, (void)context_lens, (void)n, (void)max_len;
    (void)heads, (void)kv_heads, (void)d, (void)scale, (void)softcap, (void)out, (void)threads;
    return -2;
#endif
}
