/* A decode step's decoder layers in one call: 1-4 rows, bf16, one rank, dense weights, no biases.
 *
 * At batch 1 the Python around each layer's eight compiled calls (tensor allocation, checks, ctypes
 * argument conversion) cost about as much as the attention and the norms together. This runs the
 * same calls, with the same arguments and in the same order, as models/llama.py's DecoderLayer does
 * on that path (input norm with the previous MLP output added, fused q|k|v projection, rotary and
 * the KV store, paged decode attention, o projection, post-attention norm with the residual, gate|up
 * projection, silu * up, down projection), so its results are those of the Python layers bit for bit;
 * kernels/decode_layers.py decides when it may run.
 *
 * weights: per layer, in this order: input norm [H], qkv [(heads + 2 kv_heads) d, H], o [H, heads d],
 *          post-attention norm [H], gate_up [2 I, H], down [H, I];
 * caches:  per layer, the key then the value cache [num_slots, kv_heads, d];
 * hidden:  [m, H] the residual stream before the first of the layers, overwritten with it after the
 *          last; delta: [m, H] the MLP output still to be added (read when has_delta), overwritten
 *          with the last layer's MLP output;
 * scratch: decode_layers_scratch() bf16 values.
 * Returns 0; -1 when a slot lies outside the cache (nothing written); -2 when scratch memory was
 * refused inside a kernel (the step fails: the KV of the layers before is written).
 */
#include <stdint.h>
#include <string.h>

void tgictl_rmsnorm_bf16(const uint16_t *x, const uint16_t *delta, uint16_t *sum_out, const uint16_t *weight,
                         uint16_t *out, int64_t rows, int64_t dim, float eps, int threads);
void tgictl_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter, int threads);
int tgictl_rotary_store_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                             uint16_t *q_out, uint16_t *key_cache, uint16_t *value_cache, int64_t tokens,
                             int64_t heads, int64_t kv_heads, int64_t d, int64_t num_slots, int threads);
int tgictl_paged_decode_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                             const int64_t *slots, const int64_t *context_lens, int64_t n, int64_t max_len,
                             int64_t heads, int64_t kv_heads, int64_t d, float scale, float softcap, uint16_t *out,
                             int threads);
int tgictl_small_linear_bf16(const void *x, int x_bf16, const uint16_t *weight, const float *bias, void *y,
                             int y_bf16, int64_t m, int64_t n, int64_t k, int threads);

enum { IN_NORM, QKV, O_PROJ, POST_NORM, GATE_UP, DOWN, WEIGHTS_PER_LAYER };

int64_t tgictl_decode_layers_scratch(int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t d,
                                     int64_t inter) {
    return m * (3 * hidden + (heads + 2 * kv_heads) * d + 2 * heads * d + 3 * inter);
}

static inline int linear(const uint16_t *x, const void *weight, uint16_t *y, int64_t m, int64_t n, int64_t k,
                         int threads) {
    return tgictl_small_linear_bf16(x, 1, (const uint16_t *)weight, NULL, y, 1, m, n, k, threads);
}

int tgictl_decode_layers_bf16(int64_t layers, const void *const *weights, void *const *caches, uint16_t *hidden,
                              uint16_t *delta, int has_delta, const uint16_t *cos, const uint16_t *sin,
                              const int64_t *slots, const int64_t *attention_slots, const int64_t *context_lens,
                              int64_t max_len, int64_t m, int64_t hidden_size, int64_t heads, int64_t kv_heads,
                              int64_t d, int64_t inter, int64_t num_slots, float eps, float scale, uint16_t *scratch,
                              int threads) {
    const int64_t H = hidden_size, qkv_width = (heads + 2 * kv_heads) * d;
    uint16_t *other = scratch, *normed = other + m * H, *attended = normed + m * H, *qkv = attended + m * H;
    uint16_t *q = qkv + m * qkv_width, *attention = q + m * heads * d, *gate_up = attention + m * heads * d;
    uint16_t *activated = gate_up + m * 2 * inter;
    uint16_t *residual = hidden;  /* where the residual stream is now: hidden or other */
    for (int64_t layer = 0; layer < layers; layer++) {
        const void *const *w = weights + layer * WEIGHTS_PER_LAYER;
        uint16_t *key_cache = caches[2 * layer], *value_cache = caches[2 * layer + 1];
        uint16_t *next = residual == hidden ? other : hidden;
        if (layer == 0 && !has_delta) {
            tgictl_rmsnorm_bf16(residual, NULL, NULL, w[IN_NORM], normed, m, H, eps, threads);
        } else {
            tgictl_rmsnorm_bf16(residual, delta, next, w[IN_NORM], normed, m, H, eps, threads);
            residual = next;
            next = residual == hidden ? other : hidden;
        }
        if (linear(normed, w[QKV], qkv, m, qkv_width, H, threads) != 0) return -2;
        if (tgictl_rotary_store_bf16(qkv, cos, sin, slots, q, key_cache, value_cache, m, heads, kv_heads, d,
                                     num_slots, threads) != 0)
            return -1;  /* the slots are every layer's: only the first can refuse them */
        if (tgictl_paged_decode_bf16(q, key_cache, value_cache, attention_slots, context_lens, m, max_len, heads,
                                     kv_heads, d, scale, 0.0f, attention, threads) != 0)
            return -2;
        if (linear(attention, w[O_PROJ], attended, m, H, heads * d, threads) != 0) return -2;
        tgictl_rmsnorm_bf16(residual, attended, next, w[POST_NORM], normed, m, H, eps, threads);
        residual = next;
        if (linear(normed, w[GATE_UP], gate_up, m, 2 * inter, H, threads) != 0) return -2;
        tgictl_silu_mul_bf16(gate_up, activated, m, inter, threads);
        if (linear(activated, w[DOWN], delta, m, H, inter, threads) != 0) return -2;
    }
    if (residual != hidden) memcpy(hidden, residual, sizeof(uint16_t) * (size_t)(m * H));
    return 0;
}
