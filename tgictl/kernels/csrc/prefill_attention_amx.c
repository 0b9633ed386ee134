/* Causal prefill attention over a paged bf16 KV cache with AMX tiles (Intel Sapphire Rapids and later), head
 * sizes 64 and 128: prefill_attention_bf16.c's contract, its arithmetic on the tile unit.
 *
 * Why: on 2 cores of an AMX Xeon a 1,000-token prompt (SmolLM2: 9 query heads of 64, 3 KV heads) took 8.0 ms
 * per layer in the AVX512-BF16 kernel and 3.4 ms in torch's SDPA (oneDNN's AMX kernels), more than the
 * layer's projections; transformers' time to first token was shorter than ours for that reason alone.
 *
 * First the sequence's keys and values are laid out once per call, per KV head, as TDPBF16PS reads its second
 * operand: keys as [16 dimension pairs][16 keys] per 16 keys and 32 dimensions (a transposed block), values as
 * [16 key pairs][16 dimensions] (two keys' values interleaved) per 32 keys and 16 dimensions, zeros past the
 * context. Then a task is 16 query rows of one query head: per step of 64 keys, the scores of its rows by
 * four 16 x 16 tiles (q k over the head size in pieces of 32), stored; the online softmax per row in AVX-512
 * (running maximum and sum in float32, flash attention), p rounded to bf16 as SDPA's bf16 kernel does before
 * its p v; p v by two tile products per 16 dimensions into a float32 tile, added to the row's rescaled sums.
 * Tasks run from the longest (the last rows see the most keys) to the shortest, dynamically scheduled.
 *
 * Layouts (prefill_attention_bf16.c's): query, out [new_len, heads, d] bf16; caches [num_slots, kv_heads, d]
 * bf16; slots [cache_len + new_len] int64. Query row r sits at position cache_len + r. Returns 0; -1 when
 * scratch memory is refused; -2 where this build or process has no AMX, the shape (head size, heads not a
 * multiple of kv_heads) is not served here, the call has a sliding window, or the context's layout would exceed
 * MAX_LAYOUT_BYTES (the caller takes the AVX512-BF16 kernel).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"
#include "prefill_attention.h"

#if defined(HAVE_AMX)
#include "exp512.h"

#define ROWS 16        /* query rows per task: one tile's rows */
#define STEP 64        /* keys per step: four score tiles of 16 keys, two p tiles of 32 */
#define TILE_WORDS 256 /* 32-bit words in one 16 x 64-byte tile */
/* The laid-out keys and values take 4 d bytes per key and KV head; a call that would need more than this
 * (a long context: 16K keys of 8 KV heads of 128) is left to the AVX512-BF16 kernel, which lays out one block
 * at a time, instead of holding that much scratch per layer. */
#define MAX_LAYOUT_BYTES (64ll << 20)

/* Tiles: 0, 1 (and 6, 7 for head size 128) the task's queries by 32 dimensions; 2 the keys or values; 3 the
 * float32 sums; 4, 5 the step's p for keys 0-31 and 32-63. */
#define QK_TILE(Q, TILE, TILE_BASE) \
    _tile_loadd(2, (TILE_BASE) + (Q) * TILE_WORDS, 64); \
    _tile_dpbf16ps(3, TILE, 2)

/* kt: keys of KV head h as [16-key groups][d / 32][16 pairs][16 keys]; vi: values as [32-key groups][d / 16]
 * [16 key pairs][16 dims], words of two bf16 (lo: the even key or dimension). Keys past `keys` are zeros. */
static void lay_out_keys(const uint16_t *key_cache, const int64_t *slots, int64_t keys, int64_t kv_heads, int64_t h,
                         int64_t d, int64_t group, uint32_t *kt) {
    const int64_t pairs = d / 2;
    memset(kt, 0, sizeof(uint32_t) * (size_t)(pairs * 16));
    for (int j = 0; j < 16; j++) {
        const int64_t t = group * 16 + j;
        if (t >= keys) break;
        const uint32_t *row = (const uint32_t *)(key_cache + (slots[t] * kv_heads + h) * d);
        for (int64_t p = 0; p < pairs; p++) kt[(p / 16) * TILE_WORDS + (p % 16) * 16 + j] = row[p];
    }
}

static void lay_out_values(const uint16_t *value_cache, const int64_t *slots, int64_t keys, int64_t kv_heads,
                           int64_t h, int64_t d, int64_t group, uint32_t *vi) {
    memset(vi, 0, sizeof(uint32_t) * (size_t)(d * 16));
    for (int q = 0; q < 32; q++) {
        const int64_t t = group * 32 + q;
        if (t >= keys) break;
        const uint16_t *row = value_cache + (slots[t] * kv_heads + h) * d;
        uint16_t *half = (uint16_t *)vi + (q & 1); /* even key: the low half of its pair's word */
        for (int64_t n = 0; n < d; n++) half[2 * ((n / 16) * TILE_WORDS + (q / 2) * 16 + n % 16)] = row[n];
    }
}

/* The softmax step of one row: scores s[0..63] (unscaled) of keys k0.., those after `limit` invisible; m, l the
 * row's running maximum and sum. Writes the row's p in bf16 and returns the factor its sums so far take. */
static inline float softmax_row(const float *s, int64_t k0, int64_t limit, float scale, float *m, float *l,
                                uint16_t *p) {
    __m512 v[4];
    __mmask16 visible[4];
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < 4; c++) {
        const int64_t first = k0 + 16 * c, count = limit - first + 1;
        visible[c] = count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1u);
        v[c] = _mm512_mul_ps(_mm512_loadu_ps(s + c * TILE_WORDS), _mm512_set1_ps(scale));
        top = _mm512_mask_max_ps(top, visible[c], top, v[c]);
    }
    const float block_max = _mm512_reduce_max_ps(top);
    const float new_max = block_max > *m ? block_max : *m;
    if (new_max == -INFINITY) { /* nothing visible yet (a padding row): p = 0 */
        memset(p, 0, sizeof(uint16_t) * STEP);
        return 1.0f;
    }
    const float rescale = running_rescale(*m, new_max);
    float sum = 0.0f;
    __m512 probs[4];
    for (int c = 0; c < 4; c++) {
        probs[c] = _mm512_maskz_mov_ps(visible[c], exp_nonpositive_v(_mm512_sub_ps(v[c], _mm512_set1_ps(new_max))));
        sum += _mm512_reduce_add_ps(probs[c]);
    }
    *l = *l * rescale + sum;
    *m = new_max;
    _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(probs[1], probs[0]));
    _mm512_storeu_si512(p + 32, (__m512i)_mm512_cvtne2ps_pbh(probs[3], probs[2]));
    return rescale;
}

/* Per-thread scratch, 64-byte aligned pieces (floats): queries [16][d] bf16, scores [4 tiles], p [16][64] bf16,
 * p v [d / 16 tiles], sums [16][d], then m, l, rescale [16] each. */
static size_t task_scratch_floats(int64_t d) {
    return (size_t)(8 * d + 4 * TILE_WORDS + 512 + d * 16 + 16 * d + 3 * 16);
}

/* Query rows [r0, r0 + rows) of query head x (KV head h). */
static inline __attribute__((always_inline)) void query_task(
    const uint16_t *query, const uint32_t *kt, const uint32_t *vi, int64_t cache_len, int64_t r0, int64_t rows,
    int64_t x, int64_t heads, float scale, float *scratch, uint16_t *out, const int64_t d) {
    const int64_t chunks = d / 32, tiles = d / 16;
    uint16_t *q = (uint16_t *)scratch;             /* [16][d] */
    float *scores = scratch + 8 * d;               /* [4][16][16] */
    uint16_t *p = (uint16_t *)(scores + 4 * TILE_WORDS); /* [16][64] */
    float *pv = scores + 4 * TILE_WORDS + 512;     /* [d / 16][16][16] */
    float *sums = pv + d * 16;                     /* [16][d] */
    float *m = sums + 16 * d, *l = m + 16, *rescale = l + 16;
    memset(q, 0, sizeof(uint16_t) * (size_t)(16 * d));
    for (int64_t i = 0; i < rows; i++) memcpy(q + i * d, query + ((r0 + i) * heads + x) * d, sizeof(uint16_t) * d);
    memset(sums, 0, sizeof(float) * (size_t)(16 * d));
    for (int i = 0; i < ROWS; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    _tile_loadd(0, q, 2 * d);
    _tile_loadd(1, q + 32, 2 * d);
    if (d == 128) {
        _tile_loadd(6, q + 64, 2 * d);
        _tile_loadd(7, q + 96, 2 * d);
    }
    const int64_t last = cache_len + r0 + rows - 1; /* the last row's position: the last key any row sees */
    for (int64_t k0 = 0; k0 <= last; k0 += STEP) {
        for (int c = 0; c < 4; c++) {
            const uint32_t *keys = kt + (k0 / 16 + c) * chunks * TILE_WORDS;
            _tile_zero(3);
            QK_TILE(0, 0, keys);
            QK_TILE(1, 1, keys);
            if (d == 128) {
                QK_TILE(2, 6, keys);
                QK_TILE(3, 7, keys);
            }
            _tile_stored(3, scores + c * TILE_WORDS, 64);
        }
        for (int i = 0; i < ROWS; i++)
            rescale[i] = softmax_row(scores + i * 16, k0, cache_len + r0 + i, scale, m + i, l + i, p + i * STEP);
        _tile_loadd(4, p, 2 * STEP);
        _tile_loadd(5, p + 32, 2 * STEP);
        const uint32_t *values = vi + (k0 / 32) * tiles * TILE_WORDS;
        for (int64_t t = 0; t < tiles; t++) {
            _tile_zero(3);
            _tile_loadd(2, values + t * TILE_WORDS, 64);
            _tile_dpbf16ps(3, 4, 2);
            _tile_loadd(2, values + (tiles + t) * TILE_WORDS, 64);
            _tile_dpbf16ps(3, 5, 2);
            _tile_stored(3, pv + t * TILE_WORDS, 64);
        }
        for (int i = 0; i < ROWS; i++) {
            const __m512 factor = _mm512_set1_ps(rescale[i]);
            for (int64_t t = 0; t < tiles; t++) {
                float *acc = sums + i * d + 16 * t;
                _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_loadu_ps(acc), factor,
                                                      _mm512_loadu_ps(pv + t * TILE_WORDS + i * 16)));
            }
        }
    }
    for (int64_t i = 0; i < rows; i++) {
        const float inv = 1.0f / l[i];
        uint16_t *o = out + ((r0 + i) * heads + x) * d;
        for (int64_t n = 0; n < d; n++) o[n] = float_to_bf16(sums[i * d + n] * inv);
    }
}
#endif

int tgictl_prefill_attention_amx(PREFILL_ATTENTION_ARGS) {
#if defined(HAVE_AMX)
    /* A sliding window goes to the AVX512-BF16 kernel: this one's per-call layout assumes every key is read. */
    if ((d != 64 && d != 128) || heads % kv_heads != 0 || window > 0 || !amx_ready()) return -2;
    const int64_t keys = cache_len + new_len, steps = (keys + STEP - 1) / STEP;
    const int64_t key_groups = steps * (STEP / 16), value_groups = steps * (STEP / 32);
    const int64_t per_head = steps * STEP * d / 2; /* 32-bit words of one KV head's keys (the values' too) */
    if (2 * kv_heads * per_head * (int64_t)sizeof(uint32_t) > MAX_LAYOUT_BYTES) return -2;
    uint32_t *kt = aligned_alloc(64, sizeof(uint32_t) * (size_t)(2 * kv_heads * per_head));
    if (kt == NULL) return -1;
    uint32_t *vi = kt + kv_heads * per_head;
    const int64_t blocks = (new_len + ROWS - 1) / ROWS, tasks = blocks * heads, group = heads / kv_heads;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t w = 0; w < kv_heads * key_groups; w++)
            lay_out_keys(key_cache, slots, keys, kv_heads, w / key_groups, d, w % key_groups,
                         kt + (w / key_groups) * per_head + (w % key_groups) * 16 * d / 2);
#pragma omp for schedule(static)
        for (int64_t w = 0; w < kv_heads * value_groups; w++)
            lay_out_values(value_cache, slots, keys, kv_heads, w / value_groups, d, w % value_groups,
                           vi + (w / value_groups) * per_head + (w % value_groups) * 32 * d / 2);
        float *scratch = aligned_alloc(64, sizeof(float) * ((task_scratch_floats(d) + 15) / 16 * 16));
        failed |= scratch == NULL; /* every thread still meets the loop */
        if (scratch != NULL) {
            const int rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
            amx_configure(rows);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (scratch == NULL) continue;
            const int64_t block = blocks - 1 - task / heads, x = task % heads, r0 = block * ROWS;
            const int64_t rows = new_len - r0 < ROWS ? new_len - r0 : ROWS, h = x / group;
            const uint32_t *k = kt + h * per_head, *v = vi + h * per_head;
            if (d == 64)
                query_task(query, k, v, cache_len, r0, rows, x, heads, scale, scratch, out, 64);
            else
                query_task(query, k, v, cache_len, r0, rows, x, heads, scale, scratch, out, 128);
        }
        if (scratch != NULL) _tile_release();
        free(scratch);
    }
    free(kt);
    return failed ? -1 : 0;
#else
    PREFILL_ATTENTION_UNUSED_ARGS();
    return -2;
#endif
}
